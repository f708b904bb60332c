"""Tokenizing off the event loop, in a bounded pool shared by every request of a process.

Short prompts (under `inline_chars`) are tokenized in place: a thread hop costs more
than they do. So are prompts under `idle_inline_chars` when the caller says nothing
else is in flight (and no job is in the pool): blocking the loop then holds up nobody
already here, and the hop's two thread wake-ups are saved. `python tools/bench_router.py
decision` times both, alternating (the never-seen rows, in place and through the pool).
A request that arrives meanwhile waits at most that one encode (~10 ms at the default
64k characters). Longer ones, and any long one while others are in flight, run
on `workers` threads (the Rust tokenizer releases the GIL), with at most `max_queued`
jobs waiting; past that the caller gets Overloaded (503 + Retry-After) instead of an
ever longer queue. A job that has not started when its request is cancelled (the
client left) is dropped without running; one already running finishes, bounded by the
prompt-character limit checked before it was queued.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Callable, TypeVar

from router.contract.errors import Overloaded

T = TypeVar("T")


class TokenizePool:
    def __init__(self, workers: int = 2, max_queued: int = 64, inline_chars: int = 4096,
                 idle_inline_chars: int = 65536) -> None:
        if workers < 1 or max_queued < 1 or inline_chars < 0 or idle_inline_chars < 0:
            raise ValueError("tokenize pool: workers and max_queued must be >= 1, inline_chars and "
                             "idle_inline_chars >= 0")
        self.workers = workers
        self.max_queued = max_queued
        self.inline_chars = inline_chars
        self.idle_inline_chars = idle_inline_chars
        self.pending = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")

    async def run(self, fn: Callable[..., T], *args, chars: int, idle: Callable[[], bool] | None = None) -> T:
        """`fn(*args)`, which encodes `chars` characters; `idle()`: nothing else is in flight here."""
        if chars < self.inline_chars or (chars < self.idle_inline_chars and not self.pending
                                         and idle is not None and idle()):
            return fn(*args)
        if self.pending >= self.max_queued + self.workers:
            raise Overloaded(f"tokenizer pool is full ({self.pending} long prompts in progress)", retry_after=1)
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
