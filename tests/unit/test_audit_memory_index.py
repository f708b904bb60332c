"""The memory index answers as a plain model of who holds what, after any sequence of events.

router/index/memory.py keeps shared holder maps and batches moves for speed; a model of dicts
(instance -> block -> tiers) says what it must answer: each instance's prefix of a chain is the
run of blocks it holds from the first one, counted by each block's best tier; the size counts
(instance, block) pairs; ordered events apply only in (epoch, seq) order, one apart
(docs/architecture.md#ordering-per-instance).
"""

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from kvroute.router.contract.protocol import TIERS, KVEvent
from kvroute.router.index.base import PrefixMatch
from kvroute.router.index.memory import MemoryIndex
from tests.support.properties import PROPERTY

INSTANCES = ("a", "b", "c")
blocks = st.lists(st.integers(1, 8), min_size=1, max_size=6)
writes = st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "clear"]), st.sampled_from(INSTANCES),
                            st.sampled_from(TIERS), blocks), max_size=30)


def model_lookup(held: dict[str, dict[int, set[str]]], chain: list[int]) -> dict[str, PrefixMatch]:
    out = {}
    for inst, tiers_of in held.items():
        counts: dict[str, int] = {}
        for h in chain:
            tiers = tiers_of.get(h)
            if not tiers:
                break
            best = min(tiers, key=TIERS.index)
            counts[best] = counts.get(best, 0) + 1
        if counts:
            out[inst] = PrefixMatch(counts)
    return out


@PROPERTY
@given(writes=writes, chains=st.lists(st.lists(st.integers(1, 8), min_size=1, max_size=8), min_size=1, max_size=5))
def test_lookups_and_size_match_a_plain_model(writes, chains):
    index, held = MemoryIndex(), {}
    for op, inst, tier, hashes in writes:
        mine = held.setdefault(inst, {})
        if op == "add":
            index.add_sync(inst, tier, hashes)
            for h in hashes:
                mine.setdefault(h, set()).add(tier)
        elif op == "remove":
            index.remove_sync(inst, tier, hashes)
            for h in hashes:
                mine.get(h, set()).discard(tier)
        else:
            index.clear_sync(inst)
            mine.clear()
        assert index.size_sync() == sum(1 for m in held.values() for t in m.values() if t)
        for chain in chains:
            assert index.lookup_sync(chain) == model_lookup(held, chain), chain


@PROPERTY
@given(events=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 3), st.integers(0, 6)), max_size=30),
       resyncs=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 3), st.integers(0, 6)), max_size=4))
def test_ordered_events_apply_only_one_apart_within_an_epoch(events, resyncs):
    """Before a snapshot an instance has no position (every event is a gap); after one, an event at
    or before the position is a duplicate, the next seq of the same epoch applies, anything else
    is a gap. A snapshot older than the position is refused."""

    async def go():
        index, position = MemoryIndex(), {}
        pending = list(resyncs)
        for inst, epoch, seq in events:
            if pending:
                r_inst, r_epoch, r_seq = pending.pop()
                replaced = await index.replace(r_inst, r_epoch, r_seq, {"device": [r_seq + 100]})
                old = position.get(r_inst)
                assert replaced == (old is None or (r_epoch, r_seq) > old)
                if replaced:
                    position[r_inst] = (r_epoch, r_seq)
            ev = KVEvent(instance=inst, epoch=epoch, seq=seq, type="stored", tier="device", blocks=[seq])
            got = await index.apply(ev)
            old = position.get(inst)
            if old is None:
                want = "gap"
            elif (epoch, seq) <= old:
                want = "duplicate"
            elif epoch == old[0] and seq == old[1] + 1:
                want = "applied"
                position[inst] = (epoch, seq)
            else:
                want = "gap"
            assert got == want, (inst, epoch, seq, old)

    asyncio.run(go())
