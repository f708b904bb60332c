"""Markdown for the benchmarks page: number cells, tables, and one renderer per kind of JSON.

Every renderer takes the parsed JSON an entry's command wrote and returns Markdown; none
reads anything else, so the page shows only what the commands produced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Renderer = Callable[[Any], str]


def num(value: Any, scale: float = 1.0, digits: int | None = None, unit: str = "") -> str:
    """One cell: '-' for nothing, ints with thousands separators, floats to `digits` (or 4 significant)."""
    if value is None or isinstance(value, (dict, list)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if scale != 1:
        value = value * scale
    if isinstance(value, int) and digits is None:
        return f"{value:,}{unit}"
    if digits is None:
        digits = 0 if abs(value) >= 1000 else None
    return (f"{value:,.{digits}f}" if digits is not None else f"{value:.4g}") + unit


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def generic(data: Any, depth: int = 0) -> str:
    """Any JSON as tables: scalars as key/value rows, a list or dict of flat records as one table each."""
    if _scalar(data):
        return num(data)
    if isinstance(data, list):
        records = [r for r in data if isinstance(r, dict)]
        if not records:
            return ", ".join(num(v) for v in data[:20])
        keys = list(dict.fromkeys(k for r in records for k, v in r.items() if _scalar(v)))[:12]
        return table(keys, [[num(r.get(k)) for k in keys] for r in records])
    parts, flat = [], [(k, v) for k, v in data.items() if _scalar(v)]
    named = {k: v for k, v in data.items() if isinstance(v, dict) and any(map(_scalar, v.values()))}
    if flat:
        parts.append(table(["measure", "value"], [[k, num(v)] for k, v in flat]))
    if named:  # nested values inside a record (per-run lists) are left to the JSON
        keys = list(dict.fromkeys(k for r in named.values() for k, v in r.items() if _scalar(v)))[:12]
        parts.append(table(["", *keys], [[name, *(num(r.get(k)) for k in keys)] for name, r in named.items()]))
    for key, value in data.items():
        if not _scalar(value) and key not in named and depth < 3:
            parts.append(f"**{key}**\n\n{generic(value, depth + 1)}")
    return "\n\n".join(parts)


def _ms(value: Any) -> str:
    return num(value, 1e3, 1, " ms")


def _pct(value: Any) -> str:
    return num(value, 100, 1, "%")


def sim(out: Mapping[str, Any]) -> str:
    """One `kvroute sim --out` file: a row per policy, relative to the oracle where it ran."""
    rel = out.get("relative_to_oracle") or {}
    rows = []
    for name, r in (out.get("results") or {}).items():
        o = rel.get(name) or {}
        rows.append([name, _ms(r.get("ttft_p50_s")), _ms(r.get("ttft_p90_s")), _ms(r.get("ttft_p99_s")),
                     _pct(r.get("cached_token_ratio")), num(o.get("cached_token_ratio"), digits=3),
                     num(o.get("ttft_p90"), digits=2), num(r.get("decision_us_p50"), digits=0),
                     num(r.get("decision_us_p99"), digits=0), num(r.get("engine_step_us_mean"), digits=0),
                     num(r.get("sim_wall_s"), digits=1)])
    head = ["policy", "TTFT p50", "TTFT p90", "TTFT p99", "cached", "cached / oracle", "p90 / oracle",
            "decision us p50", "decision us p99", "engine step us / request", "sim wall s"]
    return table(head, rows)


def suite(out: Mapping[str, Any]) -> str:
    """`kvroute sim --suite --out`: per row the oracle's figures, every other policy's relative to them."""
    policies = [p for p in out.get("policies", []) if p != "oracle"]
    head = ["row", "oracle TTFT p90", "oracle cached", *(f"{p} p90 / cached vs oracle" for p in policies)]
    rows = []
    for case in out.get("cases", []):
        oracle, rel = case.get("results", {}).get("oracle", {}), case.get("relative_to_oracle") or {}
        cells = [f"{num((rel.get(p) or {}).get('ttft_p90'), digits=2)} / "
                 f"{num((rel.get(p) or {}).get('cached_token_ratio'), digits=3)}" for p in policies]
        rows.append([case.get("case"), _ms(oracle.get("ttft_p90_s")), _pct(oracle.get("cached_token_ratio")), *cells])
    lines = [table(head, rows)]
    t = out.get("targets") or {}
    if t.get("policy"):
        missed = t.get("missed") or []
        lines.append(f"{t['policy']} meets TTFT p90 <= {t.get('ttft_p90')}x and cached >= "
                     f"{t.get('cached_token_ratio')}x the oracle's on {len(t.get('met') or [])} of "
                     f"{len(t.get('met') or []) + len(missed)} rows" + (f" (missed: {', '.join(missed)})." if missed
                                                                          else "."))
    for name, beaten in (out.get("oracle_beaten_by") or {}).items():
        lines.append(f"{name} beats the oracle on: {', '.join(beaten) or 'no row'}.")
    lines += [f"Skipped: {s}" for s in out.get("skipped") or []]
    return "\n\n".join(lines)


def bench(runs: Sequence[Mapping[str, Any]]) -> str:
    """`kvroute bench`'s results.json: one row per run, TTFT p90 against the first run's."""
    base = runs[0].get("ttft_p90_s") if runs else None
    rows = [[r.get("name"), num(r.get("requests")), num(r.get("errors")), _ms(r.get("ttft_p50_s")),
             _ms(r.get("ttft_p90_s")), _ms(r.get("ttft_p99_s")), _ms(r.get("tpot_p50_s")),
             _pct(r.get("cached_token_ratio")),
             num(r["ttft_p90_s"] / base, digits=2) if base and r.get("ttft_p90_s") is not None else "-"]
            for r in runs]
    head = ["run", "requests", "errors", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "cached",
            f"p90 / {runs[0].get('name') if runs else 'first'}"]
    return table(head, rows)


def decision(out: Mapping[str, Any]) -> str:
    """kvroute.benchmarks.router decision: the router's prepare + decide per case, in process."""
    times = ("median_ms", "p99_ms", "prepare_median_ms", "decide_median_ms", "after_send_median_ms",
             "own_median_ms", "over_tokenizer_median_ms")
    rows = [[r.get("scenario"), r.get("index"), num(r.get("instances")), num(r.get("prompt_tokens")),
             *(num(r.get(k), digits=3) for k in times)] for r in out.get("decision", [])]
    head = ["case", "index", "instances", "prompt tokens", "median ms", "p99 ms", "prepare ms", "decide ms",
            "of which after the send, ms", "outside the tokenizer, ms", "over the tokenizer alone, ms"]
    return table(head, rows)


