"""Several tenants at once: `kvroute loadgen --tenant SPEC [--tenant SPEC ...]`, goodput per tenant.

A SPEC is comma-separated `key=value` pairs:

    name=A,workload=shared_prefix,rate=4,duration=40[,priority=P][,key=KEY][,header=VALUE]
          [,start=S][,seed=N][,num_requests=N][,KNOB=VALUE ...]

`key` is sent as `Authorization: Bearer KEY` (the router's `--api-key NAME=KEY`), `header`
as the value of `--tenant-header NAME` (default: the tenant's name, when that flag is given),
`priority` as the body's `priority`; `start` delays the tenant's first request; knobs are the
workload's (`groups=4`, `input_tokens=1024`, ...). Each tenant runs its own open-loop
workload against the same target at the same time; the summary has one section per tenant
(with `refused`, `refused_p90_s`: how fast 429/503 answers came) and `all` over every request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from kvroute.loadgen.arrivals import ArrivalConfig, count_within
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.runner import LoadConfig, LoadResult, run_load
from kvroute.loadgen.summary import percentile, summarize
from kvroute.loadgen.workloads import CONFIGS, knob_names, make_workload, split_name

OWN = {"name", "workload", "rate", "duration", "priority", "key", "header", "start", "seed"}
REFUSED = (429, 503)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TenantLoad:
    name: str
    workload: str
    rate: float
    duration_s: float
    priority: int | None = None
    key: str | None = None
    header: str | None = None
    start_s: float = 0.0
    seed: int = 0
    knobs: tuple[tuple[str, object], ...] = ()


def _knob_type(workload: str, knob: str) -> type:
    base, _ = split_name(workload)
    return type(next(f.default for f in dataclasses.fields(CONFIGS[base]) if f.name == knob))


def parse_tenant(text: str) -> TenantLoad:
    """One --tenant SPEC; ValueError with a user-facing sentence."""
    fields = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--tenant {text!r}: {part!r} is not key=value")
        fields[key.strip()] = value.strip()
    missing = [k for k in ("name", "workload", "rate", "duration") if k not in fields]
    if missing:
        raise ValueError(f"--tenant {text!r} lacks {', '.join(missing)} (name=,workload=,rate=,duration= are needed)")
    workload = fields["workload"]
    allowed = set(knob_names(workload))
    knobs = []
    for key, value in fields.items():
        if key in OWN:
            continue
        if key not in allowed:
            raise ValueError(f"--tenant {fields['name']}: {key!r} is not a knob of workload {workload}")
        knobs.append((key, _knob_type(workload, key)(value)))
    try:
        load = TenantLoad(name=fields["name"], workload=workload, rate=float(fields["rate"]),
                          duration_s=float(fields["duration"]),
                          priority=int(fields["priority"]) if "priority" in fields else None,
                          key=fields.get("key"), header=fields.get("header"),
                          start_s=float(fields.get("start", 0)), seed=int(fields.get("seed", 0)), knobs=tuple(knobs))
    except ValueError as e:
        raise ValueError(f"--tenant {fields['name']}: {e}") from None
    if load.rate <= 0 or load.duration_s <= 0 or load.start_s < 0:
        raise ValueError(f"--tenant {load.name}: rate and duration must be positive, start >= 0")
    return load


def _config(base: LoadConfig, load: TenantLoad, tenant_header: str | None) -> LoadConfig:
    headers = []
    if load.key:
        headers.append(("Authorization", f"Bearer {load.key}"))
    if tenant_header:
        headers.append((tenant_header, load.header or load.name))
    return dataclasses.replace(base, arrival=ArrivalConfig(rate=load.rate), duration_s=load.duration_s,
                               seed=load.seed, priority=load.priority, headers=tuple(headers))


def workload_of(load: TenantLoad):
    needed = max(1, count_within(load.rate, 1.0, load.duration_s, load.seed))
    knobs = dict(load.knobs)
    knobs.setdefault("num_requests", needed)
    return make_workload(load.workload, seed=load.seed, **knobs)


async def run_tenants(base: LoadConfig, loads: Sequence[TenantLoad],
                      tenant_header: str | None = None) -> dict[str, LoadResult]:
    """Every tenant's workload against `base.target` at once; their results by name."""
    async def one(load: TenantLoad) -> LoadResult:
        await asyncio.sleep(load.start_s)
        return await run_load(_config(base, load, tenant_header), workload_of(load))

    results = await asyncio.gather(*(one(load) for load in loads))
    return dict(zip((load.name for load in loads), results))


def refusals(records: Sequence[RequestRecord]) -> dict:
    late = [r.e2e_s for r in records if r.status in REFUSED and r.e2e_s is not None]
    return {"refused": len(late), "refused_p50_s": percentile(late, 50), "refused_p90_s": percentile(late, 90)}


def tenant_summary(results: dict[str, LoadResult], slo_ttft_s: float | None,
                   slo_tpot_s: float | None) -> tuple[dict, list[RequestRecord]]:
    """Per tenant: its summary plus refusals; `all`: every request, over the longest tenant's duration.
    The records come with their tenant's name as their group."""
    out, everything = {}, []
    for name, result in results.items():
        out[name] = {**result.summary(slo_ttft_s, slo_tpot_s), **refusals(result.records)}
        for r in result.records:
            everything.append(dataclasses.replace(r, group=f"{name}:{r.group}" if r.group else name))
    duration = max((r.duration_s for r in results.values()), default=0.0)
    out["all"] = {**summarize(everything, duration_s=duration, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s),
                  **refusals(everything)}
    return {"tenants": out}, everything
