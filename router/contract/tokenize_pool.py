"""Tokenizing off the event loop, in a bounded pool shared fairly by the tenants of a process.

Short prompts (under `inline_chars`) are tokenized in place: a thread hop costs more
than they do. So are prompts under `idle_inline_chars` when the caller says nothing
else is in flight (and no job is in the pool): blocking the loop then holds up nobody
already here, and the hop's two thread wake-ups are saved. `python -m kvroute.benchmarks.router
decision` times both, alternating (the never-seen rows, in place and through the pool).
A request that arrives meanwhile waits at most that one encode (~10 ms at the default
64k characters).

Longer ones, and any long one while others are in flight, run on `workers` threads (the
Rust tokenizer releases the GIL). A job that finds every thread busy waits in its tenant's
own queue, at most `max_queued` jobs per tenant; past that the tenant gets Overloaded (503 +
Retry-After) instead of an ever longer queue, and other tenants are not refused for it. A
free thread takes the waiting job with the lowest start tag (start-time fair queueing by
characters: a job's start is the later of the pool's virtual time and its tenant's last
finish, its finish that plus its characters; the virtual time is the start of the job last
begun), so the tenants share the threads' time by characters encoded: one tenant's flood of
huge prompts holds up another's prompt by about one job per thread, never by its whole queue.
A job that has not started when its request is cancelled (the client left) is dropped
without running; one already running finishes, bounded by the prompt-character limit checked
before it was queued, and holds its thread until it does.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import TypeVar

from kvroute.router.contract.errors import Overloaded

T = TypeVar("T")
FORGET_AFTER = 4096  # tenants' last finishes kept before those behind the virtual time are dropped


@dataclasses.dataclass(eq=False, slots=True)
class _Waiting:
    tenant: str
    start: float
    go: asyncio.Future


class TokenizePool:
    def __init__(self, workers: int = 2, max_queued: int = 64, inline_chars: int = 4096,
                 idle_inline_chars: int = 65536) -> None:
        if workers < 1 or max_queued < 1 or inline_chars < 0 or idle_inline_chars < 0:
            raise ValueError("tokenize pool: workers and max_queued must be >= 1, inline_chars and "
                             "idle_inline_chars >= 0")
        self.workers = workers
        self.max_queued = max_queued  # per tenant
        self.inline_chars = inline_chars
        self.idle_inline_chars = idle_inline_chars
        self.pending = 0  # long prompts waiting or being encoded, every tenant's
        self.running = 0  # threads given a job
        self._waiting: dict[str, collections.deque[_Waiting]] = {}
        self._finish: dict[str, float] = {}  # tenant -> the finish tag of its last job
        self._vtime = 0.0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")

    def waiting(self, tenant: str) -> int:
        queue = self._waiting.get(tenant)
        return len(queue) if queue is not None else 0

    async def run(self, fn: Callable[..., T], *args, chars: int, idle: Callable[[], bool] | None = None,
                  tenant: str = "") -> T:
        """`fn(*args)`, which encodes `chars` characters of `tenant`'s; `idle()`: nothing else is in flight here."""
        if chars < self.inline_chars or (chars < self.idle_inline_chars and not self.pending
                                         and idle is not None and idle()):
            return fn(*args)
        if self.waiting(tenant) >= self.max_queued:
            raise Overloaded(f"tokenizer pool is full ({self.max_queued} long prompts of this tenant waiting)",
                             retry_after=1)
        start = self._tag(tenant, chars)
        loop = asyncio.get_running_loop()
        self.pending += 1
        try:
            if self.running < self.workers and not self._waiting:
                self._begin(start)
            else:
                await self._turn(tenant, start)
            job = self._executor.submit(fn, *args)
        except BaseException:
            self.pending -= 1
            raise
        job.add_done_callback(lambda _: _call_soon(loop, self._finished))
        return await asyncio.wrap_future(job)

    def _tag(self, tenant: str, chars: int) -> float:
        """The job's start tag; its tenant's last finish moves on by `chars`."""
        if len(self._finish) > FORGET_AFTER:
            self._finish = {t: f for t, f in self._finish.items() if f > self._vtime or t in self._waiting}
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + chars
        return start

    def _begin(self, start: float) -> None:
        self.running += 1
        self._vtime = max(self._vtime, start)

    async def _turn(self, tenant: str, start: float) -> None:
        """Wait until a thread is given to this job (`_next`); cancelled, it leaves its queue."""
        entry = _Waiting(tenant=tenant, start=start, go=asyncio.get_running_loop().create_future())
        self._waiting.setdefault(tenant, collections.deque()).append(entry)
        try:
            await entry.go
        except BaseException:
            if entry.go.done() and not entry.go.cancelled():  # given a thread, then cancelled: pass it on
                self.running -= 1
                self._next()
            else:
                self._leave(entry)
            raise

    def _leave(self, entry: _Waiting) -> None:
        queue = self._waiting.get(entry.tenant)
        if queue is not None and entry in queue:
            queue.remove(entry)
            if not queue:
                del self._waiting[entry.tenant]

    def _next(self) -> None:
        """Give free threads to the waiting jobs with the lowest start tags."""
        while self.running < self.workers and self._waiting:
            tenant = min(self._waiting, key=lambda t: self._waiting[t][0].start)
            entry = self._waiting[tenant].popleft()
            if not self._waiting[tenant]:
                del self._waiting[tenant]
            self._begin(entry.start)
            entry.go.set_result(None)

    def _finished(self) -> None:
        self.running -= 1
        self.pending -= 1
        self._next()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """`callback` on `loop`, from a worker thread; nothing once the loop is closed (shutdown)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass
