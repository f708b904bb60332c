import pytest

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.prefix_hit import PrefixHit
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.router.contract.protocol import block_hashes

SEED = 1234
BS = 4


def seq(tokens, max_tokens=4):
    return Sequence("r", list(tokens), SamplingParams(max_tokens=max_tokens), SEED)


def admit(bm, s):
    hits = bm.match_prefix(s)
    assert bm.can_allocate(s, hits)
    bm.allocate(s, hits)
    return hits.device


def compute_all(bm, s):
    s.num_computed = len(s.token_ids)
    bm.commit_computed(s)


def test_alloc_and_free_ref_counts():
    bm = BlockManager(8, BS)
    s = seq(range(10))
    admit(bm, s)
    assert len(s.block_table) == 3 and bm.num_free == 5
    assert all(bm.blocks[b].ref_count == 1 for b in s.block_table)
    bm.free(s)
    assert bm.num_free == 8 and s.block_table == []


def test_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(16, BS)
    a = seq(range(12))
    admit(bm, a)
    compute_all(bm, a)
    b = seq(list(range(8)) + [99, 98, 97])
    hits = admit(bm, b)
    assert hits == a.block_table[:2]
    assert b.num_computed == 8
    assert bm.blocks[hits[0]].ref_count == 2
    bm.free(a)
    assert bm.blocks[hits[0]].ref_count == 1


def test_last_token_is_always_recomputed():
    bm = BlockManager(16, BS)
    a = seq(range(8))
    admit(bm, a)
    compute_all(bm, a)
    bm.free(a)
    b = seq(range(8))  # fully cached prompt: still one block must be computed for logits
    hits = admit(bm, b)
    assert len(hits) == 1 and b.num_computed == 4


def test_freed_blocks_stay_cached_and_emit_events():
    bm = BlockManager(8, BS)
    a = seq(range(9))
    admit(bm, a)
    compute_all(bm, a)
    events = bm.drain_events()
    expected = block_hashes(list(range(8)), BS, SEED)
    assert events == [("stored", expected, None, "device", None)]
    table = list(a.block_table)
    bm.free(a)
    assert set(bm.cached_hashes()) == set(expected)
    b = seq(list(range(8)) + [5])
    assert admit(bm, b) == table[:2]


def test_lru_eviction_order_tail_first_then_oldest():
    bm = BlockManager(4, BS)
    a = seq(range(100, 108))  # 2 full blocks
    admit(bm, a)
    compute_all(bm, a)
    ha = list(a.block_hashes)
    bm.free(a)
    b = seq(range(200, 208))
    admit(bm, b)
    compute_all(bm, b)
    hb = list(b.block_hashes)
    bm.free(b)
    bm.drain_events()
    # 4 blocks, all cached and free. A fresh 1-block request evicts the LRU one:
    # a's tail (freed first), never a's head before its tail.
    c = seq(range(300, 303))
    admit(bm, c)
    assert bm.drain_events() == [("removed", [ha[1]], None, "device", None)]
    # c's block was never hashed, so it is reused before any cached block is evicted;
    # then a's head goes, then b's tail.
    d = seq(range(400, 411))
    bm.free(c)
    admit(bm, d)
    assert bm.drain_events() == [("removed", [ha[0], hb[1]], None, "device", None)]
    assert bm.cached_hashes() == [hb[0]]


def test_collision_is_caught_by_token_check():
    bm = BlockManager(8, BS)
    a = seq(range(9))
    admit(bm, a)
    compute_all(bm, a)
    a_block = a.block_table[0]
    bm.free(a)
    # Forge a collision: b's first hash now points at a block holding other tokens.
    b = seq([7, 7, 7, 7, 7, 7])
    bm.hash_to_block[block_hashes(b.token_ids[:4], BS, SEED)[0]] = a_block
    assert bm.match_prefix(b).device == []
    c = seq(list(range(4)) + [7, 7])  # the genuine owner still hits
    assert bm.match_prefix(c).device == [a_block]


def test_can_allocate_counts_reused_free_blocks():
    bm = BlockManager(3, BS)
    a = seq(range(9))  # 3 blocks
    admit(bm, a)
    compute_all(bm, a)
    bm.free(a)
    b = seq(list(range(8)) + [1, 2, 3, 4, 5])  # 2 hits (free, cached) + 2 fresh = 4 > 3
    hits = bm.match_prefix(b)
    assert len(hits) == 2
    assert not bm.can_allocate(b, hits)


def test_pool_exhaustion_raises():
    bm = BlockManager(2, BS)
    with pytest.raises(RuntimeError):
        bm.allocate(seq(range(12)), PrefixHit())


def test_collision_with_same_tokens_but_other_parent_is_caught():
    bm = BlockManager(8, BS)
    a = seq(list(range(4)) + [9, 9, 9, 9, 1])  # blocks (0,1,2,3) and (9,9,9,9)
    c = seq([5, 5, 5, 5, 1])  # block (5,5,5,5)
    for s in (a, c):
        admit(bm, s)
        compute_all(bm, s)
    a_second, c_first = a.block_table[1], c.block_table[0]
    bm.free(a)
    bm.free(c)
    # b = (5,5,5,5)(9,9,9,9): its first block is a genuine hit on c's; forge its second hash onto
    # a's second block, which holds the same tokens after another first block.
    b = seq([5, 5, 5, 5, 9, 9, 9, 9, 1])
    bm.hash_to_block[block_hashes(b.token_ids[:8], BS, SEED)[1]] = a_second
    assert bm.match_prefix(b).device == [c_first]


def test_collision_under_another_salt_is_caught():
    bm = BlockManager(8, BS)
    a = seq(list(range(4)) + [1])
    admit(bm, a)
    compute_all(bm, a)
    first = a.block_table[0]
    bm.free(a)
    other = Sequence("salted", list(range(4)) + [1], SamplingParams(max_tokens=4), SEED + 1)
    bm.hash_to_block[block_hashes(other.token_ids[:4], BS, SEED + 1)[0]] = first  # same tokens, other seed
    assert bm.match_prefix(other).device == []
    assert bm.match_prefix(seq(list(range(4)) + [2])).device == [first]
