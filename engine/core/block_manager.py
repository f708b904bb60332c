"""Paged KV block pool with prefix caching (the free list doubles as the cache), plus optional lower tiers.

Blocks are reference counted. A full block whose K/V has been computed gets the
chained hash of its tokens (router/contract/protocol.py) and stays findable by that hash
after its last user frees it; such free cached blocks are evicted least recently
freed first, and only when a fresh block is needed. A hit is confirmed by
comparing the stored token ids and the block's parent (the previous block's hash,
or the chain seed for a first block, which carries model and salt), so a hash
collision never serves wrong K/V: same tokens after another prefix, or under
another salt, is a different block.
Free cached blocks remember when they were freed, summarised in `idle` (router/contract/idle_ages.py),
so `kv_load()` can tell a router how much it can allocate without evicting and how
long the blocks it would evict have been idle (GET /load, router/contract/protocol.py).

With `tiers` (a `LowerTiers`, engine/core/lower_tiers.py; engine/kv/tiers.py), evicted
blocks go to the host pool and/or the store, and a prefix continues into them: those
blocks are loaded into fresh device blocks (`Sequence.pending_loads`: copies still to
come) or recomputed, as the cost model decides. The tiers never see the block manager:
they get block ids and contents, and emit into the same `KVChanges`
(engine/core/kv_events.py) as the block manager does.

`Block` records are made when a block is first handed out (`blocks[i]` is None
before): a simulated cluster builds thousands of pools that each touch a few blocks.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import cast

from kvroute.engine.core.kv_copies import CopyPlan, HostEntry, StoredBlock
from kvroute.engine.core.kv_events import KVChange, KVChanges
from kvroute.engine.core.lower_tiers import LowerTiers
from kvroute.engine.core.prefix_hit import PrefixHit
from kvroute.engine.core.sequence import Sequence
from kvroute.router.contract.idle_ages import IdleAges
from kvroute.router.contract.protocol import EventType, Tier, block_hashes


@dataclasses.dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()
    parent: int | None = None  # hash of the previous block, or the chain seed for block 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, tiers: LowerTiers | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.clock = clock
        self.blocks: list[Block | None] = [None] * num_blocks  # made on first use (_take_fresh)
        self._num_blocks = num_blocks
        # Free blocks holding nothing: ids never handed out (from `_unused` up) come first, in order, then
        # those given back (`free_plain`, oldest first). A pool of thousands of blocks costs nothing to build.
        self._unused = 0
        self.free_plain: collections.deque[int] = collections.deque()
        self.free_cached: collections.OrderedDict[int, float] = collections.OrderedDict()  # LRU first: freed at
        self.idle = IdleAges()
        self.hash_to_block: dict[int, int] = {}
        self.changes = tiers.changes if tiers is not None else KVChanges()
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.tiers = tiers

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def made(self) -> list[Block]:
        """`blocks`, read only at ids handed out (whose Block `_take_fresh` made)."""
        return cast(list[Block], self.blocks)

    @property
    def pending_events(self) -> list[KVChange]:
        return self.changes.pending

    @property
    def num_free_plain(self) -> int:
        """Free blocks holding nothing (allocated without evicting)."""
        return self._num_blocks - self._unused + len(self.free_plain)

    @property
    def num_free(self) -> int:
        return self.num_free_plain + len(self.free_cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_hashes(self) -> list[int]:
        return list(self.hash_to_block)

    def cached_block(self, block_hash: int) -> Block | None:
        """The block findable by `block_hash` (its tokens and parent), or None."""
        block_id = self.hash_to_block.get(block_hash)
        return None if block_id is None else self.blocks[block_id]

    def kv_load(self) -> tuple[int, tuple[tuple[int, float], ...]]:
        """(free blocks holding nothing, (blocks, idle seconds) of the evictable ones, next evicted first)."""
        return self.num_free_plain, self.idle.profile(self.clock())

    def emit(self, kind: EventType, blocks: list[int], parent: int | None, tier: Tier = "device") -> None:
        self.changes.emit(kind, blocks, parent, tier)

    def chain(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of `seq`'s first `num_blocks` full blocks (cached on the sequence: its tokens
        only grow, so a prefix's hashes never change)."""
        cache = seq.hash_chain
        have = len(cache)
        if have < num_blocks:
            bs = self.block_size
            cache.extend(block_hashes(seq.token_ids[have * bs:num_blocks * bs], bs, seq.hash_seed,
                                      parent=cache[-1] if have else None))
        return cache[:num_blocks] if len(cache) > num_blocks else cache

    def missing_hashes(self, seq: Sequence) -> list[int]:
        """The prompt's usable block hashes after the prefix the device and host pools hold (ask the store)."""
        hashes = self.chain(seq, (len(seq.token_ids) - 1) // self.block_size)
        device, tiers = self.hash_to_block, self.tiers
        local = 0
        while local < len(hashes) and (hashes[local] in device or tiers is not None and tiers.holds(hashes[local])):
            local += 1
        return hashes[local:]

    # -- prefix matching and allocation ---------------------------------------------

    def match_prefix(self, seq: Sequence) -> PrefixHit:
        """The longest reusable prefix, leaving at least one token to compute."""
        bs = self.block_size
        tokens = seq.token_ids
        usable = (len(tokens) - 1) // bs
        hashes = self.chain(seq, len(tokens) // bs)  # every full block: the prefill commits them all
        if len(hashes) > usable:
            hashes = hashes[:usable]
        hit = PrefixHit()
        device, lookup, blocks = hit.device, self.hash_to_block.get, self.made
        parent = seq.hash_seed
        start = 0
        as_tuple = None  # the tokens as one tuple, made at the first block found (slices are then tuples)
        for h in hashes:
            block_id = lookup(h)
            if block_id is None:
                break
            block = blocks[block_id]
            if as_tuple is None:
                as_tuple = tuple(tokens)
            if block.parent != parent or block.token_ids != as_tuple[start:start + bs]:
                break
            device.append(block_id)
            parent = h
            start += bs
        if self.tiers is not None and len(hit.device) < len(hashes):
            self.tiers.extend(seq, hit, hashes, parent)
        return hit

    def can_allocate(self, seq: Sequence, hits: PrefixHit) -> bool:
        blocks = self.made
        reused_free = 0
        for b in hits.device:
            if not blocks[b].ref_count:
                reused_free += 1
        fresh = -(-len(seq.token_ids) // self.block_size) - len(hits.device)
        return fresh + reused_free <= self.num_free

    def allocate(self, seq: Sequence, hits: PrefixHit) -> None:
        """Give `seq` its prefix hits, fresh blocks for the loads, and fresh blocks for the rest."""
        assert not seq.block_table, "sequence already holds blocks"
        blocks, free_cached = self.made, self.free_cached
        taken: dict[float, int] = {}  # free time -> hits taken off the free cached list (freed together)
        for block_id in hits.device:  # a hit nobody held leaves the free cached list
            block = blocks[block_id]
            if not block.ref_count:
                freed_at = free_cached.pop(block_id, None)
                if freed_at is not None:
                    taken[freed_at] = taken.get(freed_at, 0) + 1
                if self.tiers is not None:
                    self.tiers.reused(block_id)
            block.ref_count += 1
        for freed_at, n in taken.items():
            self.idle.remove(freed_at, n)
        seq.block_table = list(hits.device)
        seq.block_hashes = seq.hash_chain[:len(hits.device)]  # each hit was found by its chain hash
        if hits.num_loads:
            assert self.tiers is not None  # loads come from the tiers
            self.tiers.take_host(hits.host)  # out of the host pool before a fresh block can evict into it
            dests = [self._take_fresh() for _ in range(hits.num_loads)]
            seq.block_table.extend(dests)
            host: Iterator[HostEntry | StoredBlock] = iter(hits.host)
            remote = iter(hits.remote)
            seq.block_hashes.extend(next(host if t == "host" else remote).hash for t in hits.order)
        seq.num_computed = len(hits) * self.block_size
        table, fresh = seq.block_table, self._take_fresh
        for _ in range(self.blocks_needed(len(seq.token_ids)) - len(hits)):
            table.append(fresh())
        if self.tiers is not None:
            self.tiers.admitted(seq, hits)
            if hits.num_loads:
                self.tiers.start_loads(seq, hits, dests)
                self._register_loaded()
        self.num_queried_tokens += len(seq.token_ids)
        self.num_hit_tokens += seq.num_computed

    def can_append(self, seq: Sequence, num_new_slots: int = 1) -> bool:
        need = -(-(seq.num_computed + num_new_slots) // self.block_size) - len(seq.block_table)
        return need <= 0 or need <= self.num_free

    def append_slots(self, seq: Sequence, num_new_slots: int = 1) -> None:
        """Grow the block table so `num_new_slots` more tokens after num_computed fit."""
        table = seq.block_table
        for _ in range(-(-(seq.num_computed + num_new_slots) // self.block_size) - len(table)):
            table.append(self._take_fresh())

    def free(self, seq: Sequence) -> None:
        if seq.pending_loads:
            assert self.tiers is not None  # loads come from the tiers
            self.tiers.cancel(seq)
        # Tail blocks first, so they are evicted before the (more shareable) head.
        now = self.clock()
        blocks, free_cached = self.made, self.free_cached
        cached = 0
        for block_id in reversed(seq.block_table):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is None:
                    self.free_plain.append(block_id)
                else:
                    free_cached[block_id] = now
                    cached += 1
        if cached:
            self.idle.add(now, cached)
        seq.block_table = []
        seq.block_hashes = []

    # -- hashing computed and loaded blocks ---------------------------------------------

    def commit_computed(self, seq: Sequence) -> None:
        """Hash and register every block of `seq` that is full and computed but not hashed yet."""
        bs = self.block_size
        start = len(seq.block_hashes)
        end = seq.num_computed // bs
        if end <= start:
            return
        chain = self.chain(seq, end)
        new = chain[start:end]
        stored: list[tuple[int, Block]] = []
        blocks, table, known, tokens = self.made, seq.block_table, self.hash_to_block, seq.token_ids
        for i in range(start, end):
            h = chain[i]
            block = blocks[table[i]]
            if block.hash is None and h not in known:
                self._set_hash(block, h, tuple(tokens[i * bs : (i + 1) * bs]), chain[i - 1] if i else seq.hash_seed)
                stored.append((i, block))
        seq.block_hashes.extend(new)
        if stored:
            first = stored[0][0]
            self.emit("stored", [chain[i] for i, _ in stored], seq.block_hashes[first - 1] if first else None)
            if self.tiers is not None:  # what the tiers keep of each block
                self.tiers.on_commit(seq, [(i, b.block_id, StoredBlock(chain[i], b.token_ids, b.parent))
                                           for i, b in stored])

    def register(self, block_id: int, meta: StoredBlock) -> None:
        """A load into `block_id` is done (its copy is planned): the block is findable by its hash."""
        block = self.made[block_id]
        if block.hash is None and meta.hash not in self.hash_to_block:
            self._set_hash(block, meta.hash, meta.token_ids, meta.parent)
            self.emit("stored", [meta.hash], meta.parent)

    def drain_loads(self) -> None:
        if self.tiers is not None:
            self.tiers.drain_loads()
            self._register_loaded()

    @property
    def has_pending_loads(self) -> bool:
        return self.tiers is not None and self.tiers.pending_loads() > 0

    def take_copy_plan(self) -> CopyPlan:
        """Copies to run before the next step (engine/core/kv_copies.py)."""
        if self.tiers is None:
            return CopyPlan()
        plan = self.tiers.take_copy_plan()
        self._register_loaded()
        return plan

    def take_ahead_plan(self, max_fresh: int) -> CopyPlan:
        """Copies to run while the next step computes (engine/kv/prestage.py); `max_fresh`: blocks a step may take."""
        if self.tiers is None:
            return CopyPlan()
        return self.tiers.take_ahead_plan(max_fresh, self.num_free_plain, self.free_cached)

    def _register_loaded(self) -> None:
        assert self.tiers is not None  # loads come from the tiers
        for block_id, meta in self.tiers.take_loaded():
            self.register(block_id, meta)

    def clear_cache(self) -> None:
        """Forget every cached hash of free blocks (blocks in use keep theirs) and the host pool."""
        while self.free_cached:
            block_id, _ = self.free_cached.popitem(last=False)
            self._unhash(self.made[block_id], emit=False)
            self.free_plain.append(block_id)
        self.idle.clear()
        if self.tiers is not None:
            self.tiers.clear_host()
        self.emit("cleared", [], None)
        for h in list(self.hash_to_block):
            self.emit("stored", [h], None)

    def drain_events(self) -> list[KVChange]:
        """Queued changes, consecutive removals from one tier merged into one."""
        return self.changes.drain()

    # -- internals ----------------------------------------------------------------

    def _take_fresh(self) -> int:
        if self._unused < self._num_blocks:
            block_id = self._unused
            self._unused += 1
        elif self.free_plain:
            block_id = self.free_plain.popleft()
        elif self.free_cached:
            block_id, freed_at = self.free_cached.popitem(last=False)
            self.idle.remove(freed_at)
            evicted = self.made[block_id]
            assert evicted.hash is not None  # free_cached holds hashed blocks only
            if self.tiers is not None:
                self.tiers.on_evict(block_id, StoredBlock(evicted.hash, evicted.token_ids, evicted.parent))
            self._unhash(evicted, emit=True)
        else:
            raise RuntimeError("KV block pool exhausted: the scheduler must check before allocating")
        block = self.blocks[block_id]
        if block is None:
            block = self.blocks[block_id] = Block(block_id)
        block.ref_count = 1
        return block_id

    def _set_hash(self, block: Block, h: int, token_ids: tuple[int, ...], parent: int | None) -> None:
        block.hash, block.token_ids, block.parent = h, token_ids, parent
        self.hash_to_block[h] = block.block_id

    def _unhash(self, block: Block, emit: bool) -> None:
        if block.hash is not None:
            del self.hash_to_block[block.hash]
            if emit:
                self.emit("removed", [block.hash], None)
            block.hash = None
            block.token_ids = ()
            block.parent = None
