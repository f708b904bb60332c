"""The planner (router/planner/decide.py) on the virtual clock: every `interval_s` it sees
what `kvroute planner` sees through a router -- the same window of recent requests
(router/planner/recent.py `RecentWindow`, fed by the simulated router as requests are
routed and end), summarised and turned into an `Observation` by the same code, with the
fleet's roles and load -- and its role changes apply at once, as POST /admin/role does.

`tick` re-arms itself while requests remain to be served; `plans` keeps every decision
(virtual time, changes, target, reason) for the report.
"""

from __future__ import annotations

from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.sim.cluster import CALL, Cluster
from kvroute.router.planner.decide import EngineView, Observation, Plan, Planner, PlannerConfig
from kvroute.router.planner.recent import Finished, RecentWindow, observation

MODEL = "sim"  # the one model a simulated fleet serves


class SimWindow:
    """The router's recent-requests window, on the virtual clock (the `RecentRequests` of router/service)."""

    def __init__(self, cluster: Cluster) -> None:
        self.window = RecentWindow(clock=lambda: cluster.now)

    def arrived(self, prompt_tokens: int, max_tokens: int) -> None:
        self.window.arrived(MODEL, prompt_tokens, max_tokens)

    def finished(self, record: RequestRecord, max_tokens: int) -> None:
        self.window.add(Finished(at=self.window.clock(), model=MODEL, ok=record.status == 200, ttft=record.ttft_s,
                                 tpot=record.tpot_s, prompt_tokens=record.prompt_tokens,
                                 output_tokens=record.output_tokens or 0, cached_tokens=record.cached_tokens or 0,
                                 max_tokens=max_tokens))


class SimPlanning:
    def __init__(self, cluster: Cluster, router, config: PlannerConfig, total_requests: int) -> None:
        if router.window is None or router.disagg is None:
            raise ValueError("the simulated planner needs a router with a recent window and disaggregation")
        self.cluster, self.router, self.config = cluster, router, config
        self.planner = Planner(config)
        self.total = total_requests
        self.plans: list[Plan] = []
        self.role_changes = 0
        cluster.push(config.interval_s, CALL, self.tick)

    def tick(self) -> None:
        plan = self.planner.decide(self.observe())
        for inst in self.cluster.instances:
            role = plan.changes.get(inst.id)
            if role is not None:
                self.router.disagg.set_role(inst, role)
                self.role_changes += 1
                self.cluster.kick(inst)
        self.plans.append(plan)
        if self.router.flights or len(self.router.records) < self.total:
            self.cluster.push(self.cluster.now + self.config.interval_s, CALL, self.tick)

    def observe(self) -> Observation:
        summary = self.router.window.window.stats(self.config.window_s, self.config.slo_ttft_s,
                                                  self.config.slo_tpot_s)["models"]["*"]
        engines = [EngineView(inst.id, inst.role, len(inst.scheduler.running), len(inst.scheduler.waiting))
                   for inst in self.cluster.instances]
        return observation(summary, engines, self.cluster.now)

    def stats(self) -> dict:
        return {"role_changes": self.role_changes,
                "decisions": [p.to_dict() for p in self.plans if p.changes]}
