"""Run one policy over a workload on a simulated cluster: `simulate(config, policy, specs, arrival)`.

Arrivals follow loadgen's rules (loadgen/runner.py): open loop at a rate through
`loadgen.arrivals.arrival_times` (same seed, same send times as `kvroute loadgen`),
or the workload's own send times (trace replay); a multi-turn follow-up is sent
`think_s` after the request it follows ended. Every request ends as a record:
completed, or failed with its error (nothing is lost).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import random
import time
from array import array
from collections.abc import Iterator, Sequence

import numpy as np

from kvroute.loadgen.arrivals import ArrivalConfig, arrival_times
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.sim.cluster import Cluster
from kvroute.loadgen.sim.config import SimConfig
from kvroute.loadgen.sim.disagg import DisaggConfig
from kvroute.loadgen.sim.oracle import make_oracle
from kvroute.loadgen.sim.oracle_future import make_future_oracle
from kvroute.loadgen.sim.oracle_popularity import make_popularity_oracle
from kvroute.loadgen.sim.planning import SimPlanning
from kvroute.loadgen.sim.replicas import Replicas, build_replicas
from kvroute.loadgen.sim.router import SimRouter
from kvroute.loadgen.sim.tiers import tier_stats
from kvroute.loadgen.summary import summarize
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.decision.base import Policy
from kvroute.router.decision.policies import POLICIES, make_policy, policy_params
from kvroute.router.planner.decide import PlannerConfig

# Simulator-only policies: factories taking the cluster, rng, clock, the workload's specs and the
# planned (send time, spec) of every request that is not a follow-up.
SIM_POLICIES = {"oracle": make_oracle, "oracle_future": make_future_oracle, "oracle_popularity": make_popularity_oracle}


def policy_names() -> list[str]:
    return [*POLICIES, *SIM_POLICIES]


def build_policy(name: str, cluster: Cluster, seed: int, specs: Sequence[RequestSpec] = (),
                 starts: Sequence[tuple[float, RequestSpec]] = (), args: tuple[tuple[str, object], ...] = ()) -> Policy:
    """Policy `name` with those of `args` it takes (ValueError if it takes none of them)."""
    rng = random.Random(seed)
    clock = lambda: cluster.now  # noqa: E731
    if name in SIM_POLICIES:
        return SIM_POLICIES[name](cluster, rng=rng, clock=clock, specs=specs, starts=starts)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}")
    accepted = set(policy_params(name))
    params = {k: v for k, v in args if k in accepted}
    if args and not params:
        raise ValueError(f"policy {name!r} takes none of --policy-arg {', '.join(k for k, _ in args)}")
    return make_policy(name, rng=rng, clock=clock, **params)


def arrivals(specs: list[RequestSpec], arrival: ArrivalConfig, seed: int) -> Iterator[tuple[float, RequestSpec]]:
    """(send time, spec) of every request that is not a follow-up, in time order."""
    starts = [s for s in specs if s.after is None]
    if arrival.mode == "open":
        assert arrival.rate is not None  # an open loop has its rate
        times = arrival_times(arrival.rate, arrival.burstiness, len(starts), seed)
        return zip(times, starts)
    if arrival.mode == "fixed":
        if any(s.arrival_s is None for s in starts):
            raise ValueError("this workload has no send times of its own; give --rate")
        return iter(sorted(((s.arrival_s, s) for s in starts if s.arrival_s is not None),  # all, checked above
                           key=lambda p: (p[0], p[1].index)))
    raise ValueError("the simulator runs open loop (--rate) or the workload's send times, not --concurrency")


@dataclasses.dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    decision_s: array
    num_candidates: int
    index_entries: int
    index_peak: int
    wall_s: float
    virtual_s: float
    steps: int
    preemptions: int
    kv_events: int
    disagg: dict | None = None  # Disagg.stats() when prefill_instances > 0 or a planner runs
    planner: dict | None = None  # SimPlanning.stats() when a planner runs
    tiers: dict | None = None  # tier_stats() when instances have a host pool or a store
    step_wall_s: float = 0.0  # wall seconds in the instances' start_step + finish_step (the engine side)

    def summary(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
        out = summarize(self.records, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
        us = np.frombuffer(self.decision_s, dtype=np.float64) * 1e6 if len(self.decision_s) else np.zeros(1)
        out.update(
            policy=self.policy,
            decision_us_mean=float(us.mean()), decision_us_p50=float(np.percentile(us, 50)),
            decision_us_p99=float(np.percentile(us, 99)), decision_us_max=float(us.max()),
            candidates_mean=self.num_candidates / max(len(self.decision_s), 1),
            engine_step_us_mean=self.step_wall_s * 1e6 / max(len(self.records), 1),  # per request
            index_entries=self.index_entries, index_entries_peak=max(self.index_peak, self.index_entries),
            sim_wall_s=self.wall_s, sim_virtual_s=self.virtual_s, steps=self.steps,
            preemptions=self.preemptions, kv_events=self.kv_events,
        )
        if self.disagg is not None:
            out["disagg"] = self.disagg
        if self.planner is not None:
            out["planner"] = self.planner
        if self.tiers is not None:
            out["tiers"] = self.tiers
        return out


DEFAULT_ARRIVAL = ArrivalConfig(rate=10.0)


def simulate(config: SimConfig, policy_name: str, specs: list[RequestSpec],
             arrival: ArrivalConfig = DEFAULT_ARRIVAL, planner: PlannerConfig | None = None) -> SimResult:
    """Run `specs` through a fresh cluster routed by `policy_name`; deterministic for config.seed.
    With `planner`, roles change on the virtual clock as `kvroute planner` would change them.

    The cyclic garbage collector is paused meanwhile: the simulator creates no cycles,
    and full collections over millions of live objects cost a quarter of a large run.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(config, policy_name, specs, arrival, planner)
    finally:
        if was_enabled:
            gc.enable()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimSetup:
    """A simulation ready to run: `cluster.run(router, iter(starts))`."""

    cluster: Cluster
    router: SimRouter | Replicas  # several: kvroute sim --routers N
    planning: SimPlanning | None
    starts: list[tuple[float, RequestSpec]]


