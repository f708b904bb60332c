"""The in-memory block index: plain dicts, one process.

Layout:
    _holders: block hash -> {instance: tier bitmask}   (bit i set: held in TIERS[i])
    _held:    instance -> set of its block hashes        (so `clear` costs its own blocks)

The `*_sync` methods do the work, unordered; the async `BlockIndex` methods add the
per-instance (epoch, seq) ordering and lifetime that router/index/base.py describes and
delegate to them, so the cluster simulator (synchronous, virtual clock, events in order)
and the router share one code path.

`lookup_sync` walks the chain in runs: consecutive blocks whose holder maps are equal
(a C-level dict comparison) leave every surviving instance's tier unchanged, so the
Python-level work is per run and per surviving instance, not per block. It stops as
soon as no instance holds the next block.
"""

from __future__ import annotations

import time
from typing import Iterable, Mapping, Sequence

from router.index.base import TIER_RANK, Applied, PrefixMatch, event_owner
from router.contract.protocol import TIERS, KVEvent

# BEST_TIER[mask] = index into TIERS of the best (lowest) tier set in mask; mask 0 unused.
BEST_TIER = tuple(
    next((i for i in range(len(TIERS)) if mask >> i & 1), -1) for mask in range(1 << len(TIERS))
)


def tier_bit(tier: str) -> int:
    try:
        return 1 << TIER_RANK[tier]
    except KeyError:
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}") from None


def to_match(counts: Sequence[int]) -> PrefixMatch:
    return PrefixMatch({tier: n for tier, n in zip(TIERS, counts) if n})


class MemoryIndex:
    """A `BlockIndex` held in this process's memory."""

    name = "memory"

    def __init__(self) -> None:
        self._holders: dict[int, dict[str, int]] = {}
        self._held: dict[str, set[int]] = {}
        self._entries = 0
        self._position: dict[str, tuple[int, int]] = {}  # instance -> (epoch, seq) applied
        self._seen: dict[str, float] = {}  # instance -> last time a router saw it alive

    def apply_sync(self, instance: str, kind: str, blocks, tier: str = "device") -> None:
        """One engine event ("stored", "removed" or "cleared") applied without a KVEvent object."""
        if kind == "stored":
            self.add_sync(instance, tier, blocks)
        elif kind == "removed":
            self.remove_sync(instance, tier, blocks)
        else:
            self.clear_sync(instance)

    def add_sync(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        bit = tier_bit(tier)
        held = self._held.setdefault(instance, set())
        holders_of = self._holders
        for h in blocks:
            holders = holders_of.get(h)
            if holders is None:
                holders_of[h] = {instance: bit}
                held.add(h)
                self._entries += 1
                continue
            mask = holders.get(instance, 0)
            if not mask:
                held.add(h)
                self._entries += 1
            holders[instance] = mask | bit

    def remove_sync(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        bit = tier_bit(tier)
        held = self._held.get(instance)
        if not held:
            return
        for h in blocks:
            holders = self._holders.get(h)
            mask = holders.get(instance, 0) if holders else 0
            if not mask & bit:
                continue
            mask &= ~bit
            if mask:
                holders[instance] = mask
                continue
            del holders[instance]
            held.discard(h)
            self._entries -= 1
            if not holders:
                del self._holders[h]
        if not held:
            del self._held[instance]

    def clear_sync(self, instance: str) -> None:
        held = self._held.pop(instance, ())
        for h in held:
            holders = self._holders[h]
            del holders[instance]
            if not holders:
                del self._holders[h]
        self._entries -= len(held)

    def lookup_sync(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        if not blocks:
            return {}
        first = self._holders.get(blocks[0])
        if not first:
            return {}
        counts = {inst: [0] * len(TIERS) for inst in first}
        alive = dict(first)  # instance -> mask at the current block, for instances still matching
        prev, run = first, 0
        get = self._holders.get
        for i in range(1, len(blocks)):
            holders = get(blocks[i])
            if holders is prev or holders == prev:
                run += 1
                continue
            if holders is None:
                break
            survivors = {}
            for inst, mask in alive.items():
                counts[inst][BEST_TIER[mask]] += run + 1
                mask = holders.get(inst)
                if mask:
                    survivors[inst] = mask
            alive = survivors
            if not alive:
                break
            prev, run = holders, 0
        for inst, mask in alive.items():
            counts[inst][BEST_TIER[mask]] += run + 1
        return {inst: to_match(c) for inst, c in counts.items()}

    def size_sync(self) -> int:
        return self._entries

    # -- the ordered BlockIndex protocol ------------------------------------------

    async def apply(self, event: KVEvent) -> Applied:
        position = self._position.get(event.instance)
        if position is None:
            return "gap"
        if (event.epoch, event.seq) <= position:
            return "duplicate"
        if event.epoch != position[0] or event.seq != position[1] + 1:
            return "gap"
        self._position[event.instance] = (event.epoch, event.seq)
        self._seen[event.instance] = time.time()
        self.apply_sync(event_owner(event.instance, event.tier, event.store), event.type, event.blocks, event.tier)
        return "applied"

    async def replace(self, instance: str, epoch: int, seq: int, tiers: Mapping[str, Sequence[int]]) -> bool:
        position = self._position.get(instance)
        if position is not None and (epoch, seq) <= position:
            return False
        self.clear_sync(instance)
        for tier, blocks in tiers.items():
            self.add_sync(instance, tier, blocks)
        self._position[instance] = (epoch, seq)
        self._seen[instance] = time.time()
        return True

    async def clear(self, instance: str) -> None:
        self.clear_sync(instance)
        self._position.pop(instance, None)
        self._seen.pop(instance, None)

    async def maintain(self, alive: Iterable[str], ttl_s: float) -> None:
        now = time.time()
        for instance in alive:
            self._seen[instance] = now
        for instance in [i for i, t in self._seen.items() if t < now - ttl_s]:
            await self.clear(instance)

    # -- unordered writes (tools and tests), reads ------------------------------------

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        self.add_sync(instance, tier, blocks)
        self._seen.setdefault(instance, time.time())

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        self.remove_sync(instance, tier, blocks)

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        return self.lookup_sync(blocks)

    async def size(self) -> int:
        return self.size_sync()

    async def close(self) -> None:
        pass
