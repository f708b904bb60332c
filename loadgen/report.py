"""Write what runs measured: one run's files (`write_run`) and a comparison of runs (`write_report`).

    write_run(out_dir, summary, records)      -> requests.jsonl, summary.json
    write_report(out_dir, runs)               -> results.json, results.md, ttft_cdf.png,
                                                 ttft_over_time.png, requests_per_instance.png

A run is a `Run(name, summary, records)`, a (name, summary, records) tuple or a
dict with those keys; records are RequestRecord objects or their dicts.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from kvroute.loadgen.plots import PLOTS
from kvroute.loadgen.record import RequestRecord, as_record

_JSON = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
COLUMNS = (  # (header, summary key, scale, digits, unit)
    ("requests", "requests", 1, 0, ""), ("errors", "errors", 1, 0, ""),
    ("TTFT p50", "ttft_p50_s", 1000, 0, " ms"), ("TTFT p90", "ttft_p90_s", 1000, 0, " ms"),
    ("TTFT p99", "ttft_p99_s", 1000, 0, " ms"), ("TPOT p50", "tpot_p50_s", 1000, 1, " ms"),
    ("E2E p50", "e2e_p50_s", 1, 3, " s"), ("cached", "cached_token_ratio", 100, 1, "%"),
    ("goodput", "goodput", 100, 1, "%"), ("req/s", "throughput_rps", 1, 2, ""), ("tok/s", "output_tok_s", 1, 0, ""),
)


@dataclasses.dataclass
class Run:
    name: str
    summary: dict
    records: Sequence[RequestRecord | Mapping[str, Any]] = ()


def _as_run(run: Run | tuple | Mapping) -> Run:
    if isinstance(run, Run):
        return run
    if isinstance(run, Mapping):
        return Run(name=run["name"], summary=run["summary"], records=run.get("records", ()))
    return Run(*run)


def write_run(out_dir: str | pathlib.Path, summary: Mapping, records: Sequence) -> None:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.jsonl", "wb") as f:
        for r in records:
            f.write(orjson.dumps(as_record(r).to_dict()) + b"\n")
    (out / "summary.json").write_bytes(orjson.dumps(dict(summary), option=_JSON))


def _cell(summary: Mapping, key: str, scale: float, digits: int, unit: str) -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


RATE_COLUMNS = ("req/s", "tok/s")  # set by the schedule, not measured, when arrivals are open loop


def _columns(runs: Sequence[Run]) -> tuple[list[tuple], list[str]]:
    """The columns worth a column, and notes on the others: with several runs, a column whose
    cells are equal in every run becomes one "same in every run" note; with open-loop arrivals
    the throughput columns only restate the arrival rate and are left out."""
    columns, notes = list(COLUMNS), []
    if runs and all(r.summary.get("arrival_mode") in ("open", "fixed") for r in runs):
        columns = [c for c in columns if c[0] not in RATE_COLUMNS]
        notes.append(f"{' and '.join(RATE_COLUMNS)} are left out: with open-loop arrivals they restate the "
                     f"arrival rate ({runs[0].summary.get('arrival', '?')}); see results.json.")
    if len(runs) > 1:
        kept, same = [], []
        for c in columns:
            cells = {_cell(r.summary, *c[1:]) for r in runs}
            if len(cells) > 1:
                kept.append(c)
            elif cells != {"-"}:  # a column nothing measured goes without a note
                same.append(f"{c[0]} {cells.pop()}")
        columns = kept
        if same:
            notes.insert(0, "Same in every run: " + ", ".join(same) + ".")
    return columns, notes


def markdown_table(runs: Sequence[Run]) -> str:
    runs = [_as_run(r) for r in runs]
    columns, notes = _columns(runs)
    lines = ["| run | " + " | ".join(c[0] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for run in runs:
        lines.append(f"| {run.name} | " + " | ".join(_cell(run.summary, *c[1:]) for c in columns) + " |")
    if notes:
        lines += [""] + notes
    return "\n".join(lines)


def _markdown(runs: Sequence[Run]) -> str:
    parts = ["# Results", "", markdown_table(runs), ""]
    slo = runs[0].summary if runs else {}
    if slo.get("slo_ttft_s") is not None or slo.get("slo_tpot_s") is not None:
        parts += [f"Goodput SLOs: TTFT <= {slo.get('slo_ttft_s')} s, TPOT <= {slo.get('slo_tpot_s')} s.", ""]
    for run in runs:
        share = run.summary.get("instance_share") or {}
        if share:
            parts.append(f"- {run.name}: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()))
    infos = [(r.name, orjson.dumps(r.summary["workload_info"]).decode()) for r in runs
             if r.summary.get("workload_info")]
    if infos and len({info for _, info in infos}) == 1:
        parts += ["", f"Workload: `{infos[0][1]}`"]
    elif infos:
        parts += ["", "Workloads:", ""] + [f"- {name}: `{info}`" for name, info in infos]
    return "\n".join(parts).rstrip() + "\n"


def verdict(runs: Sequence[Run], *, subject: str | None = None, baseline: str | None = None) -> str | None:
    """One line: the subject run's TTFT p90 against the baseline run's (and its p99 when that points the other
    way: better at p90 but worse at p99, or the reverse), and every run's cached-token share.

    `subject` and `baseline` name runs; left out, they are the last run and the first.
    """
    runs = [_as_run(r) for r in runs]
    by_name = {r.name: r for r in runs}
    if len(runs) < 2 or (subject or runs[-1].name) not in by_name or (baseline or runs[0].name) not in by_name:
        return None
    base, best = by_name[baseline or runs[0].name], by_name[subject or runs[-1].name]
    if base is best:
        return None
    b, c = base.summary.get("ttft_p90_s"), best.summary.get("ttft_p90_s")
    if not b or c is None:
        return None
    cached = ", ".join(f"{r.name} {_cell(r.summary, 'cached_token_ratio', 100, 0, '%')}" for r in runs)
    return (f"{best.name}'s TTFT p90 is {c / b:.2f}x {base.name}'s ({c * 1000:.0f} ms vs {b * 1000:.0f} ms)"
            f"{_p99_against(best, base, c > b)}; cached tokens: {cached}")


def _p99_against(subject: Run, baseline: Run, worse_at_p90: bool) -> str:
    """", but its TTFT p99 is ..." when the subject's p99 compares with the baseline's the other way
    from its p90 (a tail the p90 hides); "" when they agree or a p99 is missing."""
    b, c = baseline.summary.get("ttft_p99_s"), subject.summary.get("ttft_p99_s")
    if not b or c is None or c == b or (c > b) == worse_at_p90:
        return ""
    return f", but its TTFT p99 is {c / b:.2f}x ({c * 1000:.0f} ms vs {b * 1000:.0f} ms)"


def write_report(out_dir: str | pathlib.Path, items: Sequence[Run | tuple | Mapping]) -> dict[str, pathlib.Path]:
    """Write results.json, results.md and the PNG plots under out_dir; return {file name: path}."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = [_as_run(r) for r in items]
    written = {"results.json": out / "results.json", "results.md": out / "results.md"}
    written["results.json"].write_bytes(orjson.dumps([{"name": r.name, **r.summary} for r in runs], option=_JSON))
    written["results.md"].write_text(_markdown(runs), encoding="utf-8")
    named = [(r.name, [as_record(x) for x in r.records]) for r in runs]
    for file_name, plot in PLOTS.items():
        written[file_name] = out / file_name
        plot(named, written[file_name])
    return written
