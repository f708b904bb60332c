"""Keep the block index in step with each engine's KV events.

Two transports feed one `EventSync`: long-polling each engine's GET /kv/events
(`PollFollower`, default) or reading the engines' Redis stream (`RedisFollower`).
Events are applied strictly in `seq` order per instance and `epoch`; a gap, a new
epoch or a resync marker reloads that instance from GET /kv/snapshot instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import aiohttp
import orjson

from kvroute.router.contract.cancellation import raise_if_cancelled
from kvroute.router.contract.protocol import REDIS_EVENT_STREAM, TIERS, KVEvent, LoadRecord
from kvroute.router.fleet.cluster import Cluster, answered_late
from kvroute.router.fleet.instance import Instance
from kvroute.router.index.base import IndexUnavailable, event_owner

log = logging.getLogger(__name__)


class EventSync:
    """Applies one instance's events to the index in order, or reloads it from a snapshot.

    Two levels of ordering: this replica skips events it has applied and resyncs on a hole
    in its own feed; the index itself (router/index/base.py) orders the writes of every
    replica sharing it, so a late or duplicate write from any of them changes nothing.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.index = cluster.index
        self.metrics = cluster.metrics

    async def resync(self, inst: Instance) -> None:
        await self.load_snapshot(inst, await self.cluster.engine_http.feed(inst.url, "/kv/snapshot"))

    async def load_snapshot(self, inst: Instance, snap: dict) -> None:
        """Replace the instance's entries with a GET /kv/snapshot body (a generation swap:
        readers never see a half-loaded instance; a snapshot older than what the index
        already holds, written by another replica, changes nothing). Blocks of a shared
        store go to the store's owner, unordered (index/base.py: event_owner)."""
        try:
            epoch, seq = int(snap["epoch"]), int(snap["seq"])
            tiers = {tier: [int(b) for b in blocks] for tier, blocks in (snap.get("tiers") or {}).items()
                     if tier in TIERS and blocks}
            store = snap.get("store")
            store = str(store) if store else None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed /kv/snapshot: {e!r}") from None
        shared = tiers.pop("remote", None) if store else None
        replaced = await self.index.replace(inst.id, epoch, seq, tiers)
        if shared:
            await self.index.add(event_owner(inst.id, "remote", store), "remote", shared)
        inst.epoch, inst.seq = epoch, seq
        inst.blocks_indexed = sum(len(b) for b in tiers.values())
        inst.needs_resync = False
        inst.resyncs += 1
        self.metrics.resyncs.inc()
        log.info("resynced %s from snapshot: %d blocks at epoch %d seq %d%s", inst.id, inst.blocks_indexed, epoch,
                 seq, "" if replaced else " (the shared index was already there)")

    async def apply(self, inst: Instance, events: list[KVEvent]) -> None:
        """Apply in-order events; flag a resync on a gap or another epoch."""
        for event in events:
            if inst.epoch is not None and (event.epoch, event.seq) <= (inst.epoch, inst.seq):
                continue  # already applied (both snapshot and stream carried it), or from an older epoch
            if event.epoch != inst.epoch or event.seq != inst.seq + 1:
                log.warning("%s: event gap (epoch %s seq %d after epoch %s seq %d); resyncing", inst.id,
                            event.epoch, event.seq, inst.epoch, inst.seq)
                inst.needs_resync = True
                return
            result = await self.index.apply(event)
            if result == "gap":  # the shared index misses an event nobody applied: reload
                log.warning("%s: the index refused seq %d as out of order; resyncing", inst.id, event.seq)
                inst.needs_resync = True
                return
            inst.seq = event.seq
            if not (event.tier == "remote" and event.store):  # a shared store's blocks are not the instance's
                inst.blocks_indexed += len(event.blocks) if event.type == "stored" else -len(event.blocks)
            if event.type == "cleared":
                inst.blocks_indexed = 0
            self.metrics.events.labels(event.type if result == "applied" else "duplicate").inc()
        inst.blocks_indexed = max(inst.blocks_indexed, 0)
        if events:
            inst.last_event_time = time.time()

    async def step(self, inst: Instance, coro) -> None:
        """Run one follower step for `inst`, turning failures into health reports and resyncs."""
        try:
            if inst.needs_resync:
                await self.resync(inst)
            else:
                await coro()
        except IndexUnavailable as e:
            log.warning("index unavailable while syncing %s: %s", inst.id, e)
            self.metrics.errors.labels("index").inc()
            inst.needs_resync = True  # events were lost: reload once the index is back
            await asyncio.sleep(1.0)
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError) as e:
            self.cluster.report_failure(inst, f"event feed failed: {e!r}", slow=answered_late(e))
            await asyncio.sleep(0.5)


