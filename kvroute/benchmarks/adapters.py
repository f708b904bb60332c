"""Cache-aware routing with LoRA adapters: cached share with three adapters against none, four engines.

    python -m kvroute.benchmarks.adapters --out adapters.json [--quick] [--skip-torch]

The issue 41 measurement. Three adapters over four kvroute engines serving them (`--lora-modules`,
all three in slots), a shared-prefix workload, kv_aware against round_robin, and the same workload
without adapters. Two ways of spreading it (loadgen/adapters.py): `group`, each prefix group under
one adapter (an adapter's own system prompts: as many distinct prefixes as without adapters), and
`request`, round-robin per request, so every group is asked under every adapter: three times the
distinct prefixes, which no routing can share (an adapter's K/V is its own), shown beside the
same workload without adapters and three times the groups.

- sim: the simulator (loadgen/sim: the router's decision and the engine's step on a virtual clock),
  4 instances x 1,024 blocks, 16 groups of 3,072-token prefixes, 480 requests at 12/s.
- http sim / http torch: `kvroute bench` on 4 real engines and a router over loopback; torch engines
  run the tiny model with random PEFT adapters written on the fly (rank 8, every projection).

Writes one JSON: a row per (part, setup, policy) with the cached share of prompt tokens, its ratio
to the same policy without adapters, and TTFT; `--quick` makes every part smaller.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvroute.loadgen.adapters import assign
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.processes import kvroute_argv
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.settings_values import build

ADAPTERS = ("sql", "chat", "code")
POLICIES = ("round_robin", "kv_aware")
SETUPS = (("none", 1, ""), ("group", 1, "group"), ("request", 1, "request"), ("none, 3x groups", 3, ""))


def sim_rows(quick: bool) -> list[dict]:
    groups, requests = (8, 160) if quick else (16, 480)
    config = build(SimConfig, instances=4, num_blocks=1024, adapters=ADAPTERS, max_loras=len(ADAPTERS),
                       request_overhead_s=0.005)
    rows = []
    for setup, scale, how in SETUPS:
        specs = make_workload("shared-prefix", seed=0, num_requests=requests, groups=groups * scale,
                              prefix_tokens=3072, question_tokens=64, output_tokens=16).requests()
        specs = assign(specs, ADAPTERS, how, seed=0) if how else specs
        for policy in POLICIES:
            summary = simulate(config, policy, specs, ArrivalConfig(rate=12.0)).summary()
            rows.append(row("sim", setup, policy, summary))
    return rows


def http_rows(backend: str, quick: bool, work: Path) -> list[dict]:
    """`kvroute bench` with and without the adapters (both spreads), each policy on fresh engines."""
    rows = []
    for setup, _, how in SETUPS[:3]:
        out = work / f"{backend}-{setup}"
        cmd = kvroute_argv("bench", "--backend", backend, "--engines", "4", "--policies", ",".join(POLICIES),
                           "--out", str(out), "--no-progress", "--seed", "0")
        if backend == "sim":
            cmd += ["--num-requests", "160" if quick else "320", "--groups", "8", "--rate", "12"]
        elif quick:
            cmd += ["--quick"]
        if how:
            cmd += ["--adapters", ",".join(ADAPTERS), "--adapter-assign", how]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        for run in json.loads((out / "results.json").read_text()):
            rows.append(row(f"http {backend}", setup, run["name"], run))
    return rows


def row(part: str, setup: str, policy: str, summary: dict) -> dict:
    return {"part": part, "setup": setup, "policy": policy, "requests": summary.get("completed"),
            "cached_share": summary.get("cached_token_ratio"), "ttft_p50_ms": _ms(summary.get("ttft_p50_s")),
            "ttft_p90_ms": _ms(summary.get("ttft_p90_s"))}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's cached share over the same part and policy's share without adapters."""
    plain = {(r["part"], r["policy"]): r["cached_share"] for r in rows if r["setup"] == "none"}
    for r in rows:
        base = plain.get((r["part"], r["policy"]))
        r["vs_none"] = round(r["cached_share"] / base, 3) if base and r["cached_share"] is not None else None
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--quick", action="store_true", help="smaller runs")
    p.add_argument("--skip-torch", action="store_true", help="leave out the torch engines (the slowest part)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows = sim_rows(args.quick)
    with tempfile.TemporaryDirectory(prefix="kvroute-adapters-") as work:
        for backend in ("sim",) + (() if args.skip_torch else ("torch",)):
            rows += http_rows(backend, args.quick, Path(work))
    rows = with_ratios(rows)
    result = {"command": "python -m kvroute.benchmarks.adapters --out FILE" + " --quick" * args.quick
              + " --skip-torch" * args.skip_torch, "adapters": list(ADAPTERS), "rows": rows,
              "wall_s": round(time.monotonic() - t0, 1)}
    Path(args.out).write_text(json.dumps(result, indent=2))
    for r in rows:
        print(f"{r['part']:>10}  {r['setup']:>15}  {r['policy']:>11}  cached {r['cached_share'] or 0:6.1%}  "
              f"vs none {r['vs_none'] or 0:5.3f}  ttft p50 {r['ttft_p50_ms']} ms  p90 {r['ttft_p90_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
