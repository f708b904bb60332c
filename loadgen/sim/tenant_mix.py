"""Several tenants' workloads as one simulator workload: `kvroute loadgen --tenant` on the virtual clock.

`mixed_specs(loads)` draws each tenant's open-loop send times (loadgen/arrivals.py, from the
tenant's own seed, shifted by its `start`, cut at its duration), names every request's group
`TENANT:group`, and returns them re-indexed in send order with fixed send times, for
`simulate(..., ArrivalConfig())` (trace-replay mode). With `SimConfig.admission_tenants`, the
simulator's admission (loadgen/sim/admission.py) reads the tenant from the group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvroute.loadgen.arrivals import arrival_times
from kvroute.loadgen.summary import summarize
from kvroute.loadgen.tenants import TenantLoad, refusals, workload_of
from kvroute.loadgen.workload_base import RequestSpec


def mixed_specs(loads: Sequence[TenantLoad]) -> list[RequestSpec]:
    timed = []
    for load in loads:
        specs = [s for s in workload_of(load).requests() if s.after is None]
        times = arrival_times(load.rate, 1.0, len(specs), load.seed)
        timed += [(load.start_s + t, load.name, s) for t, s in zip(times, specs) if t < load.duration_s]
    timed.sort(key=lambda x: x[0])
    return [dataclasses.replace(s, index=i, group=f"{name}:{s.group}", arrival_s=at, after=None)
            for i, (at, name, s) in enumerate(timed)]


def per_tenant(records, slo_ttft_s: float | None) -> dict:
    """Each tenant's summary (with refusals) from the simulator's records."""
    by: dict[str, list] = {}
    for r in records:
        by.setdefault(r.group.partition(":")[0], []).append(r)
    return {name: {**summarize(recs, slo_ttft_s=slo_ttft_s), **refusals(recs)} for name, recs in sorted(by.items())}


def format_tenants(by_policy: dict[str, dict]) -> str:
    """A row per policy and tenant: requests, in-SLO share and rate, TTFT p90, refusals and their p90."""
    fmt = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [f"{'policy':>10} {'tenant':>8} {'requests':>8} {'in-SLO':>7} {'in-SLO/s':>8} {'ttft p90 s':>10} "
             f"{'refused':>7} {'refusal p90 s':>13}"]
    for policy, tenants in by_policy.items():
        for name, s in tenants.items():
            lines.append(f"{policy:>10} {name:>8} {s['requests']:>8} {fmt(s['goodput']):>7} "
                         f"{fmt(s['goodput_rps'], 1):>8} {fmt(s['ttft_p90_s']):>10} {s['refused']:>7} "
                         f"{fmt(s['refused_p90_s'] if s['refused'] else None):>13}")
    return "\n".join(lines)
