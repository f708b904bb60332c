"""BlockManager bookkeeping at its edges (engine/core/block_manager.py): the events a commit, a
clear and a load emit, the hash chain a sequence caches, missing hashes, one-slot growth, and the
records of evicted blocks."""

import pytest

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.kv_copies import StoredBlock
from kvroute.engine.core.kv_events import KVChange
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import RunnerInfo, SamplingParams
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.tier_setup import TierSite, build_tiers
from kvroute.router.contract.protocol import block_hashes

BS = 4
SEED = 77
INFO = RunnerInfo("m", 100, 4096, None, "float32", 2, 2, 64)


def seq(tokens, max_tokens=4):
    return Sequence("r", list(tokens), SamplingParams(max_tokens=max_tokens), SEED)


def tiered(num_blocks=4, host_blocks=8, store=None, write="through"):
    config = TierConfig(host_blocks=host_blocks, kv_store=store, kv_store_write=write)
    return BlockManager(num_blocks, BS, build_tiers(config, TierSite(model="m", block_size=BS), INFO, 1000, 10_000.0))


def admit(bm, s):
    hits = bm.match_prefix(s)
    assert bm.can_allocate(s, hits)
    bm.allocate(s, hits)
    return hits


def run(bm, s):
    admit(bm, s)
    s.num_computed = len(s.token_ids)
    bm.commit_computed(s)
    bm.free(s)


def test_sizes_must_be_positive_and_one_is_enough():
    for bad in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match="^num_blocks and block_size must be positive$"):
            BlockManager(*bad)
    bm = BlockManager(1, 1)
    assert (bm.num_blocks, bm.block_size, bm.num_free) == (1, 1, 1)


def test_hit_counters_start_at_zero_and_count_prompt_and_hit_tokens():
    bm = BlockManager(16, BS)
    run(bm, seq(range(12)))
    assert (bm.num_queried_tokens, bm.num_hit_tokens) == (12, 0)
    admit(bm, seq(list(range(12)) + [50]))
    assert (bm.num_queried_tokens, bm.num_hit_tokens) == (25, 12)
    admit(bm, seq(list(range(12)) + [60]))
    assert (bm.num_queried_tokens, bm.num_hit_tokens) == (38, 24)


def test_a_chunked_commit_names_the_previous_block_as_parent():
    bm = BlockManager(16, BS)
    s = seq(range(17))
    admit(bm, s)
    hashes = block_hashes(list(range(16)), BS, SEED)
    s.num_computed = 8
    bm.commit_computed(s)
    s.num_computed = 17
    bm.commit_computed(s)
    assert bm.drain_events() == [KVChange("stored", hashes[:2], None), KVChange("stored", hashes[2:], hashes[1])]
    assert s.block_hashes == hashes


def test_a_block_computed_twice_is_registered_once():
    bm = BlockManager(16, BS)
    a, b = seq(range(9)), seq(range(9))
    admit(bm, a), admit(bm, b)  # neither is cached yet: both compute the same blocks
    for s in (a, b):
        s.num_computed = 9
        bm.commit_computed(s)
    hashes = block_hashes(list(range(8)), BS, SEED)
    assert bm.drain_events() == [KVChange("stored", hashes, None)]
    assert [bm.hash_to_block[h] for h in hashes] == a.block_table[:2]
    assert bm.blocks[b.block_table[0]].hash is None and b.block_hashes == hashes


def test_a_cached_block_is_found_by_its_hash_with_its_tokens_and_parent():
    bm = BlockManager(16, BS)
    run(bm, seq(range(9)))
    first, second = block_hashes(list(range(8)), BS, SEED)
    block = bm.cached_block(second)
    assert block is not None and block.block_id == bm.hash_to_block[second]
    assert (block.hash, block.token_ids, block.parent) == (second, (4, 5, 6, 7), first)
    assert bm.cached_block(first).parent == SEED
    assert bm.cached_block(12345) is None


def test_a_three_block_hit_checks_each_blocks_own_tokens():
    bm = BlockManager(16, BS)
    run(bm, seq(range(13)))
    again = seq(list(range(12)) + [99])
    assert len(admit(bm, again).device) == 3 and again.num_computed == 12


def test_the_cached_chain_grows_from_its_last_hash_and_is_cut_to_the_ask():
    bm = BlockManager(16, BS)
    s = seq(range(16))
    full = block_hashes(list(range(16)), BS, SEED)
    assert bm.chain(s, 2) == full[:2]
    assert bm.chain(s, 4) == full
    assert bm.chain(s, 3) == full[:3]


def test_missing_hashes_are_those_after_the_local_prefix():
    bm = BlockManager(16, BS)
    tokens = list(range(17))  # 4 usable blocks: one token is left to compute
    hashes = block_hashes(tokens[:16], BS, SEED)
    assert bm.missing_hashes(seq(tokens)) == hashes
    run(bm, seq(tokens[:9]))  # caches the first 2 blocks
    assert bm.missing_hashes(seq(tokens)) == hashes[2:]
    run(bm, seq(tokens))
    assert bm.missing_hashes(seq(tokens)) == []
    assert bm.missing_hashes(seq(tokens[:16])) == []  # 3 usable blocks, all held


