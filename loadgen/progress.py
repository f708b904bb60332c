"""A one-line progress bar on stderr: done/total, errors, elapsed, TTFT p50 of recent requests.

On a terminal the line is redrawn in place a few times a second; otherwise (a log
file) a new line is written every few seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np

from kvroute.loadgen.record import RequestRecord

_WIDTH = 24
_RECENT = 200  # TTFT p50 over the last this many requests


class Progress:
    def __init__(self, stream=None, interval_s: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (0.25 if self.is_tty else 5.0)
        self.total = 0
        self.done = 0
        self.errors = 0
        self.ttfts: list[float] = []
        self.t0 = time.perf_counter()
        self._task: asyncio.Task | None = None

    def start(self, total: int) -> None:
        self.total, self.t0 = total, time.perf_counter()
        self._task = asyncio.ensure_future(self._tick())

    def add(self, record: RequestRecord) -> None:
        self.done += 1
        if not record.ok:
            self.errors += 1
        elif record.ttft_s is not None:
            self.ttfts.append(record.ttft_s)

    def line(self) -> str:
        filled = int(_WIDTH * self.done / self.total) if self.total else 0
        recent = self.ttfts[-_RECENT:]
        ttft = f"{float(np.median(recent)):.3f}s" if recent else "-"
        return (f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {self.done}/{self.total} "
                f"errors {self.errors}  {time.perf_counter() - self.t0:6.1f}s  ttft p50 {ttft}")

    def draw(self, end: str = "") -> None:
        if self.is_tty:
            self.stream.write("\r" + self.line() + end)
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    async def _tick(self) -> None:
        while True:
            self.draw()
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            self.draw("\n")
