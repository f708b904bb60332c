"""Pure summary math over per-request records (RequestRecord objects or their dicts).

`summarize(records, duration_s=..., slo_ttft_s=..., slo_tpot_s=...)` returns a flat
dict; `kvroute bench` and the cluster simulator rely on these names:

    requests, completed, errors, error_kinds, duration_s, throughput_rps, output_tok_s,
    ttft_{mean,p50,p90,p99}_s, tpot_{p50,p90,p99}_s, itl_{p50,p99}_s, e2e_{p50,p90,p99}_s,
    prompt_tokens, cached_tokens, cached_tokens_by_tier, output_tokens, cached_token_ratio,
    slo_ttft_s, slo_tpot_s, goodput, goodput_rps, instance_requests, instance_share, send_lag_p99_s,
    routing_loss (the routing-loss split, router/decision/routing_loss.py, of the ok requests that
    carry the router's figures and the engine's cached tokens; None without any)

Latencies count ok requests only. Percentiles interpolate linearly (numpy's
default); None when there is nothing to measure. `cached_token_ratio` is the sum
of cached tokens over the sum of prompt tokens of the ok requests whose server
reported cached tokens. `goodput` is the share of all requests (errors count as
misses) that are ok and meet both SLOs (an SLO left None is met; a request with
one output token has no TPOT and meets the TPOT SLO); `goodput_rps` is their
number per second of `duration_s`, which defaults to first send -> last end.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvroute.loadgen.record import RequestRecord, as_record
from kvroute.router.decision.routing_loss import LossSample, LossSplit

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _percentiles(prefix: str, values: Sequence[float], qs: Iterable[int] = PERCENTILES) -> dict:
    qs = tuple(qs)
    at = np.percentile(np.asarray(values, dtype=np.float64), qs).tolist() if len(values) else [None] * len(qs)
    return {f"{prefix}_p{q}_s": v for q, v in zip(qs, at)}


def _per_second(count: float, duration_s: float) -> float | None:
    return count / duration_s if duration_s > 0 else None


def meets_slo(record: RequestRecord, slo_ttft_s: float | None, slo_tpot_s: float | None) -> bool:
    if not record.ok or record.ttft_s is None:
        return False
    if slo_ttft_s is not None and record.ttft_s > slo_ttft_s:
        return False
    tpot = record.tpot_s
    return slo_tpot_s is None or tpot is None or tpot <= slo_tpot_s


def _cache(ok: list[RequestRecord]) -> dict:
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    cached = sum(r.cached_tokens or 0 for r in reported)  # reported: not None
    by_tier: collections.Counter = collections.Counter()
    for r in ok:
        if r.cached_tokens_by_tier:
            for tier, n in r.cached_tokens_by_tier.items():
                by_tier[tier] += n
    return {"prompt_tokens": sum(r.prompt_tokens for r in ok), "cached_tokens": cached if reported else None,
            "cached_token_ratio": cached / prompt if prompt else None,
            "cached_tokens_by_tier": dict(by_tier) if by_tier else None}


def routing_loss(ok: Iterable[RequestRecord]) -> dict | None:
    """The routing-loss split of the records that carry its figures."""
    total = LossSplit()
    for r in ok:
        if r.cached_tokens is not None and r.best_cached_tokens is not None and r.predicted_cached_tokens is not None:
            prompt = r.prompt_tokens
            total.add(LossSample(prompt_tokens=prompt, best=min(r.best_cached_tokens, prompt),
                                 predicted=min(r.predicted_cached_tokens, prompt),
                                 served=min(r.cached_tokens, prompt)))
    return total.shares() if total.requests else None


def _instances(ok: list[RequestRecord]) -> dict:
    counts = collections.Counter(r.instance or "unknown" for r in ok)
    ordered = dict(sorted(counts.items()))
    return {"instance_requests": ordered, "instance_share": {k: v / len(ok) for k, v in ordered.items()}}


def summarize(items: Iterable[RequestRecord | Mapping[str, Any]], duration_s: float | None = None,
              slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    """The summary dict of one run (see the module docstring for its fields)."""
    records = [as_record(r) for r in items]
    ok = [r for r in records if r.ok]
    if duration_s is None:
        duration_s = max((r.end_s for r in records), default=0.0) - min((r.send_s for r in records), default=0.0)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    good = sum(meets_slo(r, slo_ttft_s, slo_tpot_s) for r in records)
    errors = collections.Counter(r.error or f"HTTP {r.status}" for r in records if not r.ok)
    lags = [r.send_s - r.planned_s for r in records if r.planned_s is not None]
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(records), "completed": len(ok), "errors": len(records) - len(ok),
        "error_kinds": dict(errors.most_common(5)),
        "duration_s": duration_s, "throughput_rps": _per_second(len(ok), duration_s),
        "output_tok_s": _per_second(output_tokens, duration_s),
        "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None, **_percentiles("ttft", ttfts),
        **_percentiles("tpot", tpots),
        **_percentiles("itl", [g for r in ok for g in r.itl_s], (50, 99)),
        **_percentiles("e2e", [r.e2e_s for r in ok if r.e2e_s is not None]),
        **_cache(ok), "output_tokens": output_tokens,
        "slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s,
        "goodput": good / len(records) if records else None, "goodput_rps": _per_second(good, duration_s),
        **_instances(ok), "send_lag_p99_s": percentile(lags, 99), "routing_loss": routing_loss(ok),
    }


def _fmt(value: Any, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


def format_summary(s: Mapping[str, Any]) -> str:
    """A compact, human-readable table of one summary."""
    lines = [f"requests {s['requests']}  errors {s['errors']}  duration {_fmt(s['duration_s'], ' s', digits=1)}  "
             f"throughput {_fmt(s['throughput_rps'], ' req/s', digits=2)}  "
             f"{_fmt(s['output_tok_s'], ' tok/s', digits=1)}",
             f"{'':6}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for label, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")):
        lines.append(f"{label:6}" + "".join(f"{_fmt(s.get(f'{key}_p{q}_s'), 's'):>10}" for q in PERCENTILES))
    slo = f"TTFT <= {_fmt(s['slo_ttft_s'], 's')}, TPOT <= {_fmt(s['slo_tpot_s'], 's')}"
    lines.append(f"cached tokens {_fmt(s['cached_token_ratio'], '%', 100, 1)}  "
                 f"goodput {_fmt(s['goodput'], '%', 100, 1)} ({_fmt(s['goodput_rps'], ' req/s', digits=2)}; SLO {slo})")
    loss = s.get("routing_loss")
    if loss and "cached" in loss:
        lines.append(f"routing loss (of prompt tokens): cached {loss['cached']:.1%}, lost to the workload "
                     f"{loss['lost_to_workload']:.1%}, to balancing {loss['lost_to_balancing']:.1%}, to the index "
                     f"{loss['lost_to_index']:.1%} ({loss['index_unserved']:.1%} predicted, not served; "
                     f"{loss['index_unpredicted']:.1%} served, not predicted)")
    if s.get("instance_share"):
        lines.append("instances: " + ", ".join(f"{k} {v:.0%}" for k, v in s["instance_share"].items()))
    for message, count in (s.get("error_kinds") or {}).items():
        lines.append(f"error x{count}: {message}")
    return "\n".join(lines)
