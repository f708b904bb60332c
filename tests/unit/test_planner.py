"""The planner's decision function on synthetic load (router/planner/decide.py)."""

import pytest

from kvroute.router.planner.decide import EngineView, Planner, PlannerConfig, assign
from tests.support.planner_fleet import CFG, fleet, obs, settle
from tests.support.router_cluster import FAST
from tests.support.waiting import wait_for


def test_prompt_heavy_load_gets_more_prefill_engines():
    planner = Planner(CFG)
    # 48k uncached prompt tokens/s (4.8 engines' worth) and 2.4k output tokens/s (1.2): 6P:2D of 8
    roles, plans = settle(planner, lambda now, e=None: obs(now, e or fleet(*["both"] * 8), 48_000, 2_400))
    assert roles.count("prefill") == 6 and roles.count("decode") == 2
    assert "6P:2D" in plans[1].reason and not plans[0].changes  # held one interval first
    assert plans[-1].desired == {"prefill": 6, "decode": 2}


def test_the_shift_to_decode_heavy_flips_the_split():
    planner = Planner(CFG)
    def heavy(now, e=None):
        return obs(now, e or fleet(*["prefill"] * 6, *["decode"] * 2), 4_000, 11_000)

    roles, _ = settle(planner, heavy, steps=4)
    assert roles.count("decode") == 7 and roles.count("prefill") == 1


def test_light_load_runs_colocated():
    planner = Planner(CFG)
    roles, plans = settle(planner, lambda now, e=None: obs(now, e or fleet("prefill", "decode", "decode"), 1_000, 200))
    assert roles == ["both", "both", "both"] and "colocated" in plans[-1].reason


def test_hysteresis_and_cooldown_keep_it_from_flapping():
    planner = Planner(CFG)
    engines = fleet(*["both"] * 4)
    first = planner.decide(obs(0, engines, 30_000, 1_000))
    assert not first.changes and "pending" in first.reason
    flip = planner.decide(obs(5, engines, 1_000, 6_000))  # a different target: the count restarts
    assert not flip.changes
    second = planner.decide(obs(10, engines, 1_000, 6_000))
    assert second.changes
    engines = [EngineView(e.id, second.changes.get(e.id, e.role)) for e in engines]
    assert sorted(e.role for e in engines) == ["decode", "decode", "decode", "prefill"]
    for now in (11, 12, 13):  # the mix moves again, within what 1P:3D handles: held, cooling down
        assert not planner.decide(obs(now, engines, 9_000, 1_500)).changes
    assert planner.decide(obs(21, engines, 9_000, 1_500)).changes  # held long enough, cooled down


def test_an_overloaded_split_switches_at_once():
    planner = Planner(CFG)
    engines = fleet("prefill", "decode", "decode", "decode")
    plan = planner.decide(obs(0, engines, 30_000, 1_000))  # 3 engines' worth of prefill on 1: overloaded
    assert plan.changes and plan.target["prefill"] == 3


def test_slo_feedback_moves_an_engine_the_capacities_missed():
    planner = Planner(CFG)
    engines = fleet("prefill", "prefill", "decode", "decode")
    # capacities say 2P:2D, but TTFT misses its SLO while TPOT has room: one more prefill engine
    roles, plans = settle(planner, lambda now, e=None: obs(now, e or engines, 20_000, 4_000, ttft=2.5, tpot=0.01),
                          steps=8)
    assert roles.count("prefill") == 3 and "bias +" in plans[-1].reason


def test_no_traffic_or_draining_engines_change_nothing():
    planner = Planner(CFG)
    assert not planner.decide(obs(0, fleet("both", "both"), requests=0)).changes
    drained = [EngineView("e0", "both", draining=True), EngineView("e1", "both")]
    assert "fewer than 2" in planner.decide(obs(0, drained, 50_000, 100)).reason


def test_assign_moves_the_fewest_and_least_loaded():
    engines = [EngineView("a", "decode", running=9), EngineView("b", "decode", running=1),
               EngineView("c", "prefill"), EngineView("d", "decode", running=4)]
    assert assign(engines, {"prefill": 2, "decode": 2, "both": 0}) == {"b": "prefill"}
    assert assign(engines, {"prefill": 1, "decode": 3, "both": 0}) == {}


@pytest.mark.parametrize("bad", [{"slo_ttft_s": 0}, {"hold": 0}, {"target_utilization": 1.5},
                                 {"decode_tokens_per_s": -1}])
def test_bad_planner_config_is_refused(bad):
    with pytest.raises(ValueError):
        PlannerConfig(**bad)


async def test_planner_service_switches_a_routers_engines(start_engine, start_router, http):
    import aiohttp

    from kvroute.router.planner.service import PlannerService
    from kvroute.router.service.app import CLUSTER

    engines = [await start_engine(time_scale=FAST, instance_id=f"p{i}", admin_key="k") for i in range(3)]
    url, server = await start_router([e[0] for e in engines], admin_key="k")
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    for g in range(6):  # long prompts, short outputs: prompt-heavy
        async with http.post(url + "/v1/completions", headers={"Authorization": "Bearer k"},
                             json={"prompt": [5 + g] * 1500, "max_tokens": 2}) as r:
            assert r.status == 200
    config = PlannerConfig(prefill_tokens_per_s=50, decode_tokens_per_s=50, hold=1, cooldown_s=0,
                           colocate_below=0.0, window_s=60)
    service = PlannerService(config, url, "k")
    async with aiohttp.ClientSession() as session:
        service.session = session
        plan = await service.step()
    assert plan.changes and plan.target == {"prefill": 2, "decode": 1, "both": 0}, plan
    roles = sorted(i.info.role for i in server.app[CLUSTER].instances)
    assert roles == ["decode", "prefill", "prefill"]
    for e_url, _ in engines:
        async with http.get(e_url + "/kv/info") as r:
            assert (await r.json())["role"] in ("prefill", "decode")
    async with aiohttp.ClientSession() as session:  # without the admin key the router refuses
        service = PlannerService(config, url, None)
        service.session = session
        with pytest.raises(ValueError):
            await service.step()
