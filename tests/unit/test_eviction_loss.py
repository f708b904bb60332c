"""expected_loss at its edges (router/decision/scoring/eviction.py): which LRU depths a
placement evicts, how stale idle times age, and blocks beyond the evictable ones."""

import pytest

from kvroute.router.decision.base import InstanceState
from kvroute.router.decision.scoring.eviction import expected_loss


def reuse(idle):
    return 1.0 / (1.0 + idle)


def state(free, evictable, measured_at=100.0):
    return InstanceState("i", kv_free_blocks=free, kv_evictable=tuple(evictable), kv_measured_at=measured_at)


def test_one_block_into_a_full_pool_evicts_the_lru_block():
    assert expected_loss(state(0, [(1, 5.0)]), need=1, ahead=0, now=100.0, reuse=reuse) == pytest.approx(1 / 6)


def test_free_blocks_are_taken_first():
    # 2 free, 3 needed: the third evicts depth 0 only
    assert expected_loss(state(2, [(4, 1.0)]), need=3, ahead=0, now=100.0, reuse=reuse) == pytest.approx(0.5)
    assert expected_loss(state(3, [(4, 1.0)]), need=3, ahead=0, now=100.0, reuse=reuse) == 0.0


def test_victims_span_entries_after_the_blocks_queued_ahead():
    # depths [1, 5): one block of the first entry, both of the second, one of the third
    loss = expected_loss(state(1, [(2, 1.0), (2, 2.0), (2, 3.0)]), need=4, ahead=2, now=100.0, reuse=reuse)
    assert loss == pytest.approx(1 / 2 + 2 / 3 + 1 / 4)


def test_idle_times_age_by_the_time_since_they_were_measured():
    loss = expected_loss(state(0, [(1, 1.0), (1, 2.0)], measured_at=99.5), need=2, ahead=0, now=100.0, reuse=reuse)
    assert loss == pytest.approx(1 / 2.5 + 1 / 3.5)


def test_a_measurement_from_the_future_does_not_age_them_backwards():
    loss = expected_loss(state(0, [(1, 1.0), (1, 2.0)], measured_at=101.0), need=2, ahead=0, now=100.0, reuse=reuse)
    assert loss == pytest.approx(1 / 2 + 1 / 3)


def test_depths_beyond_the_evictable_blocks_count_one_each():
    assert expected_loss(state(0, [(2, 1.0)]), need=2, ahead=5, now=100.0, reuse=reuse) == 2.0
    assert expected_loss(state(0, [(2, 1.0)]), need=3, ahead=1, now=100.0, reuse=reuse) == pytest.approx(0.5 + 2)
    assert expected_loss(state(0, []), need=3, ahead=0, now=100.0, reuse=reuse) == 3.0


def test_no_profile_or_no_need_costs_nothing():
    assert expected_loss(state(-1, [(4, 0.0)]), need=3, ahead=0, now=100.0, reuse=reuse) == 0.0
    assert expected_loss(state(0, [(4, 0.0)]), need=0, ahead=0, now=100.0, reuse=reuse) == 0.0
