"""One batch of block copies between the tiers, run by the model runner before the next step.

The block manager plans copies while it schedules (a cached device block is about
to be reused: copy it to the host first; a host hit: copy it back; bytes fetched
from the store: write them into their device block) and hands the whole batch to
the runner, which runs it before the step that needs it, in this order:

    1. device_reads  device blocks read out for a store write (their device block is reused next)
    2. host_reads    host slots read out for a store write (their slot is reused by a D2H below)
    3. d2h           (device block, host slot): device -> host
    4. h2d           (host slot, device block): host -> device
    5. writes        (device block, payload): store bytes -> device

The order makes every batch safe: reads come before anything overwrites their
source; a block evicted to the host (3) may be the fresh destination of a load (4,
5); a slot read by (4) is held and never the destination of (3) in the same batch.
Batches run in the order they were planned (one runner thread, or one CUDA stream).
A runner moves a batch in at most one copy per direction: 1-3, with the device-to-host
copies staged ahead of eviction alongside it (engine/kv/prestage.py), in one; 4-5 in one
(engine/runners/model/tier_copies.py).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class StoredBlock:
    """A block's identity, as written into a store entry's header."""

    hash: int
    token_ids: tuple[int, ...]
    parent: int | None


@dataclasses.dataclass(slots=True)
class HostEntry:
    """A block in a slot of the host pool (engine/kv/host_pool.py): its identity, checked on a hit like a
    device block's."""

    slot: int
    hash: int
    token_ids: tuple[int, ...]
    parent: int | None  # hash of the previous block, or the chain seed for block 0


@dataclasses.dataclass(slots=True)
class CopyPlan:
    device_reads: list[tuple[int, StoredBlock]] = dataclasses.field(default_factory=list)
    host_reads: list[tuple[int, StoredBlock]] = dataclasses.field(default_factory=list)
    d2h: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    h2d: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    writes: list[tuple[int, bytes]] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.device_reads or self.host_reads or self.d2h or self.h2d or self.writes)

    @property
    def reads(self) -> list[StoredBlock]:
        """The blocks whose payloads the batch's `CopyTimes` carries, in order."""
        return [b for _, b in self.device_reads] + [b for _, b in self.host_reads]

    @property
    def num_loaded(self) -> int:
        """Blocks this batch brings into the device pool (the per-step load budget counts these)."""
        return len(self.h2d) + len(self.writes)


@dataclasses.dataclass(frozen=True, slots=True)
class CopyTimes:
    """What one batch moved and how long each part took (seconds; modelled for the sim runner)."""

    payloads: list[bytes]  # one per `CopyPlan.reads` entry
    read_s: float = 0.0
    d2h_s: float = 0.0
    h2d_s: float = 0.0
    h2d_bytes: int | None = None  # bytes the host-to-device copy moved (None: exactly the blocks loaded)
