"""The in-memory block index: plain dicts, one process.

Layout:
    _holders: block hash -> HolderMap {instance: tier bitmask}   (bit i set: held in TIERS[i]),
              one shared, immutable map per distinct set of holders (holder_maps.py)
    _held:    instance -> set of its block hashes        (so `clear` costs its own blocks)

The `*_sync` methods do the work, unordered; the async `BlockIndex` methods add the
per-instance (epoch, seq) ordering and lifetime that router/index/base.py describes and
delegate to them, so the cluster simulator (synchronous, virtual clock, events in order)
and the router share one code path.

`lookup_sync` walks the chain in runs: consecutive blocks with the same holder map (one
identity comparison each, in C) leave every surviving instance's tier unchanged, so the
Python-level work is per run and per surviving instance, not per block. Every prefix
ends at the first block that no instance holds. A change to a block's holders moves it to
another shared map; consecutive blocks held alike share the move (`_set`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, islice
from operator import is_not

from kvroute.router.contract.protocol import TIERS, KVEvent
from kvroute.router.index.base import TIER_RANK, Applied, PrefixMatch, event_owner
from kvroute.router.index.holder_maps import HolderMap, HolderMaps

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
        self._holders: dict[int, HolderMap] = {}
        self._maps = HolderMaps()
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
        self._set(instance, tier_bit(tier), blocks, add=True)

    def remove_sync(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        if self._held.get(instance):
            self._set(instance, tier_bit(tier), blocks, add=False)

    def _set(self, instance: str, bit: int, blocks: Iterable[int], add: bool) -> None:
        """Set (or clear) `bit` in `instance`'s mask for each block; consecutive blocks held alike
        share one transition (`moves`: old map -> new)."""
        held = self._held.setdefault(instance, set())
        holders_of = self._holders
        moves: dict[HolderMap | None, HolderMap | None] = {}
        for h in blocks:
            old = holders_of.get(h)
            mask = old.masks.get(instance, 0) if old is not None else 0
            new_mask = mask | bit if add else mask & ~bit
            if new_mask == mask:
                continue
            self._move(h, old, instance, new_mask, moves)
            if not mask:
                held.add(h)
                self._entries += 1
            elif not new_mask:
                held.discard(h)
                self._entries -= 1
        if not held:
            del self._held[instance]

    def _move(self, h: int, old: HolderMap | None, instance: str, mask: int,
              moves: dict[HolderMap | None, HolderMap | None]) -> None:
        """Block `h` leaves `old` for the map where `instance`'s mask is `mask`; `moves` keeps each
        transition of this batch, so blocks held alike share it."""
        if old in moves:
            new = moves[old]
        else:
            new = moves[old] = self._maps.changed(old, instance, mask)
        new = self._maps.use(new, old)
        if new is None:
            del self._holders[h]
        else:
            self._holders[h] = new

    def clear_sync(self, instance: str) -> None:
        held = self._held.pop(instance, ())
        holders_of = self._holders
        moves: dict[HolderMap | None, HolderMap | None] = {}
        for h in held:
            self._move(h, holders_of[h], instance, 0, moves)
        self._entries -= len(held)

    def lookup_sync(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        if not blocks or blocks[0] not in self._holders:
            return {}
        found: list = list(map(self._holders.get, blocks))  # HolderMap, then None where nobody holds a block
        first = found[0]
        try:
            end = found.index(None)  # no instance holds this block: every prefix ends before it
        except ValueError:  # one scan either way (`None in found` first would scan a partial match twice)
            end = len(found)
        # where the holders change: one identity comparison per block, in C (holder_maps.py)
        cuts = list(compress(range(1, end), map(is_not, islice(found, 1, end), found)))
        cuts.append(end)
        counts = {inst: [0] * len(TIERS) for inst in first.masks}
        alive, start = first.masks, 0
        for cut in cuts:
            for inst, mask in alive.items():
                counts[inst][BEST_TIER[mask]] += cut - start
            if cut == end:
                break
            masks = found[cut].masks
            alive = {inst: mask for inst in alive if (mask := masks.get(inst))}
            if not alive:
                break
            start = cut
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

    def lookup_now(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        return self.lookup_sync(blocks)

    async def size(self) -> int:
        return self.size_sync()

    async def close(self) -> None:
        pass