def build(config: SimConfig, policy_name: str, specs: list[RequestSpec], arrival: ArrivalConfig,
          planner: PlannerConfig | None = None) -> SimSetup:
    """The cluster, router and arrivals `simulate` runs (tests watch them run)."""
    unserved = sorted({s.adapter for s in specs if s.adapter} - set(config.adapters))
    if unserved:
        raise ValueError(f"requests name adapter {unserved[0]!r}, which the simulated engines do not serve "
                         f"(--adapters)")
    cluster = Cluster(config.instances, config.engine(), config.event_delay_s, config.poll_interval_s)
    starts = list(arrivals(specs, arrival, config.seed))
    policy = build_policy(policy_name, cluster, config.seed, specs, starts, config.policy_args)
    followers: dict[int, list[RequestSpec]] = collections.defaultdict(list)
    for s in specs:
        if s.after is not None:
            followers[s.after].append(s)
    disagg = DisaggConfig(num_prefill=config.prefill_instances, min_uncached=config.pd_min_uncached,
                          seed=config.seed) \
        if config.prefill_instances or planner is not None else None
    router: SimRouter | Replicas
    admission = config.admission()
    if config.routers > 1 and planner is None:
        def make_router(policy_, **kw) -> SimRouter:
            return SimRouter(cluster, policy_, followers=followers, fast_k=config.fast_candidates,
                             recent_ttl_s=config.recent_ttl_s, admission=admission, **kw)
        router = build_replicas(
            cluster, config.routers, make_policy=lambda i: policy if i == 0 else build_policy(
                policy_name, cluster, config.seed + i, specs, starts, config.policy_args),
            make_router=make_router, admission=admission.config, sync_s=config.admission_sync_s,
            routers_of=dict(config.tenant_routers), until=starts[-1][0] if starts else 0.0)
    else:
        router = SimRouter(cluster, policy, followers=followers, fast_k=config.fast_candidates,
                           recent_ttl_s=config.recent_ttl_s, disagg=disagg, window=planner is not None,
                           admission=admission)
    planning = SimPlanning(cluster, router, planner, len(specs)) if planner is not None else None
    return SimSetup(cluster=cluster, router=router, planning=planning, starts=starts)


def _simulate(config: SimConfig, policy_name: str, specs: list[RequestSpec], arrival: ArrivalConfig,
              planner: PlannerConfig | None) -> SimResult:
    started = time.perf_counter()
    setup = build(config, policy_name, specs, arrival, planner)
    cluster, router, planning = setup.cluster, setup.router, setup.planning
    cluster.run(router, iter(setup.starts))
    if router.flights:
        raise RuntimeError(f"simulation ended with {len(router.flights)} requests still in flight")
    records = sorted(router.records, key=lambda r: r.index)
    if config.request_overhead_s:
        for r in records:
            r.ttft_s = None if r.ttft_s is None else r.ttft_s + config.request_overhead_s
            r.e2e_s = None if r.e2e_s is None else r.e2e_s + config.request_overhead_s
    return SimResult(
        policy=policy_name, records=records, decision_s=router.decision_s, num_candidates=router.num_candidates,
        index_entries=router.index.size_sync(), index_peak=router.index_peak,
        wall_s=time.perf_counter() - started, virtual_s=cluster.now,
        steps=sum(i.num_steps for i in cluster.instances),
        preemptions=sum(i.scheduler.num_preemptions for i in cluster.instances), kv_events=cluster.num_events,
        disagg=router.disagg.stats() if router.disagg else None,
        planner=planning.stats() if planning else None,
        tiers=tier_stats([i.io for i in cluster.instances if i.io is not None], cluster.store),
        step_wall_s=sum(i.step_wall_s for i in cluster.instances),
    )
