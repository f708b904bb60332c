"""BlockMap: engine events -> index operations on the router's own hashes (no sockets)."""

import random

import pytest

from kvroute.router.contract.kv_wire import Cleared, Removed, Stored
from kvroute.router.contract.protocol import block_hashes, hash_seed
from kvroute.router.index.memory import MemoryIndex
from kvroute.router.kvevents.translate import BlockMap
from tests.support.vllm_publisher import engine_hashes

SEED = hash_seed("m")
rng = random.Random(0)
TOKENS = [rng.randrange(5, 8000) for _ in range(160)]


def apply(bmap, index, *events, instance="e1"):
    for ev in events:
        for kind, tier, hashes in bmap.apply(ev):
            index.apply_sync(instance, kind, hashes, tier)


def cached_blocks(index, tokens, instance="e1", bs=16):
    match = index.lookup_sync(block_hashes(tokens, bs, SEED)).get(instance)
    return dict(match.by_tier) if match else {}


def store_chain(tokens, engine_bs, parent=None, kind="int", **kw):
    hashes = engine_hashes(tokens, engine_bs, parent, kind)
    return hashes, Stored(hashes, parent, list(tokens[: len(hashes) * engine_bs]), engine_bs, **kw)


@pytest.mark.parametrize("kind", ["int", "bytes"])
def test_aligned_blocks_chain_across_events_and_remove_through_the_map(kind):
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    first, ev1 = store_chain(TOKENS[:64], 16, kind=kind)
    second, ev2 = store_chain(TOKENS[64:128], 16, parent=first[-1], kind=kind)
    apply(bmap, index, ev1, ev2)
    assert cached_blocks(index, TOKENS) == {"device": 8}
    apply(bmap, index, Removed([second[1]]))  # the 6th block: the prefix now ends after 5
    assert cached_blocks(index, TOKENS) == {"device": 5}
    assert index.size_sync() == 7 and bmap.counts["unknown_removed"] == 0
    apply(bmap, index, Removed([12345]))
    assert bmap.counts["unknown_removed"] == 1


def test_larger_engine_blocks_cover_two_router_blocks():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    hashes, ev = store_chain(TOKENS[:128], 32)
    apply(bmap, index, ev)
    assert cached_blocks(index, TOKENS) == {"device": 8} and bmap.engine_block_size == 32
    apply(bmap, index, Removed([hashes[2]]))
    assert cached_blocks(index, TOKENS) == {"device": 4}


def test_page_size_one_is_aggregated_into_router_blocks():
    """SGLang: one token per block, events of any length chained token by token."""
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    parent, pages = None, []
    for size in (7, 9, 24, 3):  # 43 tokens: two full router blocks, 11 left over
        start = len(pages)
        chunk = TOKENS[start:start + size]
        hashes = engine_hashes(chunk, 1, parent)
        apply(bmap, index, Stored(hashes, parent, chunk, 1, medium="GPU"))
        pages += hashes
        parent = hashes[-1]
    assert cached_blocks(index, TOKENS) == {"device": 2}
    assert index.size_sync() == 2  # the partial third block is never credited
    apply(bmap, index, Removed([pages[20]]))  # a token inside router block 1
    assert cached_blocks(index, TOKENS) == {"device": 1}
    apply(bmap, index, Removed([pages[3]]))  # a token of router block 0, stored in the first event
    assert cached_blocks(index, TOKENS) == {}
    tail = TOKENS[43:48]  # completes router block 2 from the pages still held: credited, but its prefix is gone
    apply(bmap, index, Stored(engine_hashes(tail, 1, parent), parent, tail, 1))
    assert index.size_sync() == 1 and cached_blocks(index, TOKENS) == {}


