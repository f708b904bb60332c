"""The planner (router/planner/decide.py) on the virtual clock: every `interval_s` it sees
what `kvroute planner` sees through a router (the recent window of finished requests, the
fleet's roles and load) and its role changes apply at once, as POST /admin/role does.

`tick` re-arms itself while requests remain to be served; `plans` keeps every decision
(virtual time, changes, target, reason) for the report.
"""

from __future__ import annotations

import numpy as np

from loadgen.sim.cluster import CALL, Cluster
from router.planner.decide import EngineView, Observation, Plan, Planner, PlannerConfig
from router.planner.demand import estimate


class SimPlanning:
    def __init__(self, cluster: Cluster, router, config: PlannerConfig, total_requests: int) -> None:
        self.cluster, self.router, self.config = cluster, router, config
        self.planner = Planner(config)
        self.total = total_requests
        self.plans: list[Plan] = []
        self.role_changes = 0
        self._start = 0  # first record inside the window
        router.track_arrivals = True
        cluster.push(config.interval_s, CALL, self.tick)

    def tick(self) -> None:
        plan = self.planner.decide(self.observe())
        for inst in self.cluster.instances:
            role = plan.changes.get(inst.id)
            if role is not None:
                inst.role = role
                self.role_changes += 1
                self.cluster.kick(inst)
        self.plans.append(plan)
        if self.router.flights or len(self.router.records) < self.total:
            self.cluster.push(self.cluster.now + self.config.interval_s, CALL, self.tick)

    def observe(self) -> Observation:
        now, window = self.cluster.now, self.config.window_s
        records = self.router.records  # appended as requests end: in end-time order
        while self._start < len(records) and _end(records[self._start]) < now - window:
            self._start += 1
        recent = records[self._start:]
        ok = [r for r in recent if r.status == 200]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
        engines = [EngineView(inst.id, inst.role, len(inst.scheduler.running), len(inst.scheduler.waiting))
                   for inst in self.cluster.instances]
        arrivals = self.router.arrivals
        while arrivals and arrivals[0][0] < now - window:
            arrivals.popleft()
        asked = self.router.max_tokens_of
        demand = estimate(((p, m) for _, p, m in arrivals),
                          ((r.prompt_tokens, r.cached_tokens or 0, r.output_tokens or 0, asked[r.index]) for r in ok),
                          window)
        return Observation(
            now, engines, len(recent) + len(arrivals), demand.prefill_tokens_per_s, demand.output_tokens_per_s,
            ttft_p90_s=float(np.percentile(ttfts, 90)) if ttfts else None,
            tpot_p90_s=float(np.percentile(tpots, 90)) if tpots else None,
            mean_context_tokens=demand.mean_context_tokens, mean_prompt_tokens=demand.mean_prompt_tokens,
            mean_output_tokens=demand.mean_output_tokens)

    def stats(self) -> dict:
        return {"role_changes": self.role_changes,
                "decisions": [p.to_dict() for p in self.plans if p.changes]}


def _end(record) -> float:
    return record.send_s + (record.e2e_s or 0.0)
