"""The overload scenarios of docs/admission.md on the simulator (deterministic, any machine).

    python -m kvroute.benchmarks.admission_sim [--instances 4] [--slo 0.5] [--scale 1.0]

`flood`: tenant A (shared-prefix, 4 req/s) while tenant B floods with fresh prompts (60 req/s for
40 s), admission off and on; `alone`: B alone at rates around the knee; `priority`: a high-priority
stream (priority -1, 8 req/s) while a low-priority one floods (priority 1, 60 req/s, 5-35 s) and
low-priority work after the flood (40-55 s). `--scale` multiplies every rate (for a bigger fleet).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.sim.tenant_mix import mixed_specs, per_tenant
from kvroute.loadgen.tenants import parse_tenant


def run(base: SimConfig, specs: list[str], slo: float, admission: bool, tenants=()) -> dict:
    config = dataclasses.replace(base, admission_slo_s=slo if admission else None, admission_tenants=tenants)
    result = simulate(config, "kv_aware", mixed_specs([parse_tenant(s) for s in specs]), ArrivalConfig())
    return per_tenant(result.records, slo)


def row(name: str, tenant: str, s: dict) -> str:
    fmt = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    admitted = s["completed"]
    return (f"| {name} | {tenant} | {s['requests']} | {fmt(s['goodput'])} | {fmt(s['goodput_rps'], 1)} | "
            f"{fmt(s['ttft_p90_s'])} | {admitted} | {s['refused']} | {fmt(s['refused_p90_s'])} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--slo", type=float, default=0.5)
    p.add_argument("--scale", type=float, default=1.0)
    args = p.parse_args(argv)
    base, k = SimConfig(instances=args.instances, seed=0), args.scale
    flood = [f"name=A,workload=shared-prefix,rate={4 * k},duration=44",
             f"name=B,workload=random,rate={60 * k},duration=40,start=2,seed=7"]
    print("| run | tenant | requests | in-SLO share | in-SLO req/s | TTFT p90 s | admitted | refused | refusal p90 s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rate in (35, 45, 55):
        out = run(base, [f"name=B,workload=random,rate={rate * k},duration=20,seed=11"], args.slo, False)
        print(row(f"B alone {rate * k:g}/s", "B", out["B"]))
    for admission in (False, True):
        out = run(base, flood, args.slo, admission)
        for tenant in ("A", "B"):
            print(row(f"flood, admission {'on' if admission else 'off'}", tenant, out[tenant]))
    priority = [f"name=H,workload=random,rate={8 * k},duration=55,seed=21",
                f"name=L,workload=random,rate={60 * k},duration=30,start=5,seed=22",
                f"name=Lafter,workload=random,rate={8 * k},duration=15,start=40,seed=23"]
    tenants = (("H", -1, 1.0), ("L", 1, 1.0), ("Lafter", 1, 1.0))
    for admission in (False, True):
        out = run(base, priority, args.slo, admission, tenants)
        for tenant in ("H", "L", "Lafter"):
            print(row(f"priority, admission {'on' if admission else 'off'}", tenant, out[tenant]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
