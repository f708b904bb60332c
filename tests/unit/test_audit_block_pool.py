"""The block pool's counts, answers and eviction order hold over any sequence of requests.

engine/core/block_manager.py: blocks are reference counted, a freed block that holds a hash stays
findable until a fresh block is needed, least recently freed first and, within one sequence, tail
first (so a shared head outlives the tail that follows it); `can_allocate` and `can_append` say
exactly whether the blocks they ask about are free. Checked after each operation of random
workloads and in tables, not on one example.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.engine.kv.host_pool import HostPool
from tests.support.properties import PROPERTY

BS = 4


def prompt(head: int, head_blocks: int, tail: int) -> list[int]:
    """`head_blocks` blocks shared by every prompt of the same `head`, then `tail` tokens of its own."""
    own = [50_000 + tail * 97 + k for k in range(tail)]
    return [1000 * head + k for k in range(head_blocks * BS)] + own


def new_seq(tokens: list[int]) -> Sequence:
    return Sequence("r", list(tokens), SamplingParams(max_tokens=4), 11)


def computed(bm: BlockManager, seq: Sequence) -> None:
    """The sequence's prompt ran: its full blocks are hashed (as a step's postprocess does)."""
    seq.num_computed = len(seq.token_ids)
    bm.commit_computed(seq)


def check_counts(bm: BlockManager, live: list[Sequence]) -> None:
    holders: dict[int, int] = {}
    for seq in live:
        for b in seq.block_table:
            holders[b] = holders.get(b, 0) + 1
    for b, n in holders.items():
        assert bm.blocks[b].ref_count == n, b
    assert bm.num_free == bm.num_blocks - len(holders)
    for h, b in bm.hash_to_block.items():
        assert bm.blocks[b].hash == h
    for b in bm.free_cached:
        assert bm.blocks[b].ref_count == 0 and bm.blocks[b].hash is not None


ops = st.lists(st.tuples(st.sampled_from(["admit", "admit", "grow", "free"]), st.integers(0, 2), st.integers(0, 3),
                         st.integers(1, 9)), max_size=40)


@PROPERTY
@given(num_blocks=st.integers(4, 24), ops=ops)
def test_counts_and_answers_stay_exact_over_any_requests(num_blocks, ops):
    """Admissions (prompts sharing heads), growth and frees in any order: reference counts match the
    live sequences, `can_allocate` / `can_append` are true exactly when the blocks are there, and
    allocating what they allowed never runs the pool dry."""
    bm = BlockManager(num_blocks, BS)
    live: list[Sequence] = []
    for op, head, head_blocks, n in ops:
        if op == "admit":
            seq = new_seq(prompt(head, head_blocks, n))
            hits = bm.match_prefix(seq)
            idle_hits = sum(1 for b in hits.device if bm.blocks[b].ref_count == 0)
            need = bm.blocks_needed(len(seq.token_ids)) - len(hits.device) + idle_hits
            assert bm.can_allocate(seq, hits) == (need <= bm.num_free), (need, bm.num_free)
            if need <= bm.num_free:
                bm.allocate(seq, hits)
                computed(bm, seq)
                live.append(seq)
        elif op == "grow" and live:
            seq = live[n % len(live)]
            need = bm.blocks_needed(seq.num_computed + n) - len(seq.block_table)
            assert bm.can_append(seq, n) == (need <= bm.num_free), (need, bm.num_free)
            if need <= bm.num_free:
                bm.append_slots(seq, n)
                seq.token_ids.extend([7] * n)
                computed(bm, seq)
        elif op == "free" and live:
            bm.free(live.pop(n % len(live)))
        check_counts(bm, live)


@pytest.mark.parametrize("cached", [1, 2, 3, 4])
@pytest.mark.parametrize("extra", [1, 2, 3])
@pytest.mark.parametrize("spare", [0, 1, 2, 3])
def test_idle_hits_count_as_blocks_taken_off_the_free_list(cached, extra, spare):
    """A prompt whose head is cached in free blocks needs those blocks back as well as fresh ones."""
    bm = BlockManager(cached + 2 + spare, BS)
    first = new_seq(prompt(1, cached, 0))
    bm.allocate(first, bm.match_prefix(first))
    computed(bm, first)
    bm.free(first)  # its blocks are free and cached
    filler = new_seq(prompt(2, 2, 0))
    bm.allocate(filler, bm.match_prefix(filler))
    again = new_seq(prompt(1, cached, extra * BS))
    hits = bm.match_prefix(again)
    assert len(hits.device) == cached
    fits = cached + extra <= bm.num_free
    assert bm.can_allocate(again, hits) == fits
    if fits:
        bm.allocate(again, hits)
        check_counts(bm, [filler, again])


@pytest.mark.parametrize("blocks", [2, 3, 4, 6])
def test_eviction_takes_a_freed_prompts_tail_before_its_head(blocks):
    """Evicting j blocks of a freed prompt leaves its first blocks - j blocks findable: the shared
    head outlives its tail (and the prompt freed last outlives the one freed before it)."""
    bm = BlockManager(2 * blocks, BS)
    older, newer = new_seq(prompt(1, blocks, 0)), new_seq(prompt(2, blocks, 0))
    for seq in (older, newer):
        bm.allocate(seq, bm.match_prefix(seq))
        computed(bm, seq)
    bm.free(older)
    bm.free(newer)
    users = []
    for j in range(1, 2 * blocks + 1):
        user = new_seq(prompt(3 + j, 0, BS))  # one fresh block each: evicts one cached block
        bm.allocate(user, bm.match_prefix(user))
        users.append(user)
        left_old = max(0, blocks - j)
        left_new = blocks - max(0, j - blocks)
        assert len(bm.match_prefix(new_seq(prompt(1, blocks, 1))).device) == left_old, j
        assert len(bm.match_prefix(new_seq(prompt(2, blocks, 1))).device) == left_new, j
    check_counts(bm, users)


@pytest.mark.parametrize("table,computed_tokens,n", [(1, 4, 1), (1, 3, 1), (2, 8, 1), (2, 8, 5), (2, 7, 9),
                                                     (3, 9, 3), (3, 12, 8)])
@pytest.mark.parametrize("free", [0, 1, 2, 3])
def test_can_append_is_true_exactly_when_the_new_blocks_are_free(table, computed_tokens, n, free):
    bm = BlockManager(table + free + 1, BS)
    seq = new_seq([5] * (table * BS))
    bm.allocate(seq, bm.match_prefix(seq))
    seq.num_computed = computed_tokens
    other = new_seq([9] * BS)
    bm.allocate(other, bm.match_prefix(other))  # one block held by someone else
    need = bm.blocks_needed(computed_tokens + n) - table
    assert bm.num_free == free
    assert bm.can_append(seq, n) == (need <= free)


host_ops = st.lists(st.tuples(st.sampled_from(["insert", "insert", "reserve", "commit", "release", "take", "discard",
                                                "release_taken", "clear"]), st.integers(0, 12)), max_size=50)


@PROPERTY
@given(slots=st.integers(1, 6), ops=host_ops)
def test_every_host_slot_is_free_an_entrys_reserved_or_taken(slots, ops):
    """The host pool (engine/kv/host_pool.py) never loses or doubles a slot: each one is free, holds
    an entry, is reserved for a copy ahead of eviction, or is read by a load until released."""
    pool = HostPool(slots)
    reserved: list[int] = []
    taken: list[int] = []
    for op, n in ops:
        h = 100 + n
        if op == "insert":
            pool.insert(h, (h,), None)
        elif op == "reserve":
            slot, _ = pool.reserve()
            if slot is not None:
                reserved.append(slot)
        elif op == "commit" and reserved:
            pool.commit(reserved.pop(n % len(reserved)), h, (h,), None)
        elif op == "release" and reserved:
            pool.release([reserved.pop(n % len(reserved))])
        elif op == "take" and h in pool.entries:
            taken.append(pool.take(h).slot)
        elif op == "discard":
            held = h in pool.entries
            assert pool.discard(h) == held and h not in pool.entries
        elif op == "release_taken" and taken:
            pool.release([taken.pop(n % len(taken))])
        elif op == "clear":
            held = sorted(pool.entries)
            assert sorted(pool.clear()) == held and not pool.entries
        places = list(pool.free) + [e.slot for e in pool.entries.values()] + reserved + taken
        assert sorted(places) == list(range(slots)), (op, places)
        assert all(e.hash == k for k, e in pool.entries.items())
