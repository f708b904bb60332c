"""Device-to-host copies ahead of eviction, so that evicting a block costs the step nothing.

A cached free device block is copied to the host only when it is about to be
reused; done then, the copy delays the step that reuses it. So after each
schedule, the blocks that the next steps will evict -- the head of the device
pool's LRU of free cached blocks, as many as a step can take fresh beyond the free
plain blocks -- are copied into reserved host slots in an *ahead* batch that runs
while the step computes (engine/kv/tier_service.py: on a second thread, or a CUDA
copy stream in the same process), and must be done before the next step starts.
When such a block is then evicted, its host entry is committed with no copy; if
it is reused first (a prefix hit takes it), its slot is simply released. The
device copy stays the live one until the eviction: a block is findable in one tier
at a time.

The ahead copy reads only free cached blocks, which no step writes, and writes
only slots no entry uses, so it needs no lock against the step.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvroute.engine.core.kv_copies import CopyPlan, HostEntry, StoredBlock
from kvroute.engine.kv.host_pool import HostPool


class Prestager:
    def __init__(self, host: HostPool, on_host_evicted) -> None:
        self.host = host
        self.on_host_evicted = on_host_evicted  # (evicted entry, plan whose reads come first) -> None
        self.staged: dict[int, int] = {}  # device block id -> reserved host slot holding its K/V
        self.plan = CopyPlan()
        self.outcomes = {"evicted": 0, "reused": 0}  # staged copies by what became of the block

    def stage(self, num_plain: int, lru: Iterable[int], count: int) -> None:
        """Reserve slots and plan ahead copies for the next `count` blocks the device pool would evict:
        `num_plain` free blocks holding nothing go first, then the free cached `lru` (next evicted first)."""
        need = count - num_plain - len(self.staged)
        if need <= 0:
            return
        for block_id in lru:  # LRU first: the order the block manager evicts in
            if need <= 0:
                break
            if block_id in self.staged:
                continue
            slot, evicted = self.host.reserve()
            if slot is None:
                break
            if evicted is not None:
                self.on_host_evicted(evicted, self.plan)
            self.staged[block_id] = slot
            self.plan.d2h.append((block_id, slot))
            need -= 1

    def take_plan(self) -> CopyPlan:
        plan, self.plan = self.plan, CopyPlan()
        return plan

    def evicted(self, block_id: int, meta: StoredBlock) -> HostEntry | None:
        """Device block `block_id` (holding `meta`) is being evicted: its host entry if it was staged
        (no copy needed), else None."""
        slot = self.staged.pop(block_id, None)
        if slot is None:
            return None
        self.outcomes["evicted"] += 1
        return self.host.commit(slot, meta.hash, meta.token_ids, meta.parent)

    def reused(self, block_id: int) -> None:
        """A staged block was taken again before its eviction: drop its copy."""
        slot = self.staged.pop(block_id, None)
        if slot is not None:
            self.outcomes["reused"] += 1
            self.host.release([slot])

    def clear(self) -> None:
        self.host.release(list(self.staged.values()))
        self.staged.clear()
