"""Resident memory of the fleet's processes, per scenario: before, peak and after.

`VmRSS` is the resident set now, `VmHWM` its high-water mark (from /proc/PID/status).
At a scenario's start each process's high-water mark is reset (writing 5 to
/proc/PID/clear_refs, Linux >= 4.0), so the peak is that scenario's own; where the reset
is not allowed the peak is the largest `VmRSS` sampled (every `interval_s`). A process
restarted during a scenario counts with the larger of its old and new peaks.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable

MB = 1 << 20


def read_memory(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes, or None if the process is gone."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, kb = line.split()[:2]
                    values[key] = int(kb) * 1024
    except OSError:
        return None
    if "VmRSS:" not in values:
        return None
    return values["VmRSS:"], values.get("VmHWM:", values["VmRSS:"])


def reset_peak(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclasses.dataclass
class Memory:
    before: int = 0
    peak: int = 0
    after: int = 0

    def to_mb(self) -> dict:
        return {k: round(v / MB, 1) for k, v in dataclasses.asdict(self).items()}


class RssWatch:
    """Samples every process `pids()` names (name -> pid) while a scenario runs."""

    def __init__(self, pids: Callable[[], Iterable[tuple[str, int]]], interval_s: float = 0.2) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.memory: dict[str, Memory] = {}
        self._task: asyncio.Task | None = None

    def begin(self) -> None:
        self.memory = {}
        for name, pid in self.pids():
            reading = read_memory(pid)
            if reading is not None:
                reset_peak(pid)
                self.memory[name] = Memory(before=reading[0], peak=reading[0])
        self._task = asyncio.ensure_future(self._sample_loop())

    def sample(self) -> None:
        for name, pid in self.pids():
            reading = read_memory(pid)
            if reading is None:
                continue
            mem = self.memory.setdefault(name, Memory(before=reading[0]))
            mem.peak = max(mem.peak, *reading)
            mem.after = reading[0]

    async def _sample_loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    async def end(self) -> dict[str, Memory]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.sample()
        return self.memory
