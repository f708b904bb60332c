"""The router's index as routing sees it: the configured index (memory, or Redis shared by
replicas) for engines whose own feed orders their events, plus a replica-local memory
index for engines fed over ZeroMQ (router/kvevents), whose writes each replica numbers
itself and so cannot share one (epoch, seq) watermark with other replicas.

Lookups merge the two (an instance lives in one of them); everything else goes to the
shared index, except what the ZeroMQ feeds write straight into `local`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kvroute.router.contract.protocol import KVEvent
from kvroute.router.index.base import Applied, BlockIndex, PrefixMatch
from kvroute.router.index.memory import MemoryIndex


class SplitIndex:
    def __init__(self, shared: BlockIndex, local: MemoryIndex) -> None:
        self.shared, self.local = shared, local
        self.name = getattr(shared, "name", type(shared).__name__)

    async def apply(self, event: KVEvent) -> Applied:
        return await self.shared.apply(event)

    async def replace(self, instance: str, epoch: int, seq: int, tiers: Mapping[str, Sequence[int]]) -> bool:
        return await self.shared.replace(instance, epoch, seq, tiers)

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self.shared.add(instance, tier, blocks)

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self.shared.remove(instance, tier, blocks)

    async def clear(self, instance: str) -> None:
        await self.local.clear(instance)
        await self.shared.clear(instance)

    async def maintain(self, alive: Iterable[str], ttl_s: float) -> None:
        alive = list(alive)
        await self.local.maintain(alive, ttl_s)
        await self.shared.maintain(alive, ttl_s)

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        local = self.local.lookup_sync(blocks)
        shared = await self.shared.lookup(blocks)
        return {**shared, **local} if local else shared

    def lookup_now(self, blocks: Sequence[int]) -> dict[str, PrefixMatch] | None:
        shared = self.shared.lookup_now(blocks)
        if shared is None:
            return None
        local = self.local.lookup_sync(blocks)
        return {**shared, **local} if local else shared

    async def size(self) -> int:
        return self.local.size_sync() + await self.shared.size()

    async def close(self) -> None:
        await self.shared.close()
