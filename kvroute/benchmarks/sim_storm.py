"""The session-recovery storm on 64 simulated GPU-class instances, by tier setup and credit rule.

    python -m kvroute.benchmarks.sim_storm --out sim_storm.json [--instances 64] [--slo-ttft 0.5]

Llama-2-7B on A100-80GB instances (`--cost-model a100-llama2-7b`: 8 MiB of K/V per
16-token block), 7,000 device blocks each (the ~56 GiB left after the weights),
16,000 host blocks (128 GiB of host memory per GPU), a PCIe Gen4 host link and an
RDMA store over 200 Gb/s InfiniBand, or a shared NVMe store (engine/kv/links.py LINKS
gives the published figures). Workload: 1,024 sessions of 2-3k tokens, 2,048 idle
requests of 3k tokens that push them out of device memory, then all 1,024 return
within 2 s. Each row is one deterministic `simulate()` run (the same as `kvroute
sim` with the flags printed); "fixed" rows credit tiers 1 / 0.75 / 0.25 like
Dynamo instead of by time saved. Storm figures are over the returning requests.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from kvroute.benchmarks.results import write_json
from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim import SimConfig, simulate
from kvroute.loadgen.workloads import make_workload
from kvroute.loadgen.workloads.session_storm import is_return
from kvroute.router.contract.settings_values import build

STORM = dict(sessions=1024, context_tokens=3072, min_context_tokens=2048, session_rate=150.0, idle_requests=2048,
             idle_tokens=3000, idle_rate=150.0, burst=1024, burst_spread=2.0, output_tokens=64)
HOST = dict(host_blocks=16000, kv_host_link="pcie4")
RDMA = dict(kv_store="redis://store", kv_store_link="infiniband")
NVME = dict(kv_store="file:///mnt/shared-nvme", kv_store_link="nvme")
FIXED = (("tier_credit", "fixed"), ("host_credit", 0.75), ("remote_credit", 0.25))
RUNS: dict[str, dict[str, Any]] = {
    "device only": {},
    "+ host (PCIe Gen4)": HOST,
    "+ RDMA store only": {"kv_host_link": "pcie4", **RDMA},
    "+ host + RDMA store": {**HOST, **RDMA},
    "+ host + RDMA store, fixed 1/0.75/0.25": {**HOST, **RDMA, "policy_args": FIXED},
    "+ host + NVMe store": {**HOST, **NVME},
    "+ host + NVMe store, fixed 1/0.75/0.25": {**HOST, **NVME, "policy_args": FIXED},
}


def storm_row(result, slo: float) -> dict:
    records = result.records
    storm = np.array([r.ttft_s for r in records if is_return(r.group) and r.ok])
    summary = result.summary(slo_ttft_s=slo)
    return {"storm_ttft_p50_s": float(np.percentile(storm, 50)), "storm_ttft_p90_s": float(np.percentile(storm, 90)),
            "storm_ttft_p99_s": float(np.percentile(storm, 99)),
            "storm_goodput": float((storm <= slo).sum() / sum(1 for r in records if is_return(r.group))),
            "goodput_all": summary["goodput"], "errors": summary["errors"],
            "cached_tokens_by_tier": summary["cached_tokens_by_tier"],
            "recoveries": (summary.get("tiers") or {}).get("recoveries")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=64)
    p.add_argument("--slo-ttft", type=float, default=0.5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    specs = make_workload("session-storm", seed=0, **STORM).requests()
    rows = {}
    for name, extra in RUNS.items():
        config = build(SimConfig, instances=args.instances, cost_model="a100-llama2-7b", num_blocks=7000, **extra)
        rows[name] = storm_row(simulate(config, "kv_aware", specs, ArrivalConfig()), args.slo_ttft)
        r = rows[name]
        print(f"{name:40} storm TTFT p50 {r['storm_ttft_p50_s'] * 1e3:6.0f} ms"
              f"  p90 {r['storm_ttft_p90_s'] * 1e3:6.0f} ms  p99 {r['storm_ttft_p99_s'] * 1e3:6.0f} ms"
              f"  goodput@{args.slo_ttft:g}s {r['storm_goodput']:6.1%}"
              f"  (all {r['goodput_all']:.1%})  {r['recoveries']}", flush=True)
    write_json(args.out, {"workload": STORM, "slo_ttft_s": args.slo_ttft, "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
