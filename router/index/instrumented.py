"""Metrics for any `BlockIndex`, added by wrapping it (backends record nothing themselves).

    kvroute_index_operations_total{op, backend}   calls, by op (apply, replace, clear, lookup, size, ...)
    kvroute_index_errors_total{op, backend}       calls that raised
    kvroute_index_lookup_seconds{backend}         lookup latency
    kvroute_index_lookup_blocks{backend}          chain length of each lookup
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import REGISTRY, CollectorRegistry

import kvroute.router.contract.metric_buckets  # noqa: F401  (turns off *_created series)
from kvroute.router.contract.plain_metrics import PlainCounter, PlainHistogram
from kvroute.router.contract.protocol import KVEvent
from kvroute.router.index.base import Applied, BlockIndex, PrefixMatch

LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
CHAIN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class InstrumentedIndex:
    """Wraps `inner`, recording metrics into `registry` (the global one by default). Its series are
    plain numbers (router/contract/plain_metrics.py): every call comes from the event loop's thread."""

    def __init__(self, inner: BlockIndex, registry: CollectorRegistry | None = None) -> None:
        self.inner = inner
        self.backend = getattr(inner, "name", type(inner).__name__)
        registry = REGISTRY if registry is None else registry
        self._ops = PlainCounter(
            "kvroute_index_operations", "Block index calls.", ["op", "backend"], registry=registry
        )
        self._errors = PlainCounter(
            "kvroute_index_errors", "Block index calls that raised.", ["op", "backend"], registry=registry
        )
        self._latency = PlainHistogram(
            "kvroute_index_lookup_seconds", "Block index lookup latency.", ["backend"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self._chain = PlainHistogram(
            "kvroute_index_lookup_blocks", "Blocks in each looked-up chain.", ["backend"],
            buckets=CHAIN_BUCKETS, registry=registry,
        )
        # children bound once: a labels() lookup per call costs more than the observation
        self._op_count: dict[str, PlainCounter] = {}
        self._lookup_chain = self._chain.labels(self.backend)
        self._lookup_latency = self._latency.labels(self.backend)

    def _count(self, op: str) -> None:
        counter = self._op_count.get(op)
        if counter is None:
            counter = self._op_count[op] = self._ops.labels(op, self.backend)
        counter.inc()

    async def _run(self, op: str, coro):
        self._count(op)
        try:
            return await coro
        except Exception:
            self._errors.labels(op, self.backend).inc()
            raise

    async def apply(self, event: KVEvent) -> Applied:
        return await self._run("apply", self.inner.apply(event))

    async def replace(self, instance: str, epoch: int, seq: int, tiers: Mapping[str, Sequence[int]]) -> bool:
        return await self._run("replace", self.inner.replace(instance, epoch, seq, tiers))

    async def clear(self, instance: str) -> None:
        await self._run("clear", self.inner.clear(instance))

    async def maintain(self, alive: Iterable[str], ttl_s: float) -> None:
        await self._run("maintain", self.inner.maintain(alive, ttl_s))

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._run("add", self.inner.add(instance, tier, blocks))

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._run("remove", self.inner.remove(instance, tier, blocks))

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        self._lookup_chain.observe(len(blocks))
        start = time.perf_counter()
        try:
            return await self._run("lookup", self.inner.lookup(blocks))
        finally:
            self._lookup_latency.observe(time.perf_counter() - start)

    def lookup_now(self, blocks: Sequence[int]) -> dict[str, PrefixMatch] | None:
        start = time.perf_counter()
        result = self.inner.lookup_now(blocks)
        if result is not None:  # counted as `lookup` counts it; else the caller's `lookup` will
            self._lookup_chain.observe(len(blocks))
            self._count("lookup")
            self._lookup_latency.observe(time.perf_counter() - start)
        return result

    async def size(self) -> int:
        return await self._run("size", self.inner.size())

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()
