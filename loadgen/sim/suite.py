"""`kvroute sim --suite`: every workload and a KV pressure sweep, each policy against the oracle.

So that no change can win one workload by losing another unseen, the suite runs
every policy with its default parameters on one fixed cluster (`SUITE_CONFIG`: 8
instances of 1,024 blocks, the bench's sizing, 5 ms request overhead) over:

    shared-prefix   16 groups of a 3,072-token prompt + 64-token questions, 24 req/s
    multi-turn      5-turn sessions, 512-token system prompt, 1 s think time, 4 sessions/s
    doc-qa          32 documents of 2,048 tokens, Zipf 1.1, 24 req/s
    random          1,088-token prompts sharing nothing, 24 req/s
    hot-prefix      one 3,072-token prompt shared by every request, 100 req/s: more than one
                    instance can serve, so the prefix must be copied (replication)
    mooncake        the Mooncake FAST'25 synthetic trace, shipped in the package (loadgen/data/,
                    3,993 requests), scaled as `trace` does by default
    pressure-D      doc-qa with D = 16, 32, 48, 64, 96 documents of 2,400 tokens, Zipf 0.9,
                    40-token questions, 8 output tokens, 24 req/s: the same pools under more
                    and more pressure (48 documents nearly fill the fleet's 8,192 blocks)

(the workload rows are the README's benchmark workloads; the pressure rows issue
15's case). Each row reports every policy's cached-token share and TTFT p90
divided by the oracle's (report.relative_to_oracle), and `targets` checks kv_aware
against TARGET (p90 at most 1.25x the oracle's, cached share at least 0.98 of it;
with nothing to cache, as in `random`, only p90 counts). `oracle_future` is the
stronger reference (oracle_future.py): the oracle plus the price of what each
placement evicts, known from the workload's future; `beaten` lists the rows where
it does better than the oracle (the oracle optimises each request alone).
`requests` caps every row's request count (tests use a small one); a missing
trace file skips its row with a line saying so.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.parallel import PolicyRun, run_policies
from kvroute.loadgen.sim.report import ORACLE, relative_to_oracle
from kvroute.loadgen.sim.runner import SimConfig
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings import flat
from kvroute.router.contract.settings_values import build

SUITE_CONFIG = build(SimConfig, instances=8, num_blocks=1024, request_overhead_s=0.005)
STRONGER = "oracle_future"
SUITE_POLICIES = ("round_robin", "least_load", "prefix_hash", "kv_aware", ORACLE, STRONGER)
TARGET = {"policy": "kv_aware", "ttft_p90": 1.25, "cached_token_ratio": 0.98}
PRESSURE_DOCUMENTS = (16, 32, 48, 64, 96)
DEFAULT_TRACE = pathlib.Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic_trace.jsonl.gz"
KEPT = ("requests", "errors", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "cached_token_ratio",
        "goodput", "preemptions", "decision_us_mean", "sim_wall_s", "routing_loss")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    workload: str  # a workload name, or trace:FILE
    knobs: Mapping[str, Any]
    rate: float | None  # requests/s, open loop; None: the workload's own send times


def suite_cases(trace: str | pathlib.Path | None = DEFAULT_TRACE) -> tuple[list[Case], list[str]]:
    """The suite's rows, and a line for each one skipped."""
    cases = [
        Case("shared-prefix", "shared-prefix", dict(num_requests=4000, groups=16, prefix_tokens=3072,
                                                     question_tokens=64, output_tokens=16), 24.0),
        Case("multi-turn", "multi-turn", dict(num_requests=2000, turns=5, system_tokens=512, question_tokens=128,
                                               answer_tokens=64, output_tokens=16, think_time=1.0), 4.0),
        Case("doc-qa", "doc-qa", dict(num_requests=3000, documents=32, doc_tokens=2048, question_tokens=32,
                                       output_tokens=16, zipf=1.1), 24.0),
        Case("random", "random", dict(num_requests=2000, input_tokens=1088, output_tokens=16), 24.0),
        Case("hot-prefix", "shared-prefix", dict(num_requests=4000, groups=1, prefix_tokens=3072,
                                                  question_tokens=64, output_tokens=16), 100.0),
    ]
    skipped = []
    if trace is not None and pathlib.Path(trace).is_file():
        cases.append(Case("mooncake", f"trace:{trace}", {}, None))
    else:
        skipped.append(f"mooncake: skipped, no trace file at {trace}")
    for documents in PRESSURE_DOCUMENTS:
        cases.append(Case(f"pressure-{documents}", "doc-qa", dict(
            num_requests=3000, documents=documents, doc_tokens=2400, question_tokens=40, output_tokens=8,
            zipf=0.9), 24.0))
    return cases, skipped


