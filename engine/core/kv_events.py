"""The engine's KV event log: numbered events in a bounded buffer, long-poll reads.

`seq` grows by one per event within an `epoch`; a reader whose `since` fell out of
the buffer (or who names another epoch) is told to resync from /kv/snapshot.
Listeners (the Redis stream publisher) get every event as it is appended.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
from collections.abc import Callable
from typing import NamedTuple

from kvroute.engine.core.event_wait import wait_set
from kvroute.router.contract.protocol import EventType, KVEvent, Tier, new_epoch


class KVChange(NamedTuple):
    """One change the block manager queues for the log (`KVEventLog.append` numbers it)."""

    kind: EventType
    blocks: list[int]
    parent: int | None
    tier: Tier = "device"
    store: str | None = None  # tier "remote": the store key


class KVChanges:
    """Changes queued between two drains, by the block manager and its lower tiers alike (one order)."""

    def __init__(self) -> None:
        self.pending: list[KVChange] = []

    def emit(self, kind: EventType, blocks: list[int], parent: int | None, tier: Tier = "device") -> None:
        self.pending.append(KVChange(kind, blocks, parent, tier))

    def drain(self) -> list[KVChange]:
        """Queued changes, consecutive removals from one tier merged into one."""
        pending, self.pending = self.pending, []
        events: list[KVChange] = []
        copied = False  # events[-1] is a copy (merging into it leaves the queued change alone)
        for ev in pending:
            last = events[-1] if events else None
            if ev.kind == "removed" and last is not None and last.kind == "removed" and last.tier == ev.tier:
                if not copied:
                    last = events[-1] = last._replace(blocks=list(last.blocks))
                    copied = True
                last.blocks.extend(ev.blocks)
            else:
                events.append(ev)
                copied = False
        return events


@dataclasses.dataclass(frozen=True, slots=True)
class EventBatch:
    epoch: int
    seq: int  # latest seq in the log
    events: list[KVEvent]
    resync: bool


class KVEventLog:
    def __init__(self, instance: str, capacity: int = 10_000, epoch: int | None = None) -> None:
        self.instance = instance
        self.epoch = new_epoch() if epoch is None else epoch
        self.seq = 0
        self._buffer: collections.deque[KVEvent] = collections.deque(maxlen=capacity)
        self._changed = asyncio.Event()
        self.listeners: list[Callable[[KVEvent], None]] = []

    def append(self, type_: EventType, blocks: list[int], parent: int | None = None, tier: Tier = "device",
               store: str | None = None) -> KVEvent:
        self.seq += 1
        event = KVEvent(instance=self.instance, epoch=self.epoch, seq=self.seq, type=type_, tier=tier,
                        blocks=tuple(blocks), parent=parent, store=store)
        self._buffer.append(event)
        self._changed.set()
        for listener in self.listeners:
            listener(event)
        return event

    def read(self, since: int, epoch: int | None = None) -> EventBatch:
        oldest = self._buffer[0].seq if self._buffer else self.seq + 1
        if (epoch is not None and epoch != self.epoch) or since > self.seq or since < oldest - 1:
            return EventBatch(self.epoch, self.seq, [], resync=True)
        events = list(itertools.islice(self._buffer, since - oldest + 1, None)) if since < self.seq else []
        return EventBatch(self.epoch, self.seq, events, resync=False)

    async def wait(self, since: int, timeout: float, epoch: int | None = None) -> EventBatch:
        """Events after `since`, waiting up to `timeout` seconds for the first one."""
        batch = self.read(since, epoch)
        if batch.events or batch.resync or timeout <= 0:
            return batch
        self._changed.clear()
        await wait_set(self._changed, timeout)
        return self.read(since, epoch)
