"""A circuit breaker around any `BlockIndex`: a dead or frozen backend costs a few
requests a short timeout each, not every request for the whole outage.

closed     calls go through; `failures` consecutive IndexUnavailable errors open it.
open       every call raises IndexUnavailable at once, without touching the backend
           (the router routes on load alone, events are marked for resync), for
           `cooldown_s`.
half-open  after the cool-down one call goes through as a probe: success closes the
           breaker, failure opens it for another cool-down.

    kvroute_index_breaker_open{backend}       1 while open
    kvroute_index_breaker_trips_total{backend}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from kvroute.router.contract.protocol import KVEvent
from kvroute.router.index.base import Applied, BlockIndex, IndexUnavailable, PrefixMatch


class BreakerIndex:
    def __init__(self, inner: BlockIndex, failures: int = 3, cooldown_s: float = 5.0,
                 registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if failures < 1 or cooldown_s <= 0:
            raise ValueError("the index breaker needs failures >= 1 and a positive cool-down")
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.threshold, self.cooldown_s, self.clock = failures, cooldown_s, clock
        self.consecutive = 0
        self.open_until: float | None = None
        self._probing = False
        registry = registry or CollectorRegistry()
        self._open = Gauge("kvroute_index_breaker_open", "1 while the index breaker is open.", ["backend"],
                           registry=registry)
        self._trips = Counter("kvroute_index_breaker_trips", "Times the index breaker opened.", ["backend"],
                              registry=registry)

    @property
    def is_open(self) -> bool:
        return self.open_until is not None

    async def _run(self, coro):
        if self.open_until is not None:
            if self.clock() < self.open_until or self._probing:
                coro.close()
                raise IndexUnavailable(f"index circuit open after {self.consecutive} failures; routing on load")
            self._probing = True
        try:
            result = await coro
        except IndexUnavailable:
            self._failed()
            raise
        finally:
            self._probing = False
        self.consecutive = 0
        if self.open_until is not None:
            self.open_until = None
            self._open.labels(self.name).set(0)
        return result

    def _failed(self) -> None:
        self.consecutive += 1
        if self.consecutive >= self.threshold or self.open_until is not None:
            if self.open_until is None:
                self._trips.labels(self.name).inc()
            self.open_until = self.clock() + self.cooldown_s
            self._open.labels(self.name).set(1)

    async def apply(self, event: KVEvent) -> Applied:
        return await self._run(self.inner.apply(event))

    async def replace(self, instance: str, epoch: int, seq: int, tiers: Mapping[str, Sequence[int]]) -> bool:
        return await self._run(self.inner.replace(instance, epoch, seq, tiers))

    async def clear(self, instance: str) -> None:
        await self._run(self.inner.clear(instance))

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._run(self.inner.add(instance, tier, blocks))

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._run(self.inner.remove(instance, tier, blocks))

    async def maintain(self, alive: Iterable[str], ttl_s: float) -> None:
        await self._run(self.inner.maintain(alive, ttl_s))

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        return await self._run(self.inner.lookup(blocks))

    def lookup_now(self, blocks: Sequence[int]) -> dict[str, PrefixMatch] | None:
        """The inner index's answer when it has one without awaiting (it then raises nothing this
        breaker counts); None while the breaker is open, so `lookup` refuses or probes."""
        if self.open_until is not None:
            return None
        result = self.inner.lookup_now(blocks)
        if result is not None:
            self.consecutive = 0
        return result

    async def size(self) -> int:
        return await self._run(self.inner.size())

    async def close(self) -> None:
        await self.inner.close()
