"""The block manager's lower tiers: the host pool, the shared store's bookkeeping, planned copies, loads.

Synchronous and shared by the engine and the simulator; the I/O (running copies,
talking to the store) is the caller's (engine/kv/tier_service.py, loadgen/sim).

- Eviction (`on_evict`): a cached device block about to be reused goes to the
  host pool (device-to-host copy planned, unless `prestage.py` copied it ahead;
  the host's oldest block may make room, and with `--kv-store-write evict` it is
  read out for the store first). Without a host pool, an evicted block is read out
  for the store in `evict` mode. Engines sharing a store may each write a block
  they both computed (a store write is idempotent).
- Prefix extension (`extend`): after the device prefix, the blocks the host pool
  holds (same hash, parent and tokens) and those the store was found to hold
  (`Sequence.store_hits`, looked up before the request was queued) form runs; the
  cost model (engine/kv/recovery.py) picks how many runs to load.
- Loads (`start_loads`): host entries leave the host pool (a block is in one tier
  at a time) and, with store blocks, wait in the `LoadQueue` for their copy.
- Write-through (`on_commit`, `--kv-store-write through`): a prompt's full blocks
  are read out for the store as soon as they are computed; `known` remembers the
  hashes the store holds (written or seen), so nothing is written twice.
- Lookups (`looked_up`): the one bookkeeping of a store answer, for the engine's
  I/O and the simulator's alike: hits join `known`, and a known hash the store no
  longer holds leaves it, announced with a `removed` change of tier "remote".
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from kvroute.engine.core.kv_copies import CopyPlan, HostEntry, StoredBlock
from kvroute.engine.core.kv_events import KVChange, KVChanges
from kvroute.engine.core.prefix_hit import PrefixHit
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.kv.host_pool import HostPool
from kvroute.engine.kv.load_queue import Load, LoadQueue
from kvroute.engine.kv.prestage import Prestager
from kvroute.engine.kv.recovery import Recovery

STORE_WRITE_MODES = ("through", "evict")
KNOWN_CAPACITY = 1 << 20  # hashes remembered as held by the store


class KnownSet:
    """A bounded set of hashes, oldest forgotten first."""

    def __init__(self, capacity: int = KNOWN_CAPACITY) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[int, None] = collections.OrderedDict()

    def __contains__(self, h: int) -> bool:
        return h in self._items

    def add(self, h: int) -> None:
        self._items[h] = None
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def discard(self, h: int) -> None:
        self._items.pop(h, None)

    def hashes(self) -> list[int]:
        return list(self._items)


class CacheTiers:
    """The `LowerTiers` of one block manager (engine/core/lower_tiers.py); emits into `changes`."""

    def __init__(self, recovery: Recovery, host_blocks: int = 0, store_write: str | None = None,
                 load_budget_bytes: int = 0, load_budget_s: float = 0.02, changes: KVChanges | None = None) -> None:
        if store_write is not None and store_write not in STORE_WRITE_MODES:
            raise ValueError(f"--kv-store-write must be one of {', '.join(STORE_WRITE_MODES)}, got {store_write!r}")
        self.recovery = recovery
        self.host = HostPool(host_blocks) if host_blocks else None
        self.prestager = Prestager(self.host, self._host_evicted) if self.host is not None else None
        self.store_key = recovery.store_key
        self.store_write = store_write if self.store_key else None
        self.known = KnownSet()
        self.plan = CopyPlan()
        self.load_budget_bytes = load_budget_bytes
        self.load_budget_s = load_budget_s
        self.loads = LoadQueue(self._budget_blocks, self._loaded, self._failed)
        self.loaded: list[tuple[int, StoredBlock]] = []  # planned loads, for the block manager to register
        self.changes = changes if changes is not None else KVChanges()
        self.emit = self.changes.emit
        self.block_size = recovery.block_size

    def _budget_blocks(self) -> int:
        """Blocks per copy batch: --kv-load-budget-bytes, or what the H2D link moves in load_budget_s."""
        nbytes = self.load_budget_bytes or self.recovery.links["h2d"].link.bandwidth_bps * self.load_budget_s
        return int(nbytes // max(self.recovery.bytes_per_block, 1))

    # -- finding and choosing ----------------------------------------------------

    def extend(self, seq: Sequence, hit: PrefixHit, hashes: list[int], parent: int) -> PrefixHit:
        """Add the host and store runs after `hit.device`, trimmed to what the cost model says to load."""
        bs, host, in_store = self.block_size, self.host, seq.store_hits or ()
        found: list[tuple[str, HostEntry | StoredBlock]] = []
        for i in range(len(hit.device), len(hashes)):
            h, tokens = hashes[i], tuple(seq.token_ids[i * bs:(i + 1) * bs])
            entry = host.lookup(h, parent, tokens) if host is not None else None
            if entry is not None:
                found.append(("host", entry))
            elif h in in_store:
                found.append(("remote", StoredBlock(h, tokens, parent)))
            else:
                break
            parent = h
        for tier, _ in found:
            if hit.runs and hit.runs[-1][0] == tier:
                hit.runs[-1] = (tier, hit.runs[-1][1] + 1)
            else:
                hit.runs.append((tier, 1))
        hit.loaded_runs = self.recovery.choose(hit.runs)
        for tier, item in found[:sum(n for _, n in hit.runs[:hit.loaded_runs])]:
            if isinstance(item, HostEntry):  # tier "host"
                hit.host.append(item)
            else:
                hit.remote.append(item)
            hit.order.append(tier)
        return hit

    def holds(self, h: int) -> bool:
        return self.host is not None and h in self.host.entries

    # -- eviction, commits ----------------------------------------------------------

    def on_evict(self, block_id: int, meta: StoredBlock) -> None:
        """Device block `block_id` (cached, free, holding `meta`) is about to be reused: keep its K/V lower."""
        if self.host is None:
            if self.store_write == "evict":
                self._write(self.plan.device_reads, block_id, meta)
            return
        assert self.prestager is not None  # made with the host pool
        entry = self.prestager.evicted(block_id, meta)  # copied ahead of time: nothing to copy now
        if entry is None:
            entry, evicted = self.host.insert(meta.hash, meta.token_ids, meta.parent)
            if evicted is not None:
                self._host_evicted(evicted, self.plan)
            if entry is not None:
                self.plan.d2h.append((block_id, entry.slot))
        if entry is not None:
            self.emit("stored", [meta.hash], meta.parent, "host")

    def reused(self, block_id: int) -> None:
        if self.prestager is not None:
            self.prestager.reused(block_id)

    def clear_host(self) -> None:
        if self.host is not None:
            assert self.prestager is not None  # made with the host pool
            self.prestager.clear()
            self.host.clear()

    def _host_evicted(self, evicted: HostEntry, plan: CopyPlan) -> None:
        """`evicted` left the host pool for a newer block (its slot is reused by `plan`)."""
        self.emit("removed", [evicted.hash], None, "host")
        if self.store_write == "evict":
            self._write(plan.host_reads, evicted.slot, StoredBlock(evicted.hash, evicted.token_ids, evicted.parent))

    def take_ahead_plan(self, max_fresh: int, num_plain: int, lru: Iterable[int]) -> CopyPlan:
        """Copies to run alongside the next batch and step: the evictions that a step's fresh blocks
        (`max_fresh`) and a batch of loads will cause, staged to the host. `num_plain`: free device
        blocks holding nothing; `lru`: the free cached ones, next evicted first."""
        if self.prestager is None:
            return CopyPlan()
        self.prestager.stage(num_plain, lru, max_fresh + min(self._budget_blocks(), max_fresh))
        return self.prestager.take_plan()

    def on_commit(self, seq: Sequence, stored: list[tuple[int, int, StoredBlock]]) -> None:
        """Blocks (index, device block, content) of `seq` just computed and registered on the device."""
        if self.host is not None:
            dropped = [m.hash for _, _, m in stored if self.host.discard(m.hash)]
            if dropped:
                self.emit("removed", dropped, None, "host")
        if self.store_write == "through":
            full = seq.num_prompt // self.block_size
            for i, block_id, meta in stored:
                if i < full:
                    self._write(self.plan.device_reads, block_id, meta)

    def _write(self, reads: list, source: int, meta: StoredBlock) -> None:
        if meta.hash not in self.known:
            self.known.add(meta.hash)  # written once; forgotten again if the write fails
            reads.append((source, meta))

    # -- loads ------------------------------------------------------------------------

    def take_host(self, entries: list[HostEntry]) -> None:
        if not entries:
            return
        assert self.host is not None  # host entries come from the host pool
        for entry in entries:
            self.host.take(entry.hash)
        if entries:
            self.emit("removed", [e.hash for e in entries], None, "host")

    def start_loads(self, seq: Sequence, hit: PrefixHit, dests: list[int]) -> None:
        """Queue `hit`'s loads into the fresh device blocks `dests` (prompt order), then drain what fits."""
        host, remote = iter(hit.host), iter(hit.remote)
        loads = []
        for k, (tier, dest) in enumerate(zip(hit.order, dests)):
            index = len(hit.device) + k
            if tier == "host":
                entry = next(host)
                loads.append(Load(seq, index, dest, StoredBlock(entry.hash, entry.token_ids, entry.parent),
                                  "host", slot=entry.slot))
            else:
                loads.append(Load(seq, index, dest, next(remote), "remote"))
        self.loads.add(loads)
        self.loads.drain(self.plan)

    def admitted(self, seq: Sequence, hit: PrefixHit) -> None:
        """`seq` took `hit`: count the choice per run and what its cached tokens came from."""
        if hit.runs:
            self.recovery.record(hit.runs, hit.loaded_runs)

    def cancel(self, seq: Sequence) -> None:
        if self.host is not None:
            self.host.release(self.loads.cancel(seq))

    def _loaded(self, load: Load) -> None:
        self.loaded.append((load.block_id, load.block))

    def take_loaded(self) -> list[tuple[int, StoredBlock]]:
        loaded, self.loaded = self.loaded, []
        return loaded

    def drain_loads(self) -> None:
        self.loads.drain(self.plan)

    def pending_loads(self) -> int:
        return len(self.loads)

    def _failed(self, seq: Sequence, index: int, slots: list[int]) -> None:
        """A store load of `seq`'s block `index` failed: it and everything after is computed instead."""
        if self.host is not None:
            self.host.release(slots)
        cut = index * self.block_size  # (the prefix-cache hit counters keep what admission found)
        seq.num_computed = min(seq.num_computed, cut)
        del seq.block_hashes[index:]
        lost = max(0, seq.num_cached - cut)
        seq.num_cached -= lost
        for tier in ("remote", "host", "device"):  # the cut drops the tail of the reused prefix
            take = min(lost, seq.cached_by_tier.get(tier, 0))
            seq.cached_by_tier[tier] = seq.cached_by_tier.get(tier, 0) - take
            lost -= take

    def take_copy_plan(self) -> CopyPlan:
        """The copies planned since the last call (loads drained within budget); hand it to the runner."""
        self.loads.drain(self.plan)
        plan, self.plan = self.plan, CopyPlan()
        held = self.loads.end_batch()
        if self.host is not None:
            self.host.release(held)
        return plan

    def looked_up(self, hashes: list[int], present: list[bool],
                  misses_known: bool) -> tuple[frozenset[int], KVChange | None]:
        """The store answered a lookup of `hashes`: (the hashes it holds, a `removed` change of tier
        "remote" for those `known` had that it no longer holds, or None). `misses_known`: the answer
        is the store's (not a guard's "none" while it is down), so a miss means the entry is gone."""
        hits = [h for h, p in zip(hashes, present) if p]
        for h in hits:
            self.known.add(h)
        gone = [h for h, p in zip(hashes, present) if not p and h in self.known] if misses_known else []
        for h in gone:
            self.known.discard(h)
        removed = KVChange("removed", gone, None, "remote", self.store_key) if gone else None
        return frozenset(hits), removed

    def write_failed(self, blocks: list[StoredBlock]) -> None:
        for b in blocks:
            self.known.discard(b.hash)
