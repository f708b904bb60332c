"""The deadlines of the proxy's attempts in flight, on one timer for them all.

An attempt (router/service/proxy.py) is bounded as `asyncio.timeout` would bound it: when its
deadline passes, the task running it is cancelled and the attempt's `with` block raises
TimeoutError (a cancel from anyone else, a client that left, stays a CancelledError). A
non-streamed attempt is also watched for progress: once the engine has not been seen moving for
`patience_s` (no load report at all: stopped; reports whose progress counter stands still while it
holds work: a hung step loop; router/fleet/progress.py) it ends at once, `silent_s` and `silence`
saying why, instead of at its deadline.

`asyncio.timeout` makes and cancels a timer per attempt, and the silence watch made a second one;
here one timer serves every attempt in flight. Starting an attempt adds it to a set and moves the
timer only when this attempt is due before it (attempts of equal length started later are due
later: almost never); the timer, when it fires, ends the attempts that are due and re-arms for
the next one that is due, found in one pass over those in flight. An attempt that ends leaves the
set and nothing else: the timer may then fire with nothing to do, at most once per attempt length.
"""

from __future__ import annotations

import asyncio
import math
import time


class Deadline:
    """One attempt's deadline, a sync context manager around the attempt's awaits (the task that
    enters it is the one cancelled). `silent_s` is set when the progress watch ended it, and `silence`
    says what was missing ("no load report", "no progress")."""

    __slots__ = ("owner", "task", "cancelling", "when", "inst", "patience_s", "due", "expired", "silent_s",
                 "silence")

    def __init__(self, owner: Deadlines, when: float, inst, patience_s: float) -> None:
        self.owner, self.when, self.inst, self.patience_s = owner, when, inst, patience_s
        self.task: asyncio.Task | None = None
        self.cancelling = 0
        self.due = when  # loop time of the next look at this attempt
        self.expired = False
        self.silent_s: float | None = None
        self.silence = ""

    def __enter__(self) -> Deadline:
        task = self.task = asyncio.current_task()
        assert task is not None  # a deadline is entered inside the attempt's task
        self.cancelling = task.cancelling()
        self.owner._add(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.owner._live.discard(self)
        assert self.task is not None  # set by __enter__
        if self.expired and self.task.uncancel() <= self.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def _look(self, now: float) -> bool:
        """True when it ends now (the task is cancelled); else `due` is moved to the next look."""
        if now < self.when and self.inst is not None:
            inst, clock = self.inst, time.monotonic()
            silent = clock - inst.progress_seen
            if silent < self.patience_s:
                self.due = min(self.when, now + self.patience_s - silent)
                return False
            self.silent_s = silent
            self.silence = "no load report" if clock - inst.load_seen >= self.patience_s else "no progress"
        elif now < self.when:
            self.due = self.when
            return False
        self.expired = True
        assert self.task is not None  # only entered deadlines are looked at (__enter__ adds them)
        self.task.cancel()
        return True


class Deadlines:
    """The attempts in flight on one event loop, and the one timer that ends them."""

    def __init__(self) -> None:
        self._live: set[Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._armed = math.inf  # loop time the timer fires at

    def __len__(self) -> int:
        return len(self._live)

    def start(self, wait_s: float, inst=None, patience_s: float = math.inf) -> Deadline:
        """A deadline `wait_s` from now; with `inst`, also ended after `patience_s` without seeing it
        move (`inst.progress_seen`, time.monotonic()). Enter it (`with`) to start it."""
        now = asyncio.get_running_loop().time()
        deadline = Deadline(self, now + wait_s, inst, patience_s)
        if inst is not None and patience_s < wait_s:
            deadline.due = now + patience_s
        return deadline

    def _add(self, deadline: Deadline) -> None:
        self._live.add(deadline)
        if deadline.due < self._armed:
            self._arm(deadline.due)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        # at least the time it was armed for: a timer may fire a hair early by the loop's clock
        # (uvloop's is in milliseconds), and must not then find nothing due and fire again
        now = max(asyncio.get_running_loop().time(), self._armed)
        self._timer, self._armed = None, math.inf
        if not self._live:
            return
        ended = [d for d in self._live if d.due <= now and d._look(now)]
        for deadline in ended:
            self._live.discard(deadline)  # its task leaves the `with` later; nothing more to look at
        if self._live:
            self._arm(min(d.due for d in self._live))