def latency(out: Mapping[str, Any]) -> str:
    """kvroute.benchmarks.router latency: per router, added latency at c=1 and throughput and CPU at c=N."""
    rows = [[r.get("target"), num(r.get("added_p50_us"), digits=0), num(r.get("added_p99_us"), digits=0),
             num(r.get("rps_c32"), digits=0), num(r.get("cpu_us_per_request_c32"), digits=0)]
            for r in out.get("latency", [])]
    c = out.get("concurrency", 32)
    head = ["router", "added p50 at c=1, us", "added p99 at c=1, us", f"req/s at c={c}",
            f"CPU per request at c={c}, us"]
    return table(head, rows)


def gateway(out: Mapping[str, Any]) -> str:
    """python -m kvroute.benchmarks.gateway: per router and workload, req/s, added p50, CPU per request by process."""
    rows = [[r.get("router"), r.get("workload"), num(r.get("rps"), digits=0), num(r.get("added_p50_us"), digits=0),
             num(r.get("cpu_us_per_request_total"), digits=0),
             ", ".join(f"{k} {num(v, digits=0)}" for k, v in r.get("cpu_us_per_request", {}).items()),
             num(r.get("cpu_us_per_request_less_idle_total"), digits=0)] for r in out.get("rows", [])]
    c = out.get("concurrency", 32)
    head = ["router", "workload", f"req/s at c={c}", "added p50 at c=1, us", "CPU per request, us",
            "by process, us", "less idle CPU, us"]
    return table(head, rows)


def instructions(out: Mapping[str, Any]) -> str:
    """kvroute.benchmarks.router instructions: user-space instructions per request by router variant."""
    rows = [[r.get("router"), num(r.get("instructions_per_request"), 1e-6, 3)] for r in out.get("instructions", [])]
    return table(["router", "million instructions per request"], rows)


def chaos(out: Mapping[str, Any]) -> str:
    """`kvroute chaos --out`'s results.json: a row per scenario and traffic, then the invariants."""
    rows = [[r.get("scenario"), r.get("traffic"), num(r.get("sent")), num(r.get("ok")), num(r.get("lost")),
             num(r.get("broken")), num(r.get("five_xx")), num(r.get("retries")), num(r.get("eject_s"), digits=2),
             num(r.get("resync_s"), digits=2),
             f"{num(r.get('p50_ms'), digits=0)} / {num(r.get('p99_ms'), digits=0)}"] for r in out.get("rows", [])]
    head = ["scenario", "traffic", "sent", "ok", "lost before first byte", "broken streams", "5xx", "router retries",
            "eject s", "resync s", "p50 / p99 ms"]
    violations = out.get("violations") or []
    held = "Every invariant held." if out.get("invariants_ok") else f"{len(violations)} invariant(s) broken."
    details = [f"- {r['scenario']}, {r['traffic']}: " + ", ".join(f"{k} {_brief(v)}" for k, v in r["detail"].items())
               for r in out.get("rows", []) if r.get("detail") and r.get("traffic") != "background load"]
    extra = "\n\n" + "\n".join(details) if details else ""
    return table(head, rows) + f"\n\n{held} Run time {num(out.get('seconds'))} s." + extra


def adapters(out: Mapping[str, Any]) -> str:
    """kvroute.benchmarks.adapters: a row per part, setup and policy; cached share and its ratio to no adapters."""
    rows = [[r.get("part"), r.get("setup"), r.get("policy"), num(r.get("requests")), _pct(r.get("cached_share")),
             num(r.get("vs_none"), digits=3), num(r.get("ttft_p50_ms"), digits=1, unit=" ms"),
             num(r.get("ttft_p90_ms"), digits=1, unit=" ms")] for r in out.get("rows", [])]
    head = ["part", "setup", "policy", "requests", "cached", "cached / none", "TTFT p50", "TTFT p90"]
    return table(head, rows) + f"\n\nAdapters: {', '.join(out.get('adapters') or [])}."


def _brief(value: Any) -> str:
    """A detail value in a line: numbers as they are, mappings of numbers inline, the rest left out."""
    if isinstance(value, (int, float)) or value is None:
        return str(value)
    if isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return "(see results.json)"
