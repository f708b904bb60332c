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
from kvroute.router.contract.interrupt import ignore_interrupts
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
        outcomes = _in_children(run, policies, workers)
    summaries = {name: summary for name, (summary, _) in zip(policies, outcomes)}
    records = {name: recs for name, (_, recs) in zip(policies, outcomes) if recs is not None}
    return summaries, records


def _in_children(run: PolicyRun, policies: list[str], workers: int) -> list[tuple[dict, list[RequestRecord] | None]]:
    """Every policy in a forked child, up to `workers` at a time. The children ignore Ctrl-C, which
    reaches the terminal's whole process group: on any exception here (KeyboardInterrupt too) this
    process stops them at once instead of waiting for their simulations to end (interrupt.py)."""
    global _RUN
    _RUN = run
    before = set(multiprocessing.active_children())
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                                  initializer=ignore_interrupts)
    try:
        return list(pool.map(_simulate_forked, policies))
    except BaseException:
        for child in set(multiprocessing.active_children()) - before:
            child.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _RUN = None


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
        _say(f"{run.prog}: {name} on {run.config.instances} instances, {len(run.specs)} requests ...")
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
        _say(f"{run.prog}: {name} done in {time.perf_counter() - started:.1f} s")
    return summary, result.records if run.keep_records else None


def _say(line: str) -> None:
    """One progress line on stderr in one write: the policies' children share it, and print's separate
    write of the newline let their lines run into each other."""
    print(line + "\n", end="", file=sys.stderr, flush=True)
