"""The policies of one `kvroute sim` run side by side: one process each, up to `jobs` at a time.

Each policy's simulation is independent and deterministic for the seed, so running them in
forked processes changes only the wall time: the same summaries and records as one after the
other (tests/unit/test_sim_parallel.py). The workload is built once, before the fork, and every
child reads it from the memory it inherits; a child sends back its summary and, when asked,
its records. Where `fork` is not available the policies run one after the other.

Per-decision and per-step microseconds are measured in each child as in a sequential run; two
children on two cores share caches and memory bandwidth, so those figures read a little higher.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import multiprocessing
import os
import sys
import time

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.planner.decide import PlannerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyRun:
    """What every policy of the run shares."""

    config: SimConfig
    specs: list[RequestSpec]
    arrival: ArrivalConfig
    planner: PlannerConfig | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    keep_records: bool = False
    prog: str = "kvroute sim"  # progress lines on stderr start with this
    progress: bool = True


_RUN: PolicyRun | None = None  # the run a forked child reads (set before the fork, never after)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def run_policies(run: PolicyRun, policies: list[str],
                 jobs: int) -> tuple[dict[str, dict], dict[str, list[RequestRecord]]]:
    """Per policy, its summary, and its records when `run.keep_records` (in `policies`' order)."""
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    workers = min(jobs, len(policies))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        outcomes = [_simulate_one(run, name) for name in policies]
    else:
        global _RUN
        _RUN = run
        try:
            fork = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=fork) as pool:
                outcomes = list(pool.map(_simulate_forked, policies))
        finally:
            _RUN = None
    summaries = {name: summary for name, (summary, _) in zip(policies, outcomes)}
    records = {name: recs for name, (_, recs) in zip(policies, outcomes) if recs is not None}
    return summaries, records


def _simulate_forked(name: str) -> tuple[dict, list[RequestRecord] | None]:
    assert _RUN is not None  # set before the pool forks
    return _simulate_one(_RUN, name)


def _simulate_one(run: PolicyRun, name: str) -> tuple[dict, list[RequestRecord] | None]:
    """One policy, its summary taken with the cyclic collector still paused (as `simulate` runs): the
    run leaves millions of young objects, and the first collection after it would walk them all (seconds
    at 100k requests) to find no cycle. They are frozen instead (`gc.freeze`: kept out of every later
    collection; refcounting still frees them) -- a command's process, not a library call."""
    started = time.perf_counter()
    if run.progress:
        print(f"{run.prog}: {name} on {run.config.instances} instances, {len(run.specs)} requests ...",
              file=sys.stderr, flush=True)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = simulate(run.config, name, run.specs, run.arrival, run.planner)
        summary = result.summary(run.slo_ttft_s, run.slo_tpot_s)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
    if run.progress:
        print(f"{run.prog}: {name} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return summary, result.records if run.keep_records else None
