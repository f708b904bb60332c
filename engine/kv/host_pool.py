"""The host tier's bookkeeping: which block lives in which host slot, oldest first.

The runner holds the bytes (a second K/V pool in host memory with the device pool's
layout, pinned when the device is CUDA); this table holds, per slot, the block's
hash, token ids and parent, so a host hit is confirmed exactly like a device hit.
Entries arrive when a cached device block is about to be reused (its K/V is copied
device-to-host first) and leave when a prefix hit takes them back to the device
(`take`), when the device computes the same block again (`discard`), or when room
is needed for a newer block (`insert` evicts the least recently inserted one). A
block is in at most one of device and host at a time.

A slot taken for a host-to-device copy is held until the copy plan that reads it
has been handed to the runner (`release`), so no device-to-host copy planned in the
same batch can overwrite it first.
"""

from __future__ import annotations

import collections

from kvroute.engine.core.kv_copies import HostEntry


class HostPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the host pool needs at least one block, got {num_slots}")
        self.num_slots = num_slots
        self.free: collections.deque[int] = collections.deque(range(num_slots))
        self.entries: collections.OrderedDict[int, HostEntry] = collections.OrderedDict()  # hash -> entry, LRU first

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self.free)

    def hashes(self) -> list[int]:
        return list(self.entries)

    def lookup(self, h: int, parent: int | None, token_ids: tuple[int, ...]) -> HostEntry | None:
        """The entry for block `h` if its parent and tokens match exactly, else None."""
        entry = self.entries.get(h)
        if entry is None or entry.parent != parent or entry.token_ids != token_ids:
            return None
        return entry

    def insert(self, h: int, token_ids: tuple[int, ...], parent: int | None
               ) -> tuple[HostEntry | None, HostEntry | None]:
        """(new entry, entry evicted to make room); (None, None) if `h` is here already or no slot is free."""
        if h in self.entries:
            return None, None
        evicted = None
        if not self.free:
            if not self.entries:
                return None, None  # every slot is held by a pending copy
            _, evicted = self.entries.popitem(last=False)
            self.free.append(evicted.slot)
        entry = HostEntry(self.free.popleft(), h, token_ids, parent)
        self.entries[h] = entry
        return entry, evicted

    def reserve(self) -> tuple[int | None, HostEntry | None]:
        """(a slot for a block not evicted yet, entry evicted to free it); (None, None) if every slot is held.

        The slot receives the block's K/V ahead of its eviction (engine/kv/tiers.py `prestage`) and
        holds no entry until `commit` (the eviction) or `release` (the block was reused instead)."""
        evicted = None
        if not self.free:
            if not self.entries:
                return None, None
            _, evicted = self.entries.popitem(last=False)
            self.free.append(evicted.slot)
        return self.free.popleft(), evicted

    def commit(self, slot: int, h: int, token_ids: tuple[int, ...], parent: int | None) -> HostEntry:
        """The block staged in reserved `slot` was evicted from the device: it is a host entry now."""
        old = self.entries.pop(h, None)
        if old is not None:
            self.free.append(old.slot)
        entry = self.entries[h] = HostEntry(slot, h, token_ids, parent)
        return entry

    def take(self, h: int) -> HostEntry:
        """Remove `h` for a copy back to the device; its slot stays held until `release`."""
        return self.entries.pop(h)

    def discard(self, h: int) -> bool:
        """Drop `h` (the device holds it again); True if it was here."""
        entry = self.entries.pop(h, None)
        if entry is None:
            return False
        self.free.append(entry.slot)
        return True

    def release(self, slots: list[int]) -> None:
        self.free.extend(slots)

    def clear(self) -> list[int]:
        """Forget every entry; returns their hashes."""
        gone = list(self.entries)
        self.free.extend(e.slot for e in self.entries.values())
        self.entries.clear()
        return gone