def capped(case: Case, requests: int | None) -> Case:
    if requests is None:
        return case
    return dataclasses.replace(case, knobs={**case.knobs, "num_requests": min(case.knobs.get("num_requests", requests),
                                                                              requests)})


def run_case(config: SimConfig, policies: list[str], case: Case, progress: bool = False, jobs: int = 1) -> dict:
    """One row: every policy over the case's workload, up to `jobs` policies at once (parallel.py)."""
    workload = make_workload(case.workload, seed=config.seed, **case.knobs)
    specs = workload.requests()
    arrival = ArrivalConfig(rate=case.rate)
    run = PolicyRun(config=config, specs=specs, arrival=arrival, prog=f"kvroute sim --suite: {case.name}",
                    progress=progress)
    summaries, _ = run_policies(run, policies, jobs)
    results = {name: {k: summary.get(k) for k in KEPT} for name, summary in summaries.items()}
    return {"case": case.name, "workload": workload.info(), "arrival": arrival.describe(), "results": results,
            "relative_to_oracle": relative_to_oracle(results)}


def check_targets(rows: list[dict], target: Mapping[str, Any] = TARGET) -> dict:
    """Which rows the target policy meets (p90 ratio <= target, cached ratio >= target) and which it misses."""
    met: list[str] = []
    missed: list[str] = []
    for row in rows:
        rel = (row["relative_to_oracle"] or {}).get(target["policy"])
        if rel is None:
            continue
        nothing_cached = not row["results"][ORACLE].get("cached_token_ratio")
        ok = (rel["ttft_p90"] is not None and rel["ttft_p90"] <= target["ttft_p90"]
              and (nothing_cached or rel["cached_token_ratio"] >= target["cached_token_ratio"]))
        (met if ok else missed).append(row["case"])
    return {**target, "met": met, "missed": missed}


def oracle_beaten(rows: list[dict], by: str = STRONGER, margin: float = 0.005) -> list[str]:
    """Rows where `by` caches more or has a lower TTFT p90 than the oracle by more than `margin`."""
    out = []
    for row in rows:
        rel = (row["relative_to_oracle"] or {}).get(by)
        if rel and ((rel["cached_token_ratio"] or 1.0) > 1 + margin or (rel["ttft_p90"] or 1.0) < 1 - margin):
            out.append(row["case"])
    return out


def run_suite(config: SimConfig = SUITE_CONFIG, policies: list[str] | tuple[str, ...] = SUITE_POLICIES,
              requests: int | None = None, trace: str | pathlib.Path | None = DEFAULT_TRACE,
              progress: bool = False, jobs: int = 1) -> dict:
    cases, skipped = suite_cases(trace)
    for line in skipped:
        print(f"kvroute sim --suite: {line}", file=sys.stderr)
    rows = [run_case(config, list(policies), capped(case, requests), progress, jobs) for case in cases]
    return {"config": flat(config), "policies": list(policies), "cases": rows, "skipped": skipped,
            "targets": check_targets(rows), "oracle_beaten_by": {STRONGER: oracle_beaten(rows)}}
