"""One line of the chaos table: one kind of traffic during one scenario."""

from __future__ import annotations

import dataclasses

from kvroute.loadgen.chaos.rss import MB, Memory


@dataclasses.dataclass(kw_only=True)
class Row:
    scenario: str
    traffic: str  # "background load", "fuzz -> router0", "1000 streams -> router0", ...
    sent: int
    ok: int  # load: complete answers; fuzz: answered as the case expects
    lost: int | None = None  # ended before the first byte (load rows)
    broken: int | None = None  # streams cut after they started (load rows)
    statuses: dict = dataclasses.field(default_factory=dict)
    five_xx: int = 0
    failovers: int | None = None
    retries: int | None = None  # requests the routers retried on another engine (load rows)
    eject_s: float | None = None
    resync_s: float | None = None
    p50_ms: float | None = None  # TTFT (load) or time to answer (fuzz)
    p99_ms: float | None = None
    memory: dict[str, Memory] = dataclasses.field(default_factory=dict)
    detail: dict = dataclasses.field(default_factory=dict)

    def memory_of(self, prefix: str) -> str:
        mems = [m for name, m in self.memory.items() if name.startswith(prefix)]
        if not mems:
            return "-"
        return "/".join(f"{max(getattr(m, k) for m in mems) / MB:.0f}" for k in ("before", "peak", "after"))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["memory_mb"] = {name: m.to_mb() for name, m in self.memory.items()}
        del d["memory"]
        return d


COLUMNS = ("scenario", "traffic", "sent", "ok", "lost before first byte", "broken streams", "errors by status",
           "5xx", "router retries", "failovers", "eject s", "resync s", "TTFT (fuzz: answer) p50 / p99 ms",
           "router RSS MB before/peak/after", "engine RSS MB before/peak/after")


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:.2f}"


def _statuses(row: Row) -> str:
    errors = {k: v for k, v in sorted(row.statuses.items()) if k != "200" or "fuzz" in row.traffic}
    return ", ".join(f"{k}: {v:,}" for k, v in errors.items()) or "-"


def cells(row: Row) -> list[str]:
    latency = "-" if row.p50_ms is None else f"{row.p50_ms:.0f} / {row.p99_ms:.0f}"
    counts = [_num(v) for v in (row.sent, row.ok, row.lost, row.broken)]
    tail = [_num(v) for v in (row.five_xx, row.retries, row.failovers, row.eject_s, row.resync_s)]
    return [row.scenario, row.traffic, *counts, _statuses(row), *tail, latency, row.memory_of("router"),
            row.memory_of("e")]


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(lines)