class PollFollower:
    """Long-polls GET /kv/events of every routable instance: one task per instance, started
    when it joins the fleet and cancelled when it leaves."""

    def __init__(self, sync: EventSync) -> None:
        self.sync = sync
        self.cluster = sync.cluster
        self.tasks: dict[Instance, asyncio.Task] = {}

    async def run(self) -> None:
        try:
            while True:
                current = set(self.cluster.instances)
                for inst in current - self.tasks.keys():
                    self.tasks[inst] = asyncio.create_task(self._follow(inst), name=f"events-{inst.url}")
                for inst in self.tasks.keys() - current:
                    self.tasks.pop(inst).cancel()
                await asyncio.sleep(0.1)
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def _follow(self, inst: Instance) -> None:
        while not inst.removed:
            if not inst.routable or not inst.follows_engine_feed:
                await asyncio.sleep(0.1)
                continue
            await self.sync.step(inst, lambda: self._poll(inst))

    async def _poll(self, inst: Instance) -> None:
        timeout = self.cluster.config.events_timeout_s
        params = {"since": inst.seq, "timeout": timeout}
        if inst.epoch is not None:
            params["epoch"] = inst.epoch
        data = await self.cluster.engine_http.feed(inst.url, "/kv/events", params, wait_s=timeout)
        if data.get("load"):
            load = LoadRecord.from_dict(data["load"])
            self.cluster.observe_load(inst, load)
            self.sync.metrics.event_lag.observe(max(0.0, time.time() - load.ts))
        if data.get("resync") or data.get("epoch") != inst.epoch:
            inst.needs_resync = True
            return
        await self.sync.apply(inst, [KVEvent.from_dict(e) for e in data.get("events") or ()])


class RedisFollower:
    """Reads every engine's events from one Redis stream (engines started with --redis)."""

    def __init__(self, sync: EventSync, url: str, stream: str = REDIS_EVENT_STREAM) -> None:
        import redis.asyncio as aioredis

        self.sync = sync
        self.cluster = sync.cluster
        self.client = aioredis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=2.0)
        self.stream = stream

    async def run(self) -> None:
        from redis.exceptions import RedisError

        last_id = "$"
        while True:
            for inst in list(self.cluster.instances):
                if inst.routable and inst.needs_resync and inst.follows_engine_feed:
                    await self.sync.step(inst, _noop)
            try:
                # RESP2, the client's protocol: [[stream, [(id, fields), ...]], ...], or None on timeout
                reply = cast(list[list[Any]] | None,
                             await self.client.xread({self.stream: last_id}, count=1000, block=500))
                raise_if_cancelled()
            except (RedisError, OSError) as e:
                log.warning("redis event stream unavailable: %s", e)
                self.sync.metrics.errors.labels("redis_stream").inc()
                for inst in self.cluster.instances:
                    inst.needs_resync = True
                await asyncio.sleep(1.0)
                continue
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    last_id = entry_id
                    await self._handle(orjson.loads(fields[b"data"]))

    async def _handle(self, entry: dict) -> None:
        inst = self.cluster.by_id(entry.get("instance", ""))
        if inst is None or not inst.routable or not inst.follows_engine_feed:
            return
        if entry.get("load"):
            load = LoadRecord.from_dict(entry["load"])
            self.cluster.observe_load(inst, load)
            self.sync.metrics.event_lag.observe(max(0.0, time.time() - load.ts))
        events = [KVEvent.from_dict(e) for e in entry.get("events") or ()]
        await self.sync.step(inst, lambda: self.sync.apply(inst, events))

    async def close(self) -> None:
        await self.client.aclose()


async def _noop() -> None:
    return None
