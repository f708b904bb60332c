"""Feed the block index from engines' ZeroMQ KV events, one `InstanceFeed` per instance.

A feed waits until its instance is discovered (the model decides the router's hash seed,
and the router block size the chain), then runs one `Subscriber` per endpoint and maps
every decoded event through the instance's `BlockMap` onto index operations. Those are
applied as ordinary `KVEvent`s (`BlockIndex.apply`), numbered by the feed with an epoch that
changes on every rebuild. They go to the router's replica-local index for ZeroMQ-fed
instances (router/index/split.py), never to a shared Redis index: replicas number their
feeds independently, so only one writer per index may own an instance's (epoch, seq).

The cluster's health loop flags `needs_resync` when an instance was down long enough to
have its entries cleared (the feed then forgets what it knew and rebuilds from a replay
from seq 0, as far as the publisher's buffer reaches, and the live stream) or when it is
re-admitted (nothing to do: the stream's own sequence numbers tell whether events were
lost). A lost index write (Redis unreachable) rebuilds too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

import zmq.asyncio

from kvroute.router.contract.kv_wire import Batch
from kvroute.router.contract.protocol import EventType, KVEvent, Tier, hash_seed, new_epoch
from kvroute.router.fleet.instance import Instance
from kvroute.router.index.base import IndexUnavailable
from kvroute.router.kvevents.metrics import ZmqMetrics
from kvroute.router.kvevents.sources import EventSource
from kvroute.router.kvevents.subscriber import SourceStats, Subscriber
from kvroute.router.kvevents.translate import BlockMap

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.1
STALL_S = 10.0  # a subscriber whose poll loop has not turned for this long is stalled: restart its feed
RESTART_MIN_S, RESTART_MAX_S = 0.1, 5.0  # backoff between restarts of a feed that keeps failing
HEALTHY_RUN_S = 60.0  # a feed that ran this long before it failed starts its backoff over
CAP_FACTOR = 4  # engine blocks kept per instance: this many times what it advertises


def restart_delay(last_s: float | None, ran_s: float) -> float:
    """The wait before restarting a feed that failed after running `ran_s` seconds; `last_s` is the
    wait before its previous restart (None: it never failed). Doubles while the feed keeps failing
    fast, up to RESTART_MAX_S; a feed that ran HEALTHY_RUN_S first is treated as failing anew."""
    if last_s is None or ran_s >= HEALTHY_RUN_S:
        return RESTART_MIN_S
    return min(last_s * 2, RESTART_MAX_S)


class InstanceFeed:
    """One instance's ZeroMQ event sources, its engine-hash map, and what reached the index."""

    def __init__(self, inst: Instance, index, sources: Sequence[EventSource], ctx: zmq.asyncio.Context,
                 topic: str, replay_timeout_s: float, metrics: ZmqMetrics, max_engine_blocks: int) -> None:
        self.inst = inst
        self.max_engine_blocks = max_engine_blocks
        self.index = index
        self.metrics = metrics
        self.subscribers = [Subscriber(ctx, s.endpoint, s.replay_endpoint, topic, self, replay_timeout_s)
                            for s in sources]
        self.block_map = BlockMap(0, 1)  # replaced once the instance is discovered
        self.keys: tuple[str, int] | None = None  # (model, router block size) the map was built for
        self.epoch = new_epoch()
        self.seq = 0
        self.rebuilds: list[dict] = []
        self.restarts = 0  # times the supervisor restarted this feed (it died or stalled)
        self.stale: str | None = None  # why the feed is down; its instance is routed on load alone meanwhile
        self._lost = False  # index writes failed: rebuild once the index is back

    @property
    def instance_id(self) -> str:
        return self.inst.id

    def source_stats(self) -> list[SourceStats]:
        return [sub.stats for sub in self.subscribers]

    async def run(self) -> None:
        while self.inst.info is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
        self._new_map()
        for sub in self.subscribers:
            sub.forget()
            sub.stats.heartbeat = 0.0  # not polling yet: not stalled
        await self._begin()
        self.inst.needs_resync = False
        self.mark_stale(None)
        await asyncio.gather(self._watch(), *(sub.run() for sub in self.subscribers))

    def stalled(self, now: float) -> bool:
        """A subscriber loop started (discovery done) but has not polled for STALL_S."""
        return self.keys is not None and any(0 < s.heartbeat < now - STALL_S for s in self.source_stats())

    def mark_stale(self, reason: str | None) -> None:
        self.stale = reason
        self.inst.feed_stale = reason

    async def _begin(self) -> None:
        """A fresh, empty feed position (epoch, 0) in the index: what comes next is in order."""
        self.epoch, self.seq = new_epoch(), 0
        await self.index.replace(self.inst.id, self.epoch, 0, {})

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            info = self.inst.info
            if info is not None and (info.model, info.block_size) != self.keys:
                await self.resync(f"model or block size changed to {info.model!r}/{info.block_size}")
            elif self._lost:
                await self.resync("index writes were lost")
            elif self.inst.needs_resync:
                if self.inst.blocks_indexed or not len(self.block_map):
                    self.inst.needs_resync = False  # re-admitted: the stream's own seq says if anything was lost
                else:
                    await self.resync("the instance's index entries were cleared while it was down")

    async def resync(self, reason: str) -> None:
        """Forget everything and rebuild from a replay from seq 0 and the live stream."""
        self._lost = False
        await self.on_reset(reason)
        for sub in self.subscribers:
            sub.forget()
        self.inst.needs_resync = False

    # -- BatchSink --------------------------------------------------------------------

    def cap(self) -> int:
        """Engine blocks this instance may have in the map: CAP_FACTOR x the blocks it advertises
        (its KV pool from discovery, or its load reports), else the configured cap."""
        inst = self.inst
        advertised = inst.kind_state.get("num_blocks") or (inst.load.kv_total_blocks if inst.load else 0)
        return CAP_FACTOR * advertised if advertised else self.max_engine_blocks

    async def on_batch(self, seq: int, batch: Batch) -> None:
        cap = self.block_map.max_nodes = self.cap()
        evicted = self.block_map.counts["overflow_evicted"]
        try:
            for event in batch.events:
                for kind, tier, hashes in self.block_map.apply(event):
                    await self._apply(kind, tier, hashes)
        except IndexUnavailable as e:
            log.warning("index unavailable while applying %s's KV events (%s); rebuilding", self.inst.id, e)
            self._lost = True
            return
        if not evicted and self.block_map.counts["overflow_evicted"]:
            log.warning("instance %s stores more blocks than it can hold (cap %d engine blocks): its oldest "
                        "entries are dropped, see kvroute_router_zmq_blocks{outcome=\"overflow_evicted\"}",
                        self.inst.id, cap)
        now = time.time()
        self.metrics.lag.observe(max(0.0, now - batch.ts))
        self.inst.last_event_time = now

    async def on_reset(self, reason: str) -> None:
        self.rebuilds = (self.rebuilds + [{"reason": reason, "at": time.time()}])[-5:]
        self._new_map()
        self.inst.blocks_indexed = 0
        try:
            await self._begin()
        except IndexUnavailable:
            self._lost = True
        log.warning("instance %s: KV index cleared, rebuilding from new events (%s)", self.inst.id, reason)

    # -- internals --------------------------------------------------------------------

    def _new_map(self) -> None:
        info = self.inst.info
        if info is not None:
            self.keys = (info.model, info.block_size)
            self.block_map = BlockMap(hash_seed(info.model), info.block_size, self.cap(), key_rule=info.key_rule)

    async def _apply(self, kind: EventType, tier: Tier, hashes: list[int]) -> None:
        self.seq += 1
        result = await self.index.apply(KVEvent(instance=self.inst.id, epoch=self.epoch, seq=self.seq, type=kind,
                                                tier=tier, blocks=tuple(hashes)))
        if result != "applied":
            raise IndexUnavailable(f"the index refused the feed's seq {self.seq} ({result})")
        if kind == "cleared":
            self.inst.blocks_indexed = 0
        else:
            self.inst.blocks_indexed = max(0, self.inst.blocks_indexed + (len(hashes) if kind == "stored"
                                                                           else -len(hashes)))

    def to_dict(self) -> dict:
        bmap = self.block_map
        return {
            "transport": "zmq",
            "state": ("stale" if self.stale else "waiting for discovery" if self.keys is None
                      else "rebuilt" if self.rebuilds else "live"),
            "stale": self.stale,
            "restarts": self.restarts,
            "router_block_size": self.keys[1] if self.keys else None,
            "engine_block_size": bmap.engine_block_size,
            "engine_blocks": len(bmap),
            "blocks": dict(bmap.counts),
            "unknown_media": dict(bmap.unknown_media),
            "rebuilds": sum(s.rebuilds for s in self.source_stats()),
            "last_rebuilds": list(self.rebuilds),
            "sources": [s.to_dict() for s in self.source_stats()],
        }


