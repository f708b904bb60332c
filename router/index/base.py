"""The block index: which instances hold which block hashes, in which tier.

Backends (memory, redis) implement `BlockIndex`. Both also offer unordered `add` and
`remove`, for tools and tests that build an index by hand; the router only uses the
ordered writes (and unordered ones for a shared store's pseudo-instance, `event_owner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, Protocol

import msgspec

from kvroute.router.contract.protocol import TIERS, KVEvent
from kvroute.router.contract.tier_costs import store_owner

TIER_RANK: dict[str, int] = {tier: i for i, tier in enumerate(TIERS)}  # lower is better: device < host < remote


class PrefixMatch(msgspec.Struct, frozen=True):
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


Applied = Literal["applied", "duplicate", "gap"]


class BlockIndex(Protocol):
    """Block hash -> {instance: tier}. All methods are coroutines; backends may share state.

    Writes are ordered per instance by the events' (epoch, seq): `apply` takes an event only
    if it is the next one after the instance's watermark ("applied"), drops one at or below
    it ("duplicate": another replica, or this one, applied it already) and refuses one past
    a hole ("gap": the caller resyncs with `replace`). Several routers may feed one index.
    """

    async def apply(self, event: KVEvent) -> Applied:
        """Apply one event in (epoch, seq) order; see the class docstring for the result."""

    async def replace(self, instance: str, epoch: int, seq: int, tiers: Mapping[str, Sequence[int]]) -> bool:
        """Make a snapshot at (epoch, seq) the instance's entries, atomically for readers; False
        (and no change) when the index already holds that position or a later one."""

    async def clear(self, instance: str) -> None:
        """Forget the instance (its id is gone); costs its own blocks, never a scan of all."""

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        """Unordered: `instance` holds `blocks` in `tier` (a shared store's owner; tools, tests)."""

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        """Unordered: `instance` no longer holds `blocks` in `tier`."""

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        """Per instance holding blocks[0], its consecutive cached prefix of `blocks`."""

    def lookup_now(self, blocks: Sequence[int]) -> dict[str, PrefixMatch] | None:
        """`lookup` without awaiting, where the backend holds the index in this process (memory);
        None where it must wait for it (Redis): the caller awaits `lookup` then. The router's
        request path asks this first, so a memory index costs no coroutine per layer."""

    async def size(self) -> int:
        """Number of (block, instance) entries."""

    async def maintain(self, alive: Iterable[str], ttl_s: float) -> None:
        """Mark `alive` as seen now; forget instances no router has seen for `ttl_s`."""

    async def close(self) -> None:
        """Release the backend's connections (the router's shutdown)."""


def event_owner(instance: str, tier: str, store: str | None) -> str:
    """Whose blocks an event changes: a shared store's (tier "remote" with a store key), else the instance's.

    A store's blocks are indexed once, under `router.contract.tier_costs.store_owner(key)`, and count
    for every instance advertising that store key (router/decision/scoring/tier_credit.py); an
    instance's "cleared" (a restart) never clears the store. The event's (epoch, seq) still
    orders the writing instance's stream: the index advances that instance's watermark and
    writes the blocks under the store's owner, unordered (store events are advisory: a
    lookup or read that finds an entry gone is announced as removed).
    """
    return store_owner(store) if tier == "remote" and store else instance
