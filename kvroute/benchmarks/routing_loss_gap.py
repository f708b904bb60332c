"""The routing-loss split against the cached-share gap it explains: a simulator case, or live bench runs.

    python -m kvroute.benchmarks.routing_loss_gap sim [--case pressure-64] [--requests N] \\
        [--policies kv_aware,round_robin,oracle_future] [--reference oracle] [--out gap.json]
    python -m kvroute.benchmarks.routing_loss_gap bench BENCH_OUT --reference NAME [--out gap.json]

Per policy (sim: each run of the case, `loadgen/sim/suite.py`'s rows; bench: each run under
BENCH_OUT/runs/, as `kvroute bench --out BENCH_OUT` writes them): the gap is the reference's
cached-token share less the policy's, both from the engines' reported cached tokens
(`cached_token_ratio`, loadgen/summary.py); the parts are the differences of their losses to the
workload, to balancing and to the index (router/decision/routing_loss.py `gap_by_cause`), from the
router's per-request figures. Printed: the gap, the parts, their sum and how far it is from the
gap (`off`, in prompt-token shares); also each run's own loss, 1 - cached share against the sum of
its three losses. Written to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Mapping

from kvroute.loadgen.sim.report import ORACLE
from kvroute.loadgen.sim.suite import SUITE_CONFIG, capped, run_case, suite_cases
from kvroute.router.decision.routing_loss import CAUSES, gap_by_cause


def compare(results: Mapping[str, Mapping], reference: str) -> dict:
    """Per run: its own split checked (1 - cached share vs its losses), and its gap to `reference` by cause."""
    ref = results[reference]
    out = {}
    for name, s in results.items():
        loss = s.get("routing_loss") or {}
        if "cached" not in loss or s.get("cached_token_ratio") is None:
            out[name] = {"note": "no routing-loss figures"}
            continue
        own = sum(loss[f"lost_to_{c}"] for c in CAUSES)
        row = {"cached_token_ratio": s["cached_token_ratio"], "split": loss,
               "own_loss": 1 - s["cached_token_ratio"], "own_parts": own}
        gap = gap_by_cause(loss, ref.get("routing_loss") or {}) if name != reference else None
        if gap is not None:
            measured = ref["cached_token_ratio"] - s["cached_token_ratio"]
            parts = sum(gap[c] for c in CAUSES)
            row.update(gap=measured, parts={c: gap[c] for c in CAUSES}, parts_sum=parts, off=parts - measured)
        out[name] = row
    return out


def lines(compared: Mapping[str, Mapping], reference: str) -> list[str]:
    out = []
    for name, r in compared.items():
        if "split" not in r:
            out.append(f"{name}: {r['note']}")
            continue
        out.append(f"{name}: cached {r['cached_token_ratio']:.2%}; 1 - cached {r['own_loss']:.2%}, its losses add "
                   f"up to {r['own_parts']:.2%}")
        if "gap" in r:
            out.append(f"  gap to {reference} {r['gap']:+.2%} (cached shares); parts "
                       + ", ".join(f"{c} {v:+.2%}" for c, v in r["parts"].items())
                       + f"; sum {r['parts_sum']:+.2%}, off by {r['off']:+.2%}")
    return out


def from_sim(args: argparse.Namespace) -> dict:
    cases, _ = suite_cases(None)
    case = next((c for c in cases if c.name == args.case), None)
    if case is None:
        raise ValueError(f"no case {args.case} (known: {', '.join(c.name for c in cases)})")
    policies = list(dict.fromkeys([*args.policies.split(","), args.reference]))
    row = run_case(SUITE_CONFIG, policies, capped(case, args.requests), progress=True)
    return row["results"]


def from_bench(args: argparse.Namespace) -> dict:
    runs = pathlib.Path(args.bench_out) / "runs"
    if not runs.is_dir():
        raise ValueError(f"{runs} is not a directory (kvroute bench --out {args.bench_out} writes it)")
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(runs.glob("*/summary.json"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    sim = sub.add_parser("sim", help="a row of kvroute sim --suite")
    sim.add_argument("--case", default="pressure-64", help="the suite's row (default pressure-64)")
    sim.add_argument("--requests", type=int, help="cap the row's request count")
    sim.add_argument("--policies", default="kv_aware,round_robin,oracle_future", help="comma-separated")
    sim.add_argument("--reference", default=ORACLE, help=f"the run the gaps are to (default {ORACLE})")
    bench = sub.add_parser("bench", help="the runs of a kvroute bench --out directory")
    bench.add_argument("bench_out", help="kvroute bench's --out directory")
    bench.add_argument("--reference", required=True, help="the run the gaps are to (a policy name)")
    for p in (sim, bench):
        p.add_argument("--out", type=pathlib.Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    try:
        results = from_sim(args) if args.mode == "sim" else from_bench(args)
        if args.reference not in results:
            raise ValueError(f"no run named {args.reference} (have: {', '.join(results)})")
    except ValueError as e:
        print(f"routing_loss_gap: {e}", file=sys.stderr)
        return 2
    compared = compare(results, args.reference)
    print("\n".join(lines(compared, args.reference)))
    if args.out:
        args.out.write_text(json.dumps({"reference": args.reference, "runs": compared}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
