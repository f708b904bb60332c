"""Draining an engine: SIGTERM (or POST /admin/drain) ends it without losing a request.

    1. deregister from the fleet registry and say "draining" in /health (503, so readiness
       probes fail), /load and /kv/info: routers stop sending at once;
    2. refuse new requests with 503 + Retry-After (a router retries those elsewhere, before
       anything reached its client);
    3. let running requests finish, for up to `drain_timeout_s`, then end the rest;
    4. flush the KV event publisher, give event long-polls a moment to read the last events,
       and ask the server to stop (exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

log = logging.getLogger(__name__)

FLUSH_S = 0.3  # long-polling routers pick up the last events in this time


class Drainable(Protocol):
    """The engine as a drain sees it: a flag it sets, the requests it waits for, a way to end one."""

    draining: bool

    @property
    def requests(self) -> Mapping: ...

    def fail_request(self, seq, message: str, /) -> None: ...


async def _nothing() -> None:
    return None


class Drain:
    """`deregister` (leave the fleet registry) and `flush` (the KV event publisher's) are the server's
    steps 1 and 4; each does nothing where the engine has no registry or no publisher."""

    def __init__(self, engine: Drainable, timeout_s: float, shutdown: asyncio.Event, *,
                 deregister: Callable[[], Awaitable[None]] = _nothing,
                 flush: Callable[[], Awaitable[None]] = _nothing) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.shutdown = shutdown
        self.deregister = deregister
        self.flush = flush
        self.task: asyncio.Task | None = None
        self.started_at: float | None = None
        self.leftover = 0

    @property
    def active(self) -> bool:
        return self.task is not None

    def start(self, why: str) -> None:
        if self.task is not None:
            return
        log.warning("draining (%s): %d requests running, up to %.0fs to finish", why, len(self.engine.requests),
                    self.timeout_s)
        self.engine.draining = True
        self.started_at = time.monotonic()
        self.task = asyncio.create_task(self._run(), name="drain")

    async def _run(self) -> None:
        assert self.started_at is not None  # start() set it before making this task
        await self.deregister()  # first: routers stop sending
        deadline = time.monotonic() + self.timeout_s
        while self.engine.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.leftover = len(self.engine.requests)
        if self.leftover:
            log.warning("drain timeout: ending %d requests still running", self.leftover)
            for handle in list(self.engine.requests.values()):
                self.engine.fail_request(handle.seq, "engine shut down before the request finished")
        await self.flush()
        await asyncio.sleep(FLUSH_S)
        log.warning("drained in %.1fs; stopping", time.monotonic() - self.started_at)
        self.shutdown.set()
