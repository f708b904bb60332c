"""The real-process overload runs of docs/admission.md, and their table.

    python -m kvroute.benchmarks.admission_processes OUT_DIR [--router-flags "--workers 2"]
    python -m kvroute.benchmarks.admission_processes OUT_DIR --table-only

Per run, a fresh fleet on loopback (the process harness, loadgen/processes.py): 4 `kvroute engine
--backend sim`, one `kvroute router --api-key A=ka --api-key B=kb` in front (plus the run's router
flags and --router-flags), and `kvroute loadgen --tenant ...` against it; OUT_DIR/NAME/ gets the
loadgen output, OUT_DIR/NAME.txt what it printed, OUT_DIR/NAME.metrics the router's admission
series at the end. Then one row per run and tenant: the share and rate of requests within the SLO,
TTFT p90, the share of admitted requests within the SLO, refusals and their latency (p90, at the client).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import shlex
import subprocess
import sys
import urllib.request

from kvroute.benchmarks.results import runs_parser
from kvroute.loadgen.processes import Processes, kvroute_argv

FLOOD = ("--tenant", "name=A,workload=shared-prefix,rate=4,duration=44,key=ka",
         "--tenant", "name=B,workload=random,rate=60,duration=40,start=2,key=kb,seed=7")
PRIORITY = ("--tenant", "name=H,workload=random,rate=8,duration=55,priority=-1,seed=21,key=kb",
            "--tenant", "name=L,workload=random,rate=60,duration=30,start=5,priority=1,seed=22,key=kb",
            "--tenant", "name=Lafter,workload=random,rate=8,duration=15,start=40,priority=1,seed=23,key=kb")
ON = ("--slo-ttft-s", "0.5")
# name, its label in the table, the router's flags, loadgen's flags
RUNS = (
    ("alone25", "B alone 25/s, off", (), ("--tenant", "name=B,workload=random,rate=25,duration=20,key=kb,seed=11")),
    ("alone35", "B alone 35/s, off", (), ("--tenant", "name=B,workload=random,rate=35,duration=20,key=kb,seed=12")),
    ("flood-off", "flood, off", (), FLOOD),
    ("flood-on", "flood, on", ON, FLOOD),
    ("priority", "priority, on", ON, PRIORITY),
)


async def run(out: pathlib.Path, name: str, router_flags: tuple[str, ...], loadgen_flags: tuple[str, ...]) -> None:
    """One run on a fleet of its own: loadgen's output under OUT/NAME, its printout and the admission series beside."""
    with Processes(str(out / "logs" / name)) as procs:
        engines = [procs.server(f"engine-{i}", "engine", "--backend", "sim", "--log-level", "WARNING")
                   for i in range(4)]
        for url in engines:
            await procs.wait_ready(url)
        router = procs.server("router", "router", "--log-level", "WARNING", "--api-key", "A=ka", "--api-key", "B=kb",
                              *[a for e in engines for a in ("--engine", e)], *router_flags)
        await procs.wait_ready(router)
        with open(out / f"{name}.txt", "w") as printed:
            subprocess.run(kvroute_argv("loadgen", "--target", router, "--slo-ttft", "0.5", "--no-progress", "--out",
                                        str(out / name), *loadgen_flags), stdout=printed, stderr=subprocess.STDOUT)
        with urllib.request.urlopen(router + "/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
        (out / f"{name}.metrics").write_text("".join(f"{line}\n" for line in lines
                                                     if line.startswith("kvroute_router_admission_")))
    print(f"{name} done", file=sys.stderr, flush=True)


def rows(out: pathlib.Path) -> list[str]:
    lines = ["| run | tenant | in-SLO share | in-SLO req/s | TTFT p90 s | admitted in SLO | refused | refusal p90 s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, label, _, _ in RUNS:
        path = out / name / "summary.json"
        if not path.exists():
            continue
        tenants = json.loads(path.read_text())["tenants"]
        for tenant, s in tenants.items():
            if tenant == "all" and len(tenants) == 2:
                continue  # one tenant: its row is the whole run
            refused = s.get("refused", 0)
            admitted = s["requests"] - refused
            in_slo = s["goodput"] * s["requests"]
            late = f"{s['refused_p90_s']:.3f}" if refused else "-"
            lines.append(f"| {label} | {tenant} | {s['goodput']:.3f} | {s['goodput_rps']:.1f} | {s['ttft_p90_s']:.3f} "
                         f"| {in_slo / admitted if admitted else 0:.3f} | {refused} | {late} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = runs_parser(__doc__)
    parser.add_argument("--router-flags", default="", help="more flags for every router, in one string")
    args = parser.parse_args(argv)
    if args.table_only and not args.out.is_dir():
        print(f"admission_processes: {args.out} is not a directory", file=sys.stderr)
        return 2
    if not args.table_only:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, _, router_flags, loadgen_flags in RUNS:
            asyncio.run(run(args.out, name, (*router_flags, *shlex.split(args.router_flags)), loadgen_flags))
    print("\n".join(rows(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
