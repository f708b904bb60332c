"""The write queue to the shared store: blocks read out of the device or the host pool, written off the TTFT path.

`queue` takes a block's payload (or drops it, counted, when the store is down or the queue holds
`MAX_QUEUED_WRITE_BYTES`); one task (`run`) drains the queue into `put_many` calls of at most
`WRITE_CHUNK_BYTES`, each entry encoded with its header (engine/kv/store/entry.py). A write that
fails is dropped (counted) and forgotten by the tiers, so the block may be written again later;
`on_written(hashes, seconds)` hears of each call that succeeded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kvroute.engine.core.kv_copies import StoredBlock
from kvroute.engine.kv.store.base import StoreUnavailable
from kvroute.engine.kv.store.entry import encode
from kvroute.engine.kv.store.guard import GuardedStore
from kvroute.engine.kv.tier_metrics import TierMetrics
from kvroute.engine.kv.tiers import CacheTiers

WRITE_CHUNK_BYTES = 8 << 20  # bytes per store write call
MAX_QUEUED_WRITE_BYTES = 256 << 20  # beyond this, blocks are not written (counted as dropped)


class StoreWrites:
    def __init__(self, store: GuardedStore | None, namespace: str, tiers: CacheTiers, metrics: TierMetrics,
                 on_written: Callable[[list[int], float], None]) -> None:
        self.store, self.namespace, self.tiers, self.metrics = store, namespace, tiers, metrics
        self.on_written = on_written
        self.writes: list[tuple[StoredBlock, bytes]] = []
        self.write_bytes = 0
        self._write_ready = asyncio.Event()

    def queue(self, block: StoredBlock, payload: bytes) -> None:
        if self.store is None or not self.store.up or self.write_bytes + len(payload) > MAX_QUEUED_WRITE_BYTES:
            self.metrics.store_dropped.inc()
            self.tiers.write_failed([block])
            return
        self.writes.append((block, payload))
        self.write_bytes += len(payload)
        self._write_ready.set()

    async def run(self) -> None:
        while True:
            await self._write_ready.wait()
            self._write_ready.clear()
            while self.writes:
                batch: list[tuple[StoredBlock, bytes]] = []
                size = 0
                while self.writes and (not batch or size + len(self.writes[0][1]) <= WRITE_CHUNK_BYTES):
                    block, payload = self.writes.pop(0)
                    batch.append((block, payload))
                    size += len(payload)
                self.write_bytes -= size
                await self._put(batch)

    async def _put(self, batch: list[tuple[StoredBlock, bytes]]) -> None:
        items = [(b.hash, encode(self.namespace, b, p)) for b, p in batch]
        t0 = time.perf_counter()
        assert self.store is not None  # writes are queued only with a store
        try:
            await self.store.put_many(items)
        except StoreUnavailable:
            self.metrics.store_dropped.inc(len(batch))
            self.tiers.write_failed([b for b, _ in batch])
            return
        self.on_written([b.hash for b, _ in batch], time.perf_counter() - t0)
