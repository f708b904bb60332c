"""The P:D ratio sweep: colocated and every prefill:decode split of N instances, on one workload.

DistServe's way of choosing a configuration: simulate each candidate on the same
workload and seed, measure goodput (the share of requests meeting both the TTFT
and the TPOT SLO) and keep the one with the most goodput per instance. All
candidates have N instances and see the same arrivals, so that is the highest
SLO attainment; ties go to the most goodput req/s per instance, then the first
row. (DistServe searches the highest rate each configuration sustains at a target
attainment; rerun the sweep at several --rate values for that.)

    kvroute sim --instances 8 --workload random ... --rate 8 --slo-ttft 1 --slo-tpot 0.04 --pd-sweep
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.runner import SimConfig, simulate
from kvroute.loadgen.workload_base import RequestSpec

COLUMNS = (  # (header, row key, scale, digits)
    ("ttft p50 ms", "ttft_p50_s", 1e3, 1),
    ("ttft p90 ms", "ttft_p90_s", 1e3, 1),
    ("tpot p50 ms", "tpot_p50_s", 1e3, 2),
    ("tpot p90 ms", "tpot_p90_s", 1e3, 2),
    ("goodput %", "goodput", 100, 1),
    ("goodput req/s", "goodput_rps", 1, 2),
    ("req/s/inst", "goodput_rps_per_instance", 1, 3),
    ("errors", "errors", 1, 0),
    ("pulled blocks", "kv_blocks_pulled", 1, 0),
)


def label(prefill: int, instances: int) -> str:
    return "colocated" if prefill == 0 else f"{prefill}P:{instances - prefill}D"


def pd_sweep(config: SimConfig, policy: str, specs: list[RequestSpec], arrival: ArrivalConfig,
             slo_ttft_s: float | None, slo_tpot_s: float | None, progress: bool = False) -> dict:
    """One row per configuration (colocated first, then 1P:(N-1)D .. (N-1)P:1D) and the best one."""
    n = config.instances
    rows = []
    for prefill in range(n):
        name = label(prefill, n)
        if progress:
            print(f"kvroute sim: pd sweep {name}, {len(specs)} requests ...", file=sys.stderr)
        result = simulate(dataclasses.replace(config, prefill_instances=prefill), policy, specs, arrival)
        s = result.summary(slo_ttft_s, slo_tpot_s)
        rps = s["goodput_rps"] or 0.0
        rows.append({"config": name, "prefill_instances": prefill, "decode_instances": n - prefill if prefill else 0,
                     **{k: s.get(k) for k in ("requests", "errors", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                                              "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "e2e_p50_s", "goodput",
                                              "goodput_rps", "cached_token_ratio", "preemptions")},
                     "goodput_rps_per_instance": rps / n,
                     **{k: (s.get("disagg") or {}).get(k) for k in ("kv_blocks_pulled", "whole_on_decode")}})
    best = max(rows, key=lambda r: (r["goodput"] or 0.0, r["goodput_rps_per_instance"]))  # first wins a tie
    return {"policy": policy, "slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s, "kv_link": config.runner.kv_link,
            "pd_min_uncached": config.pd_min_uncached, "rows": rows, "best": best["config"]}


def _cell(value: Any, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def format_sweep(out: Mapping[str, Any]) -> str:
    """A plain-text table of `cli.run`'s output with a sweep."""
    sweep = out["pd_sweep"]
    headers = ["config", *(h for h, *_ in COLUMNS)]
    rows = [[r["config"], *(_cell(r.get(key), scale, digits) for _, key, scale, digits in COLUMNS)]
            for r in sweep["rows"]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    slo = lambda v: "-" if v is None else f"{v * 1e3:g} ms"  # noqa: E731
    lines = [
        f"{out['config']['instances']} instances, {out['workload'].get('workload')}, {out['arrival']}, "
        f"cost model {out['config']['cost_model']}, policy {sweep['policy']}, link {sweep['kv_link']}, "
        f"SLO ttft {slo(sweep['slo_ttft_s'])} tpot {slo(sweep['slo_tpot_s'])}",
        "  ".join(h.rjust(w) for h, w in zip(headers, widths)),
        *("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows),
        f"best: {sweep['best']} (most goodput per instance)",
    ]
    return "\n".join(lines)
