"""The block index: which instances hold which block hashes, in which tier.

Backends (memory, redis) implement `BlockIndex`; `apply_event` maps a KV event onto it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

from router.protocol import TIERS, KVEvent
from router.tier_costs import store_owner

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


def event_owner(instance: str, tier: str, store: str | None) -> str:
    """Whose blocks an event changes: a shared store's (tier "remote" with a store key), else the instance's.

    A store's blocks are indexed once, under `router.tier_costs.store_owner(key)`, and count
    for every instance advertising that store key (router/policies/tier_credit.py); an
    instance's "cleared" (a restart) never clears the store.
    """
    return store_owner(store) if tier == "remote" and store else instance


async def apply_event(index: BlockIndex, event: KVEvent) -> None:
    owner = event_owner(event.instance, event.tier, event.store)
    if event.type == "stored":
        await index.add(owner, event.tier, event.blocks)
    elif event.type == "removed":
        await index.remove(owner, event.tier, event.blocks)
    else:
        await index.clear(event.instance)
