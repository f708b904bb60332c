"""The planner's colocation hysteresis (router/planner/decide.py `colocate_margin`): a colocated fleet
meeting its SLOs stays colocated up to colocate_below + colocate_margin, a split fleet goes back to
colocated only below colocate_below, so a fleet near the threshold does not flap between the two."""

from kvroute.router.planner.decide import Planner, PlannerConfig
from tests.support.planner_fleet import CFG, fleet, obs, settle

MET = dict(ttft=0.2, tpot=0.02)  # within CFG's 1 s / 50 ms SLOs


def load(util, roles, **slo):
    """4 engines at `util`: 60% of it prefill (10k tokens/s per engine), 40% decode (2k per engine)."""
    prefill, output = 4 * util * 0.6 * 10_000, 4 * util * 0.4 * 2_000
    return lambda now, e=None: obs(now, e or fleet(*roles), prefill, output, **slo)


def test_colocated_fleet_meeting_its_slos_stays_colocated_within_the_margin():
    assert (CFG.colocate_below, CFG.colocate_margin) == (0.3, 0.2)
    for util in (0.35, 0.45):
        roles, plans = settle(Planner(CFG), load(util, ["both"] * 4, **MET))
        assert roles == ["both"] * 4 and not any(p.changes for p in plans)
        assert "colocated" in plans[-1].reason and "< 0.5" in plans[-1].reason


def test_colocated_fleet_splits_past_the_margin():
    roles, _ = settle(Planner(CFG), load(0.55, ["both"] * 4, **MET))
    assert "both" not in roles and "prefill" in roles and "decode" in roles


def test_colocated_fleet_missing_its_slos_gets_no_margin():
    roles, _ = settle(Planner(CFG), load(0.4, ["both"] * 4, ttft=0.2, tpot=0.08))
    assert "both" not in roles


def test_split_fleet_returns_to_colocated_only_below_colocate_below():
    split = ["prefill", "prefill", "decode", "decode"]
    roles, plans = settle(Planner(CFG), load(0.4, split, **MET))
    assert roles == sorted(split) and not any(p.changes for p in plans)
    roles, _ = settle(Planner(CFG), load(0.25, split, **MET))
    assert roles == ["both"] * 4


def test_a_fleet_near_the_threshold_does_not_flap():
    planner, engines, changes = Planner(CFG), fleet(*["both"] * 4), 0
    for k in range(20):  # util wanders 0.25 .. 0.45 around colocate_below
        util = (0.25, 0.35, 0.45, 0.35)[k % 4]
        plan = planner.decide(load(util, [])(k * 5.0, engines))
        changes += bool(plan.changes)
        engines = [type(e)(e.id, plan.changes.get(e.id, e.role), e.running) for e in engines]
    assert changes == 0 and {e.role for e in engines} == {"both"}


def test_no_margin_means_the_threshold_alone():
    config = PlannerConfig(**{**{f: getattr(CFG, f) for f in CFG.__dataclass_fields__}, "colocate_margin": 0.0})
    roles, _ = settle(Planner(config), load(0.35, ["both"] * 4, **MET))
    assert "both" not in roles
