"""Synthetic fleets and observations for the planner's decision (router/planner/decide.py)."""

from kvroute.router.planner.decide import EngineView, Observation, PlannerConfig

CFG = PlannerConfig(prefill_tokens_per_s=10_000, decode_tokens_per_s=2_000, hold=2, cooldown_s=10,
                    colocate_below=0.3, slo_ttft_s=1.0, slo_tpot_s=0.05)


def fleet(*roles, running=0):
    return [EngineView(f"e{i}", role, running=running) for i, role in enumerate(roles)]


def obs(now, engines, prefill=0.0, output=0.0, ttft=None, tpot=None, requests=100):
    return Observation(now, engines, requests, prefill, output, ttft, tpot)


def settle(planner, make_obs, start=0.0, steps=6, interval=5.0):
    """Run intervals, applying each plan's changes; returns the final roles and the plans."""
    engines, plans = make_obs(start).engines, []
    for k in range(steps):
        plan = planner.decide(make_obs(start + k * interval, engines))
        engines = [EngineView(e.id, plan.changes.get(e.id, e.role), e.running) for e in engines]
        plans.append(plan)
    return sorted(e.role for e in engines), plans