def test_missing_hashes_after_one_cached_block_and_for_a_block_aligned_prompt():
    bm = BlockManager(16, BS)
    tokens = list(range(17))
    hashes = block_hashes(tokens[:16], BS, SEED)
    run(bm, seq(tokens[:5]))  # caches block 0 only
    assert bm.missing_hashes(seq(tokens)) == hashes[1:]
    run(bm, seq(tokens[:13]))  # blocks 0-2
    assert bm.missing_hashes(seq(tokens[:16])) == []  # 16 tokens: 3 usable blocks, the 4th is computed


def test_missing_hashes_count_the_host_pool_as_local():
    bm = tiered(num_blocks=4, host_blocks=8)
    tokens = list(range(10, 22)) + [1]  # 3 usable blocks
    run(bm, seq(tokens[:9]))
    run(bm, seq(range(30, 43)))  # evicts the first two blocks to the host
    bm.take_copy_plan()
    hashes = block_hashes(tokens[:12], BS, SEED)
    assert hashes[0] not in bm.hash_to_block and bm.tiers.holds(hashes[0])
    assert bm.missing_hashes(seq(tokens)) == hashes[2:]


def test_one_more_slot_takes_a_block_only_at_a_block_boundary():
    bm = BlockManager(3, BS)
    s = seq(range(11))
    admit(bm, s)  # 3 blocks: room for 12 tokens
    s.num_computed = 11
    assert bm.num_free == 0 and bm.can_append(s)
    bm.append_slots(s)
    assert len(s.block_table) == 3
    s.num_computed = 12
    assert not bm.can_append(s)


def test_clear_cache_emits_cleared_then_the_blocks_still_in_use():
    bm = BlockManager(8, BS)
    run(bm, seq(range(12)))
    held = seq(range(100, 109))
    admit(bm, held)
    held.num_computed = 9
    bm.commit_computed(held)
    bm.drain_events()
    freed = [b for b, block in enumerate(bm.blocks) if block is not None and block.ref_count == 0]
    bm.clear_cache()
    kept = block_hashes(list(range(100, 108)), BS, SEED)
    assert bm.drain_events() == [KVChange("cleared", [], None)] + [KVChange("stored", [h], None) for h in kept]
    for b in freed:
        assert (bm.blocks[b].hash, bm.blocks[b].token_ids, bm.blocks[b].parent) == (None, (), None)
    big = seq(range(200, 220))  # the 5 free blocks, cleared ones included
    admit(bm, big)
    assert sorted(big.block_table) == sorted(set(range(8)) - set(held.block_table))


def test_an_evicted_blocks_record_is_reset():
    bm = BlockManager(3, BS)
    a = seq(range(9))
    run(bm, a)
    first = bm.hash_to_block[block_hashes(list(range(4)), BS, SEED)[0]]
    run(bm, seq(range(50, 61)))  # needs all 3 blocks: evicts a's two; a's first ends up its partial last
    block = bm.blocks[first]
    assert (block.hash, block.token_ids, block.parent) == (None, (), None)


def test_free_leaves_the_sequence_with_no_blocks_or_hashes():
    bm = BlockManager(8, BS)
    s = seq(range(9))
    admit(bm, s)
    s.num_computed = 9
    bm.commit_computed(s)
    bm.free(s)
    assert s.block_table == [] and s.block_hashes == []


def test_a_write_through_store_gets_each_blocks_tokens_and_parent():
    bm = tiered(num_blocks=8, host_blocks=0, store="redis://127.0.0.1:1/0")
    s = seq(range(10, 19))
    run(bm, s)
    hashes = block_hashes(list(range(10, 18)), BS, SEED)
    reads = [meta for _, meta in bm.take_copy_plan().device_reads]
    assert reads == [StoredBlock(hashes[0], (10, 11, 12, 13), SEED),
                     StoredBlock(hashes[1], (14, 15, 16, 17), hashes[0])]


def test_a_block_loaded_from_the_host_is_registered_with_its_content():
    bm = tiered(num_blocks=4, host_blocks=3)
    tokens = list(range(10, 19))
    run(bm, seq(tokens))
    ha = block_hashes(tokens[:8], BS, SEED)
    run(bm, seq(range(30, 43)))  # evicts both to the host
    bm.take_copy_plan()
    bm.drain_events()
    back = seq(tokens + [5])
    admit(bm, back)
    bm.take_copy_plan()  # the loads are planned: the blocks are findable again
    loaded = [bm.blocks[b] for b in back.block_table[:2]]
    assert [(b.hash, b.token_ids, b.parent) for b in loaded] == [(ha[0], (10, 11, 12, 13), SEED),
                                                                 (ha[1], (14, 15, 16, 17), ha[0])]
    stored = [ev for ev in bm.drain_events() if ev.kind == "stored" and ev.tier == "device"]
    assert KVChange("stored", [ha[1]], ha[0]) in stored
    bm.free(back)
    assert len(admit(bm, seq(tokens + [6])).device) == 2