def test_page_size_one_completing_a_block_across_events():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    head = engine_hashes(TOKENS[:10], 1)
    apply(bmap, index, Stored(head, None, TOKENS[:10], 1))
    assert index.size_sync() == 0
    rest = engine_hashes(TOKENS[10:16], 1, head[-1])
    apply(bmap, index, Stored(rest, head[-1], TOKENS[10:16], 1))
    assert cached_blocks(index, TOKENS) == {"device": 1}
    apply(bmap, index, Removed(head[:1]))  # the first token was stored by the earlier event
    assert cached_blocks(index, TOKENS) == {}


def test_media_map_onto_tiers_and_unknown_media_are_ignored():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    hashes, ev = store_chain(TOKENS[:32], 16)
    apply(bmap, index, ev, Stored(hashes, None, TOKENS[:32], 16, medium="CPU_TIER1"))
    assert cached_blocks(index, TOKENS) == {"device": 2}
    apply(bmap, index, Removed(hashes, medium="GPU"))
    assert cached_blocks(index, TOKENS) == {"host": 2}
    apply(bmap, index, Stored(hashes, None, TOKENS[:32], 16, medium="STORAGE"), Removed(hashes, medium="CPU_TIER1"))
    assert cached_blocks(index, TOKENS) == {"remote": 2}
    other, ev = store_chain(TOKENS[32:64], 16, parent=hashes[-1], medium="HBM3")
    apply(bmap, index, ev, Removed(other, medium="HBM3"))
    assert cached_blocks(index, TOKENS) == {"remote": 2}
    assert bmap.counts["unknown_medium"] == 2 and bmap.unknown_media == {"HBM3": 2}


@pytest.mark.parametrize("extra", [{"lora_id": 3}, {"lora_name": "sql-adapter"}])
def test_lora_blocks_are_unroutable_and_so_are_their_children(extra):
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    hashes, ev = store_chain(TOKENS[:32], 16, **extra)
    child, ev2 = store_chain(TOKENS[32:64], 16, parent=hashes[-1])
    apply(bmap, index, ev, ev2)
    assert index.size_sync() == 0 and bmap.counts["unroutable_lora"] == 2
    assert bmap.counts["unroutable_unroutable_parent"] == 2
    apply(bmap, index, Removed(hashes + child))
    assert bmap.counts["unknown_removed"] == 0 and len(bmap) == 0


def test_extra_keys_make_that_block_and_the_rest_of_the_chain_unroutable():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    hashes, _ = store_chain(TOKENS[:64], 16)
    ev = Stored(hashes, None, TOKENS[:64], 16, extra_keys=[None, None, ["mm-hash-abc", 0], None])
    apply(bmap, index, ev)
    assert cached_blocks(index, TOKENS) == {"device": 2}
    assert bmap.counts["unroutable_extra_keys"] == 2


def test_unknown_parent_is_unroutable_not_guessed():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    hashes, ev = store_chain(TOKENS[16:48], 16, parent=999)
    apply(bmap, index, ev)
    assert index.size_sync() == 0 and bmap.counts["unroutable_unknown_parent"] == 2


def test_duplicates_are_counted_and_other_groups_ignored():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    hashes, ev = store_chain(TOKENS[:32], 16)
    apply(bmap, index, ev, ev, Removed(hashes))
    assert cached_blocks(index, TOKENS) == {"device": 2}  # a second copy still holds them
    apply(bmap, index, Removed(hashes))
    assert cached_blocks(index, TOKENS) == {}
    apply(bmap, index, Stored(hashes, None, TOKENS[:32], 16, group_idx=1))
    assert index.size_sync() == 0 and bmap.counts["ignored_group"] == 1


def test_cleared_and_malformed():
    bmap, index = BlockMap(SEED, 16), MemoryIndex()
    _, ev = store_chain(TOKENS[:32], 16)
    apply(bmap, index, ev, Cleared())
    assert index.size_sync() == 0 and len(bmap) == 0
    apply(bmap, index, Stored([1, 2], None, TOKENS[:31], 16))  # tokens do not cover the blocks
    assert bmap.counts["malformed_stored"] == 1 and len(bmap) == 0