class ZmqFollower:
    """Every instance with ZeroMQ event sources gets a feed: those given by flags at start, and
    those that join later (the admin API, the registry) through `add`."""

    def __init__(self, instances: Sequence[Instance], index, sources: Mapping[str, Sequence[EventSource]],
                 topic: str, replay_timeout_s: float, registry, max_engine_blocks: int = 1 << 20) -> None:
        self.ctx = zmq.asyncio.Context()
        self.feeds: list[InstanceFeed] = []
        self.metrics = ZmqMetrics(registry, self.feeds)
        self.index, self.topic, self.replay_timeout_s = index, topic, replay_timeout_s
        self.max_engine_blocks = max_engine_blocks
        self.tasks: dict[InstanceFeed, asyncio.Task] = {}
        self.running = False
        for inst in instances:
            if inst.url in sources:
                self.add(inst, sources[inst.url])

    def add(self, inst: Instance, sources: Sequence[EventSource]) -> None:
        feed = InstanceFeed(inst, self.index, sources, self.ctx, self.topic, self.replay_timeout_s, self.metrics,
                            self.max_engine_blocks)
        inst.kv_feed = feed
        self.feeds.append(feed)
        if self.running:
            self._start(feed)

    def _start(self, feed: InstanceFeed) -> None:
        self.tasks[feed] = asyncio.create_task(self._supervise(feed), name=f"zmq-feed-{feed.inst.url}")

    async def _supervise(self, feed: InstanceFeed) -> None:
        """Run a feed for as long as it is wanted: one that dies or stalls is marked stale (its
        instance is routed on load alone), then restarted from an empty index after a backoff."""
        delay = None
        while True:
            started = time.monotonic()
            task = asyncio.create_task(feed.run(), name=f"zmq-feed-run-{feed.inst.url}")
            try:
                while not task.done():
                    await asyncio.wait({task}, timeout=1.0)
                    if not task.done() and feed.stalled(time.monotonic()):
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                        reason = f"stalled: no poll for {STALL_S:.0f}s"
                        break
                else:
                    exc = task.exception()
                    reason = f"died: {exc!r}"[:300] if exc is not None else "ended"
            finally:
                if not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            feed.restarts += 1
            feed.mark_stale(reason)
            delay = restart_delay(delay, time.monotonic() - started)
            log.warning("KV event feed of %s %s; routing it on load alone and restarting in %.1fs",
                      feed.inst.id, reason, delay)
            await asyncio.sleep(delay)

    def remove(self, inst: Instance) -> None:
        feed = inst.kv_feed
        if feed is None:
            return
        if feed in self.tasks:
            self.tasks.pop(feed).cancel()
        if feed in self.feeds:
            self.feeds.remove(feed)
        inst.kv_feed = None

    async def run(self) -> None:
        self.running = True
        for feed in self.feeds:
            self._start(feed)
        try:
            while True:
                for feed in [f for f in self.feeds if f.inst.removed]:
                    self.remove(feed.inst)
                await asyncio.sleep(1.0)
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def close(self) -> None:
        self.ctx.destroy(linger=0)
