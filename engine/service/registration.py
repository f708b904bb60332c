"""An engine's entry in the fleet registry (router/contract/registry_record.py): register, refresh, leave.

The record is refreshed every `refresh_s` under a key that expires after `ttl_s`, so an
engine that dies without a word (kill -9) lapses within the TTL and routers treat it like
one that stopped answering. Every record written is new (its `ts` and `nonce`) and, with the
fleet secret, signed here; the "leave" announces a record whose state is "left", so that only a
leave the engine signed can drop it, and routers refuse any record older than the newest they
believed (router/fleet/registry_trust.py). A Redis that is unreachable costs a log line per outage and
nothing else: the engine keeps serving, and re-registers when Redis is back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kvroute.router.contract.registry_record import CHANNEL, IDS, LEFT, EngineRecord, announcement, engine_key

log = logging.getLogger(__name__)


class Registration:
    def __init__(self, url: str, record: Callable[[], EngineRecord], refresh_s: float = 1.0,
                 ttl_s: float = 3.0, secret: str | None = None) -> None:
        """`record`: the engine's record now, unsigned (a new one each call); `secret`: the fleet
        secret that signs what is written (None: unsigned)."""
        if not 0 < refresh_s < ttl_s:
            raise ValueError("the registry refresh interval must be positive and shorter than the TTL")
        self.client = aioredis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.record, self.secret = record, secret
        self.refresh_s, self.ttl_ms = refresh_s, int(ttl_s * 1000)
        self.left = False
        self._task: asyncio.Task | None = None
        self._outage = False

    async def start(self) -> None:
        await self._write("join")
        self._task = asyncio.create_task(self._run(), name="registry-refresh")

    async def _run(self) -> None:
        while not self.left:
            await asyncio.sleep(self.refresh_s)
            if not self.left:
                await self._write(None)

    async def _write(self, announce: str | None) -> bool:
        record = self.record().signed(self.secret)
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(engine_key(record.instance_id), record.to_json(), px=self.ttl_ms)
                pipe.sadd(IDS, record.instance_id)
                if announce:
                    pipe.publish(CHANNEL, announcement(announce, record))
                await pipe.execute()
        except (RedisError, OSError) as e:
            if not self._outage:
                log.warning("fleet registry unreachable (%s); serving on, re-registering when it is back", e)
            self._outage = True
            return False
        if self._outage:
            log.info("fleet registry reachable again: registered as %s at %s", record.instance_id, record.url)
        self._outage = False
        return True

    async def changed(self, kind: str = "role") -> None:
        """Announce a change (a role switch) now, not at the next refresh."""
        if not self.left:
            await self._write(kind)

    async def leave(self) -> None:
        """Deregister at once (a drain): routers stop sending before the engine refuses anything."""
        if self.left:
            return
        self.left = True
        record = dataclasses.replace(self.record(), state=LEFT).signed(self.secret)
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(engine_key(record.instance_id))
                pipe.srem(IDS, record.instance_id)
                pipe.publish(CHANNEL, announcement("leave", record))
                await pipe.execute()
        except (RedisError, OSError) as e:
            log.warning("could not deregister from the fleet registry (%s); the entry lapses by itself", e)

    async def stop(self) -> None:
        await self.leave()
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.client.aclose()
