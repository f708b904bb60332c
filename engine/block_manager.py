"""Paged KV block pool with prefix caching (the free list doubles as the cache).

Blocks are reference counted. A full block whose K/V has been computed gets the
chained hash of its tokens (router/protocol.py) and stays findable by that hash
after its last user frees it; such free cached blocks are evicted least recently
freed first, and only when a fresh block is needed. A hit is confirmed by
comparing the stored token ids and the block's parent (the previous block's hash,
or the chain seed for a first block, which carries model and salt), so a hash
collision never serves wrong K/V: same tokens after another prefix, or under
another salt, is a different block.
Changes are queued as (type, hashes, parent) tuples for the engine's event log.
Free cached blocks remember when they were freed, summarised in `idle` (router/idle_ages.py),
so `kv_load()` can tell a router how much it can allocate without evicting and how
long the blocks it would evict have been idle (GET /load, router/protocol.py).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

from engine.sequence import Sequence
from router.idle_ages import IdleAges
from router.protocol import block_hashes


@dataclasses.dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()
    parent: int | None = None  # hash of the previous block, or the chain seed for block 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.clock = clock
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_plain: collections.deque[int] = collections.deque(range(num_blocks))
        self.free_cached: collections.OrderedDict[int, float] = collections.OrderedDict()  # LRU first: freed at
        self.idle = IdleAges()
        self.hash_to_block: dict[int, int] = {}
        self.pending_events: list[tuple[str, list[int], int | None]] = []
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_plain) + len(self.free_cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_hashes(self) -> list[int]:
        return list(self.hash_to_block)

    def kv_load(self) -> tuple[int, tuple[tuple[int, float], ...]]:
        """(free blocks holding nothing, (blocks, idle seconds) of the evictable ones, next evicted first)."""
        return len(self.free_plain), self.idle.profile(self.clock())

    # -- prefix matching and allocation ---------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix, leaving at least one token to compute."""
        bs = self.block_size
        usable = (len(seq.token_ids) - 1) // bs
        hashes = block_hashes(seq.token_ids[: usable * bs], bs, seq.hash_seed)
        hits = []
        parent = seq.hash_seed
        for i, h in enumerate(hashes):
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.parent != parent or block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
                break
            hits.append(block_id)
            parent = h
        return hits

    def can_allocate(self, seq: Sequence, hits: list[int]) -> bool:
        reused_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        fresh = self.blocks_needed(len(seq.token_ids)) - len(hits)
        return fresh + reused_free <= self.num_free

    def allocate(self, seq: Sequence, hits: list[int]) -> None:
        """Give `seq` its prefix hits plus fresh blocks for every remaining token."""
        assert not seq.block_table, "sequence already holds blocks"
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.block_hashes = [self.blocks[b].hash for b in hits]
        seq.num_computed = len(hits) * self.block_size
        for _ in range(self.blocks_needed(len(seq.token_ids)) - len(hits)):
            seq.block_table.append(self._take_fresh())
        self.num_queried_tokens += len(seq.token_ids)
        self.num_hit_tokens += seq.num_computed

    def can_append(self, seq: Sequence, num_new_slots: int = 1) -> bool:
        need = self.blocks_needed(seq.num_computed + num_new_slots) - len(seq.block_table)
        return need <= self.num_free

    def append_slots(self, seq: Sequence, num_new_slots: int = 1) -> None:
        """Grow the block table so `num_new_slots` more tokens after num_computed fit."""
        while len(seq.block_table) < self.blocks_needed(seq.num_computed + num_new_slots):
            seq.block_table.append(self._take_fresh())

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so they are evicted before the (more shareable) head.
        now = self.clock()
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is None:
                    self.free_plain.append(block_id)
                else:
                    self.free_cached[block_id] = now
                    self.idle.add(now)
        seq.block_table = []
        seq.block_hashes = []

    # -- hashing computed blocks --------------------------------------------------

    def commit_computed(self, seq: Sequence) -> None:
        """Hash and register every block of `seq` that is full and computed but not hashed yet."""
        bs = self.block_size
        start = len(seq.block_hashes)
        end = seq.num_computed // bs
        if end <= start:
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        new = block_hashes(seq.token_ids[start * bs : end * bs], bs, seq.hash_seed, parent=parent)
        stored, first = [], None
        for i, h in enumerate(new, start):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block:
                block.hash = h
                block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                block.parent = new[i - start - 1] if i > start else (parent if i else seq.hash_seed)
                self.hash_to_block[h] = block.block_id
                stored.append(h)
                first = i if first is None else first
        seq.block_hashes.extend(new)
        if stored:
            parent = seq.block_hashes[first - 1] if first else None
            self.pending_events.append(("stored", stored, parent))

    def clear_cache(self) -> None:
        """Forget every cached hash of free blocks (blocks in use keep theirs)."""
        while self.free_cached:
            block_id, _ = self.free_cached.popitem(last=False)
            self._unhash(self.blocks[block_id], emit=False)
            self.free_plain.append(block_id)
        self.idle.clear()
        self.pending_events.append(("cleared", [], None))
        for h in list(self.hash_to_block):
            self.pending_events.append(("stored", [h], None))

    def drain_events(self) -> list[tuple[str, list[int], int | None]]:
        """Queued changes, consecutive removals merged into one."""
        events: list[tuple[str, list[int], int | None]] = []
        for kind, hashes, parent in self.pending_events:
            if kind == "removed" and events and events[-1][0] == "removed":
                events[-1][1].extend(hashes)
            else:
                events.append((kind, list(hashes), parent))
        self.pending_events = []
        return events

    # -- internals ----------------------------------------------------------------

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            freed_at = self.free_cached.pop(block_id, None)
            if freed_at is not None:
                self.idle.remove(freed_at)
        block.ref_count += 1

    def _take_fresh(self) -> int:
        if self.free_plain:
            block_id = self.free_plain.popleft()
        elif self.free_cached:
            block_id, freed_at = self.free_cached.popitem(last=False)
            self.idle.remove(freed_at)
            self._unhash(self.blocks[block_id], emit=True)
        else:
            raise RuntimeError("KV block pool exhausted: the scheduler must check before allocating")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _unhash(self, block: Block, emit: bool) -> None:
        if block.hash is not None:
            del self.hash_to_block[block.hash]
            if emit:
                self.pending_events.append(("removed", [block.hash], None))
            block.hash = None
            block.token_ids = ()
            block.parent = None
