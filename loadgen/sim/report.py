"""The simulator's comparison: one row per policy, and each policy against the oracle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvroute.router.decision.routing_loss import CAUSES, gap_by_cause

ORACLE = "oracle"

COLUMNS = (  # (header, summary key, scale, digits)
    ("requests", "requests", 1, 0),
    ("errors", "errors", 1, 0),
    ("ttft p50 ms", "ttft_p50_s", 1e3, 1),
    ("ttft p90 ms", "ttft_p90_s", 1e3, 1),
    ("ttft p99 ms", "ttft_p99_s", 1e3, 1),
    ("tpot p50 ms", "tpot_p50_s", 1e3, 2),
    ("cached %", "cached_token_ratio", 100, 1),
    ("instances used", "instances_used", 1, 0),
    ("goodput %", "goodput", 100, 1),
    ("decide us", "decision_us_mean", 1, 1),
    ("decide p99 us", "decision_us_p99", 1, 1),
    ("step us", "engine_step_us_mean", 1, 1),
    ("candidates", "candidates_mean", 1, 1),
    ("index entries", "index_entries", 1, 0),
    ("wall s", "sim_wall_s", 1, 1),
)


DERIVED = {"instances_used": lambda s: len(s["instance_requests"]) if s.get("instance_requests") else None}


def _value(s: Mapping[str, Any], key: str) -> Any:
    return DERIVED[key](s) if key in DERIVED else s.get(key)


def relative_to_oracle(results: Mapping[str, Mapping[str, Any]]) -> dict | None:
    """Per policy: its cached-token share and TTFT p90 divided by the oracle's (None without an oracle)."""
    oracle = results.get(ORACLE)
    if oracle is None:
        return None
    out = {}
    for name, s in results.items():
        out[name] = {
            "cached_token_ratio": _ratio(s.get("cached_token_ratio"), oracle.get("cached_token_ratio")),
            "ttft_p90": _ratio(s.get("ttft_p90_s"), oracle.get("ttft_p90_s")),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell(value: Any, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def format_table(out: Mapping[str, Any]) -> str:
    """A plain-text table of `cli.run`'s output."""
    results, rel = out["results"], out.get("relative_to_oracle")
    headers = ["policy", *(h for h, *_ in COLUMNS)]
    if rel:
        headers += ["cached / oracle", "ttft p90 / oracle"]
    rows = []
    for name, s in results.items():
        row = [name, *(_cell(_value(s, key), scale, digits) for _, key, scale, digits in COLUMNS)]
        if rel:
            row += [_cell(rel[name]["cached_token_ratio"], 1, 3), _cell(rel[name]["ttft_p90"], 1, 3)]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        f"{out['config']['instances']} instances, {out['workload'].get('workload')}, {out['arrival']}, "
        f"cost model {out['config']['cost_model']}, event delay {out['config']['event_delay_s']:g} s",
        "  ".join(h.rjust(w) for h, w in zip(headers, widths)),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    note = oracle_note(results, out["config"]["instances"])
    if note:
        lines.append(note)
    lines += loss_lines(results)
    for name, s in results.items():
        for message, count in (s.get("error_kinds") or {}).items():
            lines.append(f"{name}: error x{count}: {message}")
        if s.get("tiers"):
            lines.append(f"{name}: {format_tiers(s)}")
    return "\n".join(lines)


def loss_lines(results: Mapping[str, Mapping[str, Any]], reference: str = ORACLE) -> list[str]:
    """Each policy's routing-loss split (router/decision/routing_loss.py), and how its cached share falls
    short of `reference`'s by cause (the differences of their losses, which add up to the gap)."""
    lines = []
    ref = (results.get(reference) or {}).get("routing_loss") or {}
    for name, s in results.items():
        loss = s.get("routing_loss") or {}
        if "cached" not in loss:
            continue
        lines.append(f"{name}: cached {loss['cached']:.1%}; lost to the workload {loss['lost_to_workload']:.1%}, "
                     f"to balancing {loss['lost_to_balancing']:.1%}, to the index {loss['lost_to_index']:+.1%}")
        gap = gap_by_cause(loss, ref) if name != reference else None
        if gap is not None:
            parts = sum(gap[c] for c in CAUSES)
            lines.append(f"  gap to {reference} {gap['gap']:+.1%} = " + " ".join(
                f"{c} {gap[c]:+.1%}" for c in CAUSES) + f" (sum {parts:+.1%})")
    return lines


def oracle_note(results: Mapping[str, Mapping[str, Any]], instances: int) -> str | None:
    """Why the oracle's TTFT p90 can be above another policy's, when it is (docs/loadgen.md#the-oracle-and-the-tail).

    The oracle gives each request the lowest TTFT it can have when it arrives (its prediction is exact),
    so it never pays a cold prefill to copy a prefix to another instance: it keeps sending a prefix's
    requests to the instances that hold it, and their bigger batches slow every later request there a
    little (a higher p50 and p90, and TPOT) where a spreading policy slows a few requests a lot (p99)."""
    oracle = results.get(ORACLE) or {}
    p90 = oracle.get("ttft_p90_s")
    lower = {n: s["ttft_p90_s"] for n, s in results.items()
             if n != ORACLE and p90 is not None and s.get("ttft_p90_s") is not None and s["ttft_p90_s"] < p90}
    if p90 is None or not lower:
        return None
    below = ", ".join(f"{n}'s {v * 1e3:.1f} ms" for n, v in lower.items())
    busiest = max((oracle.get("instance_share") or {0: 0.0}).values())
    return (f"note: the oracle's TTFT p90 ({p90 * 1e3:.1f} ms) is above {below}: it minimises each request's "
            f"own TTFT on arrival, so it never pays a cold prefill to spread a prefix; it served from "
            f"{_value(oracle, 'instances_used')} of {instances} instances, the busiest taking {busiest:.1%} of the "
            f"requests (an even share: {1 / instances:.1%}), whose bigger batches slow later requests a little "
            f"instead of a few a lot: compare the p99 column (docs/loadgen.md, the oracle and the tail)")


def format_suite(out: Mapping[str, Any]) -> str:
    """`kvroute sim --suite`'s table: per row, the oracle's figures and every policy's relative to them."""
    policies = [p for p in out["policies"] if p != ORACLE]
    headers = ["case", "oracle p90 ms", "oracle cached %"]
    for name in policies:
        headers += [f"{name} cached/o", f"{name} p90/o"]
    rows = []
    for case in out["cases"]:
        oracle, rel = case["results"].get(ORACLE, {}), case["relative_to_oracle"] or {}
        row = [case["case"], _cell(oracle.get("ttft_p90_s"), 1e3, 1), _cell(oracle.get("cached_token_ratio"), 100, 1)]
        for name in policies:
            r = rel.get(name, {})
            row += [_cell(r.get("cached_token_ratio"), 1, 3), _cell(r.get("ttft_p90"), 1, 2)]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    config = out["config"]
    lines = [f"{config['instances']} instances x {config['num_blocks']} blocks, cost model {config['cost_model']}, "
             f"request overhead {config['request_overhead_s'] * 1e3:g} ms; every policy with its defaults",
             "  ".join(h.rjust(w) for h, w in zip(headers, widths)),
             *("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows),
             *out.get("skipped", ())]
    t = out.get("targets")
    if t and ORACLE in out["policies"] and t["policy"] in out["policies"]:
        lines.append(f"{t['policy']}: p90 <= {t['ttft_p90']:g}x and cached >= {t['cached_token_ratio']:g}x the "
                     f"oracle's on {len(t['met'])} of {len(t['met']) + len(t['missed'])} rows"
                     + (f"; missed: {', '.join(t['missed'])}" if t["missed"] else ""))
    for name, beaten in (out.get("oracle_beaten_by") or {}).items():
        if name in out["policies"] and ORACLE in out["policies"]:
            lines.append(f"{name} beats the oracle on: {', '.join(beaten) or 'no row'}")
    return "\n".join(lines + suite_gaps(out))


def suite_gaps(out: Mapping[str, Any], policy: str = "kv_aware", reference: str = "oracle_future") -> list[str]:
    """Per row, `policy`'s cached share short of `reference`'s, by cause (routing_loss.gap_by_cause)."""
    lines = []
    for case in out["cases"]:
        results = case["results"]
        mine, ref = (results.get(policy) or {}).get("routing_loss"), (results.get(reference) or {}).get("routing_loss")
        gap = gap_by_cause(mine or {}, ref or {})
        if gap is not None:
            lines.append(f"{case['case']}: {policy} {gap['gap']:+.1%} of prompt tokens cached short of {reference}: "
                         + ", ".join(f"{c} {gap[c]:+.1%}" for c in CAUSES))
    return [f"where {policy}'s cache falls short of {reference}'s, by cause of loss:", *lines] if lines else []
def format_tiers(s: Mapping[str, Any]) -> str:
    """One line: cached tokens by tier, recoveries by choice, bytes and GB/s per direction."""
    t = s["tiers"]
    cached = ", ".join(f"{k} {v}" for k, v in (s.get("cached_tokens_by_tier") or {}).items())
    runs = ", ".join(f"{k} {v}" for k, v in sorted(t["recoveries"].items())) or "none"
    moved = ", ".join(f"{d} {b / 1e9:.2f} GB" + (f" @ {t['gb_per_s'][d]:.1f} GB/s" if t["gb_per_s"][d] else "")
                      for d, b in t["bytes"].items() if b)
    return f"cached tokens by tier: {cached or '-'}; recoveries (runs): {runs}; moved: {moved or 'nothing'}"
