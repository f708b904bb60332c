"""The idle-age profile of evictable blocks that engines report at GET /load."""

import random

import pytest

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.prefix_hit import PrefixHit
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.router.contract.idle_ages import IdleAges
from tests.support.clock import FakeClock

BS = 4


def test_profile_follows_adds_and_removes_at_bounded_size():
    ages = IdleAges(max_buckets=4)
    live: list[float] = []
    rng = random.Random(1)
    for step in range(2000):
        t = step * 0.01
        if live and rng.random() < 0.4:
            victim = live.pop(0) if rng.random() < 0.5 else live.pop(rng.randrange(len(live)))
            ages.remove(victim)
        else:
            ages.add(t)
            live.append(t)
        profile = ages.profile(t)
        assert len(profile) <= 4
        assert sum(n for n, _ in profile) == len(live) == ages.total
    now = 20.0
    profile = ages.profile(now)
    idle = [a for _, a in profile]
    assert idle == sorted(idle, reverse=True)  # oldest bucket first
    assert idle[0] == pytest.approx(now - sum(sorted(live)[: profile[0][0]]) / profile[0][0])


def test_many_at_once_is_many_one_at_a_time():
    """add(t, n) and remove(t, n) (the router's reuse history: a chain's sampled blocks at once) keep the
    same totals and sums as n single calls, also when blocks added at t sit in a bucket that starts
    before t and a later bucket starts at t."""
    batch, single = IdleAges(max_buckets=4), IdleAges(max_buckets=4)
    for t, n in ((0.0, 100), (1.0, 10), (2.0, 5), (2.0, 40), (2.0, 1), (3.0, 4)):
        batch.add(t, n)
        for _ in range(n):
            single.add(t)
    assert batch._starts[-2:] == [1.0, 2.0] and batch._counts[-2] > 10  # some of t=2's blocks start at 1
    for t, n in ((2.0, 46), (3.0, 4), (1.0, 10)):
        batch.remove(t, n)
        for _ in range(n):
            single.remove(t)
        assert batch.total == single.total
        assert sum(batch._sums) == pytest.approx(sum(single._sums))
    assert batch.total == 100
    with pytest.raises(ValueError):
        batch.remove(-1.0, 1)


def test_remove_of_unknown_time_is_refused():
    ages = IdleAges()
    ages.add(5.0)
    with pytest.raises(ValueError):
        ages.remove(1.0)


def test_block_manager_reports_free_and_evictable_by_idle_age():
    clock = FakeClock()
    clock.now = 0.0
    bm = BlockManager(8, BS, clock=clock)
    assert bm.kv_load() == (8, ())
    a = Sequence("a", list(range(8)), SamplingParams(max_tokens=1), 7)
    bm.allocate(a, PrefixHit())
    a.num_computed = 8
    bm.commit_computed(a)
    bm.free(a)  # 2 cached blocks, freed at t=0
    clock.now = 10.0
    b = Sequence("b", list(range(100, 108)), SamplingParams(max_tokens=1), 7)
    bm.allocate(b, PrefixHit())
    b.num_computed = 8
    bm.commit_computed(b)
    bm.free(b)  # 2 more, freed at t=10
    clock.now = 12.0
    free, evictable = bm.kv_load()
    assert free == 4
    assert evictable == ((2, 12.0), (2, 2.0))  # the next evicted (a's blocks) first
    hit = Sequence("c", list(range(8)) + [1], SamplingParams(max_tokens=1), 7)
    bm.allocate(hit, bm.match_prefix(hit))  # takes a's 2 blocks back out of the LRU, plus 1 free block
    free, evictable = bm.kv_load()
    assert free == 3 and evictable == ((2, 2.0),)
    bm.clear_cache()
    assert bm.kv_load()[1] == ()
