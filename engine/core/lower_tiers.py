"""What the block manager needs from its lower tiers (engine/kv/tiers.py implements it).

The block manager calls these at the instants its device pool changes; the tiers
never see the block manager. They emit their changes into the `KVChanges` they
were built with (the same one the block manager emits into, so one drain keeps
the order), and hand finished loads back through `take_loaded`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvroute.engine.core.kv_copies import CopyPlan, StoredBlock
from kvroute.engine.core.kv_events import KVChanges
from kvroute.engine.core.prefix_hit import PrefixHit
from kvroute.engine.core.sequence import Sequence


class LowerTiers(Protocol):
    """The host pool and the shared store, as seen from the device pool."""

    changes: KVChanges

    def extend(self, seq: Sequence, hit: PrefixHit, hashes: list[int], parent: int) -> PrefixHit:
        """Continue `hit` past the device prefix into the lower tiers (what the cost model says to load)."""

    def holds(self, h: int) -> bool:
        """A lower tier the device can load from without asking the store holds `h`."""

    def take_host(self, entries: list) -> None: ...

    def admitted(self, seq: Sequence, hit: PrefixHit) -> None: ...

    def start_loads(self, seq: Sequence, hit: PrefixHit, dests: list[int]) -> None: ...

    def take_loaded(self) -> list[tuple[int, StoredBlock]]:
        """(device block, its content) of the loads whose copy was planned since the last call."""

    def cancel(self, seq: Sequence) -> None: ...

    def on_commit(self, seq: Sequence, stored: list[tuple[int, int, StoredBlock]]) -> None:
        """Blocks (index, device block, content) of `seq` just computed and registered on the device."""

    def on_evict(self, block_id: int, meta: StoredBlock) -> None:
        """A cached free device block is about to be reused."""

    def reused(self, block_id: int) -> None:
        """A free cached block was taken again (a prefix hit)."""

    def drain_loads(self) -> None: ...

    def pending_loads(self) -> int: ...

    def take_copy_plan(self) -> CopyPlan: ...

    def take_ahead_plan(self, max_fresh: int, num_plain: int, lru: Iterable[int]) -> CopyPlan:
        """Copies to run alongside the next step; `lru`: free cached device blocks, next evicted first."""

    def clear_host(self) -> None: ...
