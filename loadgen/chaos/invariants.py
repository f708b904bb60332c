"""Invariants checked on every row, and on the processes' logs, after each scenario
(scenario-specific ones, such as `ejected` or `no-ssrf`, are checked by the scenario).

    no-loss-before-first-byte   a load row lost no request (an engine was always healthy)
    accounted                   every request of a load row ended as ok, lost or broken
    no-5xx-for-bad-input        a fuzz row got no 5xx
    fuzz-memory                 a fuzzed process's peak RSS grew at most --rss-growth-mb
    no-traceback                no process logged a traceback or an ERROR line
    no-crash                    no process exited that the run did not stop itself

Scenarios check their own: ejected, resynced (the faulted part left routing and came back
within --wait-s), fuzz-answers, fuzz-bounded-time, no-ssrf, streams-complete,
clean-shutdown; the runner adds scenario-finished (a restarted part never answered).
"""

from __future__ import annotations

import os
import re

from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.rss import MB
from kvroute.loadgen.chaos.scenario_base import Violation

_ALARM = re.compile(rb"Traceback \(most recent call last\)|\bERROR\b")


def check_rows(rows: list[Row], rss_growth_mb: float) -> list[Violation]:
    out = []
    for row in rows:
        where = f"{row.scenario}, {row.traffic}"
        if row.lost:
            out.append(Violation("no-loss-before-first-byte", where,
                                 f"{row.lost} of {row.sent} requests lost: {row.detail.get('examples', [])[:3]}"))
        if row.lost is not None and row.broken is not None and row.ok + row.lost + row.broken != row.sent:
            out.append(Violation("accounted", where, f"{row.sent} sent but {row.ok} ok + {row.lost} lost + "
                                                     f"{row.broken} broken (still in flight after the drain?)"))
        if row.traffic.startswith("fuzz"):
            if row.five_xx:
                out.append(Violation("no-5xx-for-bad-input", where, f"{row.five_xx} answers were 5xx"))
            for name, mem in row.memory.items():
                grown = (mem.peak - mem.before) / MB
                if grown > rss_growth_mb:
                    out.append(Violation("fuzz-memory", where, f"{name} peak RSS grew {grown:.0f} MB "
                                                               f"(limit {rss_growth_mb:g} MB)"))
    return out


class LogWatch:
    """Reads what each process logged since the last look."""

    def __init__(self, procs: list[Proc]) -> None:
        self.procs = [p for p in procs if p.name != "redis"]
        self.offsets = {p.log_path: 0 for p in self.procs}
        self.crashed: set[str] = set()

    def check(self, scenario: str) -> list[Violation]:
        out = []
        for proc in self.procs:
            text = self._new_text(proc.log_path)
            match = _ALARM.search(text)
            if match:
                out.append(Violation("no-traceback", scenario,
                                     f"{proc.name} logged {excerpt(text, match.start())} (see {proc.log_path})"))
            code = proc.died()
            if code is not None and proc.name not in self.crashed:
                self.crashed.add(proc.name)
                out.append(Violation("no-crash", scenario, f"{proc.name} exited with code {code}"))
        return out

    def _new_text(self, path: str) -> bytes:
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                f.seek(self.offsets[path])
                text = f.read(size - self.offsets[path])
        except OSError:
            return b""
        self.offsets[path] = size
        return text


def excerpt(text: bytes, at: int) -> str:
    """The log line at `at`, and, when a traceback follows, its exception line."""
    lines = text[text.rfind(b"\n", 0, at) + 1:].decode(errors="replace").splitlines()[:60]
    tb = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if tb is None:
        return repr(lines[0][:300])
    cause = next((line for line in lines[tb + 1:] if line and not line[0].isspace()), "")
    return f"{lines[0][:200]!r} ... {cause[:300]!r}"
