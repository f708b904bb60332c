"""Loads into the device pool waiting for their copy: from host slots, or from bytes fetched from the store.

A request admitted with blocks to load holds fresh device blocks for them and is
not scheduled until every one has been copied (`Sequence.pending_loads`). Loads of
all requests wait here in admission order; each copy batch (engine/core/kv_copies.py)
takes the ready ones -- a host load is always ready, a store load once its bytes
have arrived -- up to the per-batch budget of blocks, so a storm of returning
sessions is spread over several steps instead of stalling the running decodes
(like the prefill token budget spreads long prompts). At least one block goes per
batch, so loads always progress. A load counts as done when its batch is handed to
the runner: batches run in order, before any later step reads the block.

A store load whose bytes do not arrive (missing, corrupt, timed out) fails: that
block and the request's later loads are dropped and the request recomputes from
there (`on_failed(seq, index, freed host slots)` tells the block manager where to cut).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

from kvroute.engine.core.kv_copies import CopyPlan, StoredBlock
from kvroute.engine.core.sequence import Sequence


@dataclasses.dataclass(slots=True, eq=False)
class Load:
    seq: Sequence
    index: int  # block index in the sequence
    block_id: int  # destination device block
    block: StoredBlock
    tier: str  # "host" or "remote"
    slot: int = -1  # host source slot
    payload: bytes | None = None  # store bytes, once fetched
    requested: bool = False
    done: bool = False  # copied, failed or cancelled


class LoadQueue:
    def __init__(self, budget_blocks: Callable[[], int], on_loaded: Callable[[Load], None],
                 on_failed: Callable[[Sequence, int, list[int]], None]) -> None:
        self.budget_blocks = budget_blocks
        self.on_loaded = on_loaded
        self.on_failed = on_failed
        self.pending: collections.deque[Load] = collections.deque()
        self.held: list[int] = []  # host slots read by the current batch
        self.batch_blocks = 0

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, loads: list[Load]) -> None:
        for load in loads:
            load.seq.pending_loads += 1
            self.pending.append(load)

    def fetches(self) -> list[Load]:
        """Store loads whose bytes have not been asked for yet (marked asked)."""
        out = [ld for ld in self.pending if ld.tier == "remote" and not ld.requested]
        for load in out:
            load.requested = True
        return out

    def arrived(self, load: Load, payload: bytes | None) -> None:
        """The store answered for `load`: its verified payload, or None (missing or bad)."""
        if load.done:
            return  # cancelled meanwhile
        if payload is not None:
            load.payload = payload
            return
        slots = self._finish_seq(load.seq, load.index)
        self.on_failed(load.seq, load.index, slots)

    def drain(self, plan: CopyPlan) -> None:
        """Move ready loads into `plan` within this batch's budget."""
        limit = max(1, self.budget_blocks())
        kept: collections.deque[Load] = collections.deque()
        while self.pending:
            load = self.pending.popleft()
            if load.done:
                continue
            ready = load.tier == "host" or load.payload is not None
            if not ready or self.batch_blocks >= limit:
                kept.append(load)
                continue
            if load.tier == "host":
                plan.h2d.append((load.slot, load.block_id))
                self.held.append(load.slot)
            else:
                assert load.payload is not None  # ready: its bytes arrived
                plan.writes.append((load.block_id, load.payload))
            self.batch_blocks += 1
            self._done(load)
            self.on_loaded(load)
        self.pending = kept

    def end_batch(self) -> list[int]:
        """The batch went to the runner: reset the budget; returns the host slots it read (free them)."""
        held, self.held, self.batch_blocks = self.held, [], 0
        return held

    def cancel(self, seq: Sequence) -> list[int]:
        """Drop every load of `seq` (freed or preempted); returns the host slots they held."""
        return self._finish_seq(seq, 0)

    def _finish_seq(self, seq: Sequence, from_index: int) -> list[int]:
        slots = []
        kept: collections.deque[Load] = collections.deque()
        for load in self.pending:
            if load.seq is seq and not load.done and load.index >= from_index:
                self._done(load)
                if load.slot >= 0:
                    slots.append(load.slot)
            elif not load.done:
                kept.append(load)
        self.pending = kept
        return slots

    @staticmethod
    def _done(load: Load) -> None:
        load.done = True
        load.seq.pending_loads -= 1
