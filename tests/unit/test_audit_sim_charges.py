"""Every charge the simulator makes is released on every path: finish, failure, preemption, hand-off.

Issue 36's audit planted a simulator that left a failed request's queued prefill on its
instance and the suite passed. The simulated router charges an instance +1 in flight and the
request's predicted uncached tokens when it dispatches (loadgen/sim/router.py, as the proxy
does); the tokens leave at the first token (or the end, if none came), the request at its end
or, disaggregated, at its hand-off to a decode instance (which is charged in its turn). The
engines hold blocks, waiting and running sequences, host slots and, for a pull, held blocks.

Each scenario below drives one path hard (refusals of a full queue, prompts too long, a pool so
small that sequences are preempted and dropped, a store lookup before the queue, a host tier,
prefill/decode hand-offs, admission refusals, follow-up turns); after every change of an
instance the router's charges must equal what its requests in flight account for, and when the
run ends every charge and every engine resource must be back to zero.
"""

import random

import pytest

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.runner import SimConfig, build
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.contract import settings_values


def specs(n: int, prompt: int = 64, max_tokens: int = 8, shared: int = 32, seed: int = 0, long_every: int = 0,
          turns: int = 1, think_s: float = 0.01) -> list[RequestSpec]:
    """`n` prompts (their first `shared` tokens common to a quarter of them), every `long_every`-th too
    long for the model, and `turns` - 1 follow-ups of each first turn."""
    rng = random.Random(seed)
    heads = [tuple(rng.randrange(5, 8000) for _ in range(shared)) for _ in range(4)]
    out: list[RequestSpec] = []
    for i in range(n):
        size = 5000 if long_every and i % long_every == long_every - 1 else prompt
        tokens = heads[i % 4] + tuple(rng.randrange(5, 8000) for _ in range(size))
        out.append(RequestSpec(index=len(out), prompt_ids=tokens, max_tokens=max_tokens, group=f"t{i % 2}:g"))
        for _ in range(1, turns):
            tokens = tokens + tuple(rng.randrange(5, 8000) for _ in range(16))
            out.append(RequestSpec(index=len(out), prompt_ids=tokens, max_tokens=max_tokens, group=f"t{i % 2}:g",
                                   after=len(out) - 1, think_s=think_s))
    return out


SCENARIOS = {
    "full queues and prompts too long": (dict(instances=2, max_waiting=2, max_running=2),
                                         dict(n=120, long_every=10), 3000.0),
    "preempted and dropped in a small pool": (dict(instances=2, num_blocks=24, block_size=16, max_running=8),
                                              dict(n=60, prompt=100, max_tokens=300), 400.0),
    "follow-up turns under load": (dict(instances=3, max_waiting=4), dict(n=40, turns=3), 800.0),
    "a store lookup before the queue": (dict(instances=2, max_waiting=2, max_running=2, kv_store="redis://sim",
                                             num_blocks=64), dict(n=80, turns=2), 3000.0),
    "a host tier behind a small pool": (dict(instances=2, num_blocks=32, host_blocks=16, max_running=4),
                                        dict(n=60, prompt=200, shared=300, turns=2, think_s=0.5), 50.0),
    "prefill and decode instances": (dict(instances=3, prefill_instances=1, pd_min_uncached=16, max_waiting=4,
                                          kv_link="loopback"), dict(n=80, turns=2), 1500.0),
    "prefill and decode in a small pool": (dict(instances=3, prefill_instances=1, pd_min_uncached=16,
                                                num_blocks=32, max_running=4), dict(n=50, prompt=150), 400.0),
    "admission refusals": (dict(instances=2, admission_slo_s=0.05, admission_tenants=(("t0", 0, 1.0),
                                                                                     ("t1", 1, 2.0))),
                           dict(n=150), 3000.0),
}


def charges_match_flights(router) -> None:
    view = router.view
    inflight, queued = [0] * len(view.ids), [0] * len(view.ids)
    for flight in router.flights.values():
        inflight[flight.instance] += 1
        if not flight.first:
            queued[flight.instance] += flight.uncached
    assert view.inflight == inflight, "requests in flight charged but not accounted for"
    assert view.queued == queued, "queued prefill charged but not accounted for"


def nothing_held(inst) -> None:
    sched, bm = inst.scheduler, inst.block_manager
    assert not sched.waiting and not sched.running and not inst.remote, inst.id
    assert inst.num_held == 0, f"{inst.id} still counts {inst.num_held} held sequences"
    assert bm.num_free == bm.num_blocks, f"{inst.id} holds {bm.num_used} blocks"
    assert all(b is None or b.ref_count == 0 for b in bm.blocks)
    if bm.tiers is not None:
        assert not bm.has_pending_loads
        host = bm.tiers.host
        if host is not None:  # every slot free, an entry's, or reserved for a copy ahead of eviction
            staged = len(bm.tiers.prestager.staged)
            assert len(host.free) + len(host.entries) + staged == host.num_slots, f"{inst.id} lost host slots"


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("policy", ["kv_aware", "round_robin"])
def test_every_charge_is_released_on_every_path(scenario, policy):
    overrides, workload, rate = SCENARIOS[scenario]
    config = settings_values.replace(SimConfig(seed=1, poll_interval_s=0.02), **overrides)
    requests = specs(**workload)
    setup = build(config, policy, requests, ArrivalConfig(rate=rate))
    router, cluster = setup.router, setup.cluster
    checks = 0

    def check(_inst) -> None:
        nonlocal checks
        checks += 1
        charges_match_flights(router)

    cluster.step_listeners.append(check)
    cluster.run(router, iter(setup.starts))
    assert checks > 10
    assert sorted(r.index for r in router.records) == list(range(len(requests)))  # every request ended once
    assert not router.flights
    assert router.view.inflight == [0] * config.instances and router.view.queued == [0] * config.instances
    for inst in cluster.instances:
        nothing_held(inst)


def test_the_scenarios_reach_the_paths_they_are_named_for():
    """So that a scenario cannot quietly stop exercising its path."""
    reached = {}
    for scenario, (overrides, workload, rate) in SCENARIOS.items():
        config = settings_values.replace(SimConfig(seed=1, poll_interval_s=0.02), **overrides)
        setup = build(config, "kv_aware", specs(**workload), ArrivalConfig(rate=rate))
        setup.cluster.run(setup.router, iter(setup.starts))
        statuses = {r.status for r in setup.router.records}
        errors = " ".join(r.error or "" for r in setup.router.records)
        reached[scenario] = (statuses, errors, setup)
    assert {400, 429} <= reached["full queues and prompts too long"][0]
    small = reached["preempted and dropped in a small pool"][2]
    assert sum(i.scheduler.num_preemptions for i in small.cluster.instances) > 0
    assert "dropped" in reached["preempted and dropped in a small pool"][1]
    assert 429 in reached["a store lookup before the queue"][0]
    host = reached["a host tier behind a small pool"][2]
    assert sum(i.io.bytes["h2d"] for i in host.cluster.instances) > 0
    assert reached["prefill and decode instances"][2].router.disagg.num_transfers > 0
    assert {429, 503} & reached["admission refusals"][0]
