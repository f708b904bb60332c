"""Append the engine's KV events (with its load) to a Redis stream, `router.contract.protocol.REDIS_EVENT_STREAM`.

Each stream entry has one field `data`: JSON `{"instance", "events": [...], "load": {...}}`.
Events are batched per flush; while Redis is unreachable they queue up to a bound and
are then dropped (a router that sees the resulting `seq` gap resyncs from /kv/snapshot).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kvroute.engine.core.kv_events import KVEventLog
from kvroute.router.contract.cancellation import raise_if_cancelled
from kvroute.router.contract.protocol import REDIS_EVENT_STREAM, KVEvent, LoadRecord

log = logging.getLogger(__name__)

STREAM_MAXLEN = 100_000
MAX_QUEUED = 50_000


class RedisEventPublisher:
    """Follows one engine's event log; each stream entry carries the engine's load at the time (`load`)."""

    def __init__(self, url: str, *, events: KVEventLog, load: Callable[[], LoadRecord],
                 stream: str = REDIS_EVENT_STREAM) -> None:
        self.client = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.events = events
        self.load = load
        self.stream = stream
        self.queue: list[KVEvent] = []
        self.dropped = 0
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None

    def _on_event(self, event: KVEvent) -> None:
        if len(self.queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        self.queue.append(event)
        self._ready.set()

    async def start(self) -> None:
        self.events.listeners.append(self._on_event)
        # Anything stored before we subscribed (the startup "cleared") is re-sent from the log.
        self.queue.extend(self.events.read(0).events)
        self._ready.set()
        self._task = asyncio.create_task(self._run(), name="redis-event-publisher")

    async def stop(self) -> None:
        self.events.listeners.remove(self._on_event)
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self.client.aclose()

    async def flush(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until every queued event is in the stream: a draining engine's last words."""
        for _ in range(int(timeout_s / 0.05)):
            if not self.queue:
                return
            await asyncio.sleep(0.05)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            await self._ready.wait()
            self._ready.clear()
            batch, self.queue = self.queue, []
            if not batch:
                continue
            entry = {"instance": self.events.instance, "events": [e.to_dict() for e in batch],
                     "load": self.load().to_dict()}
            try:
                await self.client.xadd(self.stream, {"data": orjson.dumps(entry)}, maxlen=STREAM_MAXLEN,
                                       approximate=True)
                raise_if_cancelled()  # redis-py on Python 3.11 may have swallowed it
                backoff = 0.1
            except (RedisError, OSError) as e:
                log.warning("redis event publish failed (%s); retrying in %.1fs", e, backoff)
                self.queue[:0] = batch
                self._ready.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
