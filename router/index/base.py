"""The block index: which instances hold which block hashes, in which tier.

Backends (memory, redis) implement `BlockIndex`; `apply_event` maps a KV event onto it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

from router.protocol import TIERS, KVEvent

TIER_RANK = {tier: i for i, tier in enumerate(TIERS)}  # lower is better: device < host < remote


@dataclasses.dataclass(frozen=True, slots=True)
class PrefixMatch:
    """One instance's consecutive cached prefix of a request's block chain.

    `by_tier[t]` counts the blocks of that prefix whose best tier is t; the prefix
    ends at the first block the instance does not hold in any tier.
    """

    by_tier: Mapping[str, int]

    @property
    def blocks(self) -> int:
        return sum(self.by_tier.values())

    def tokens(self, block_size: int) -> int:
        return self.blocks * block_size


NO_MATCH = PrefixMatch({})


class IndexUnavailable(Exception):
    """The index backend cannot be reached (e.g. Redis down); route on load alone and retry later."""


class BlockIndex(Protocol):
    """Block hash -> {instance: tier}. All methods are coroutines; backends may share state."""

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        """Record that `instance` holds `blocks` in `tier`."""

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        """Forget `blocks` in `tier` of `instance` (other tiers stay)."""

    async def clear(self, instance: str) -> None:
        """Forget everything `instance` holds; costs its own blocks, never a scan of all."""

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        """Per instance holding blocks[0], its consecutive cached prefix of `blocks`."""

    async def size(self) -> int:
        """Number of (block, instance) entries."""


async def apply_event(index: BlockIndex, event: KVEvent) -> None:
    if event.type == "stored":
        await index.add(event.instance, event.tier, event.blocks)
    elif event.type == "removed":
        await index.remove(event.instance, event.tier, event.blocks)
    else:
        await index.clear(event.instance)
