"""ReuseHistory (router/decision/scoring/reuse.py) term by term: which blocks are sampled, reuse gaps,
open (censored) intervals and intervals that ended unused, the half-life weights and their rescaling,
when the table is rebuilt, and the curve read from it."""

import math

import pytest

from kvroute.router.decision.scoring.reuse import EDGES, ReuseHistory


def edge(k: int) -> float:
    return EDGES[k]


ONE_S = 24  # EDGES[24] == 1.0 s; EDGES[k] == 10 ** ((k - 24) / 8)
FLAT = 1e12  # a half-life so long that every interval weighs the same


def test_the_edges_are_log_spaced_eight_a_decade():
    assert edge(ONE_S) == 1.0 and edge(ONE_S + 8) == pytest.approx(10.0)
    assert edge(0) == pytest.approx(1e-3) and edge(len(EDGES) - 1) == pytest.approx(1e5)


def test_no_history_is_no_known_value():
    h = ReuseHistory(sample=1)
    assert h.table(0.0) == [0.0] * len(EDGES)
    assert h.reuse(1.0, 0.0) == 0.0
    h.observe([], 0.0)  # a request with no blocks starts the clock but holds nothing
    assert h.table(1.0) == [0.0] * len(EDGES)


def test_a_block_asked_for_again_after_one_second():
    h = ReuseHistory(sample=1)
    h.observe([7], 0.0)
    h.observe([7], 1.0)  # a gap of 1 s; the block is open again, idle 0
    table = h.table(1.0)
    assert table[:ONE_S + 1] == [1.0] * (ONE_S + 1)  # the gap falls in [1 s, EDGES[25])
    assert table[ONE_S + 1:] == [0.0] * (len(EDGES) - ONE_S - 1)
    assert h.reuse(0.5, 1.0) == 1.0 and h.reuse(2.0, 1.0) == 0.0


def test_open_intervals_older_than_the_idle_time_are_at_risk():
    h = ReuseHistory(sample=1, halflife_s=FLAT)
    h.observe([7], 0.0)
    h.observe([7, 9], 1.0)  # 7 reused after 1 s; 9 opens at 1 s
    h.observe([11], 5.0)  # 7 and 9 stay open, idle 4 s at t=5
    table = h.table(5.0)
    # below 1 s: one gap later than that, and the two blocks open for 4 s may still be reused
    assert table[ONE_S - 8] == pytest.approx(1 / 3)
    assert table[ONE_S + 8] == 0.0  # nothing idle for 10 s was asked for again


def test_a_block_past_the_window_ended_unused():
    h = ReuseHistory(sample=1, halflife_s=FLAT, window_s=10.0)
    h.observe([7], 0.0)
    h.observe([7], 1.0)  # 7: a 1 s gap, then open since 1
    h.observe([9], 2.0)  # 9: open since 2
    h.observe([], 11.5)  # 7 is past the window (10.5 s idle), 9 is not (9.5 s)
    table = h.table(11.5)
    # reuse after 0.1 s idle: the 1 s gap / (that gap + 7 ended unused + 9 still open, idle 9.5 s)
    assert table[ONE_S - 8] == pytest.approx(1 / 3)
    h.observe([], 12.5)  # 9 has gone unused for longer than the window too
    assert h.table(12.5)[ONE_S - 8] == pytest.approx(1 / 3)  # still two of three ended unused
    assert h.table(12.5)[ONE_S + 8] == 0.0


def test_a_block_pushed_out_by_capacity_ended_unused():
    h = ReuseHistory(sample=1, halflife_s=FLAT, capacity=2)
    h.observe([7], 0.0)
    h.observe([7], 1.0)  # one gap
    h.observe([9, 11], 1.0)  # three blocks seen: the oldest (7) goes
    h.observe([9], 2.0)  # 9 reused after 1 s: it was kept
    table = h.table(2.0)
    # at 0.1 s: two gaps / (two gaps + 7 ended unused + 11 open 1 s)
    assert table[ONE_S - 8] == pytest.approx(2 / 4)


def test_only_sampled_hashes_count_and_a_hash_twice_counts_once():
    h = ReuseHistory(sample=4)
    h.observe([1, 2, 3, 5], 0.0)
    h.observe([1, 2, 3, 5], 1.0)
    assert h.table(1.0) == [0.0] * len(EDGES)  # none is a multiple of 4
    h = ReuseHistory(sample=4)
    h.observe([8, 8, 1], 0.0)
    h.observe([8], 1.0)
    assert h.reuse(0.5, 1.0) == 1.0  # one open interval for 8, closed by the gap: nothing else at risk


def test_a_chains_blocks_move_together_in_the_profile():
    h = ReuseHistory(sample=1, halflife_s=FLAT)
    h.observe([1, 2, 3], 0.0)
    h.observe([4], 1.0)
    h.observe([1, 2, 3], 2.0)  # three 2 s gaps; 4 open 1 s, 1-3 open 0 s
    table = h.table(2.0)
    assert table[ONE_S - 8] == pytest.approx(3 / 4)
    assert table[ONE_S + 1] == pytest.approx(3 / 3)  # past 4's 1 s only the gaps are at risk
    assert table[ONE_S + 8] == 0.0


def test_recent_intervals_weigh_more_by_the_half_life():
    h = ReuseHistory(sample=1, halflife_s=100.0, window_s=1000.0)
    h.observe([1], 0.0)
    h.observe([1], 1.0)  # a 1 s gap that started at 0: weight 1
    h.observe([2], 100.0)
    h.observe([2], 110.0)  # a 10 s gap that started at 100: weight 2
    table = h.table(110.0)
    open_1 = 2 ** (1 / 100)  # 1 is open since 1 s (idle 109 s)
    # at EDGES[30] (5.6 s): only the 10 s gap is later; 1's open interval is at risk
    assert table[30] == pytest.approx(2 / (2 + open_1))
    # at EDGES[20] (0.32 s): both gaps are later
    assert table[20] == pytest.approx(3 / (3 + open_1))


def test_weights_rescaled_after_many_half_lives_give_the_same_curve():
    h = ReuseHistory(sample=1, halflife_s=1.0, window_s=1e9)
    h.observe([1], 0.0)
    h.observe([1], 1.0)  # a 1 s gap that started at 0, weight 1
    h.observe([2], 10.0)  # 2 opens at 10
    h.observe([3], 70.0)  # 70 half-lives after the start: every weight is rescaled
    h.observe([3], 75.0)  # a 5 s gap that started at 70
    table = h.table(75.0)
    w_gap1, w_gap3 = 2.0 ** -75, 2.0 ** -5  # relative to now
    w_open1, w_open2 = 2.0 ** (1 - 75), 2.0 ** (10 - 75)
    assert table[20] == pytest.approx((w_gap1 + w_gap3) / (w_gap1 + w_gap3 + w_open1 + w_open2), rel=1e-9)
    assert table[28] == pytest.approx(w_gap3 / (w_gap3 + w_open1 + w_open2), rel=1e-9)  # 3.2 s


def test_the_table_is_rebuilt_after_refresh_s_or_refresh_after_new_blocks():
    h = ReuseHistory(sample=1, halflife_s=FLAT, refresh_s=10.0, refresh_after=3)
    h.observe([1], 0.0)
    assert h.table(0.0) == [0.0] * len(EDGES)  # built at 0: nothing reused yet
    h.observe([1], 1.0)
    assert h.table(1.0) == [0.0] * len(EDGES)  # two new blocks since, 1 s: not rebuilt
    assert h.reuse(0.5, 9.9) == 0.0
    assert h.reuse(0.5, 10.0) > 0.0  # refresh_s after the build
    h.observe([2], 10.0)
    h.observe([2], 11.0)
    assert h.table(11.0)[ONE_S - 8] == pytest.approx(1 / 2)  # still the table of t=10: 1 gap, 1 open 9 s
    h.observe([3], 11.0)  # the third new block since the build: rebuilt at once
    assert h.table(11.0)[ONE_S - 8] == pytest.approx(2 / 3)  # 2's gap now counts; 2 and 3 are idle 0


def test_the_curve_interpolates_in_log_idle_between_the_edges():
    h = ReuseHistory(sample=1)
    h.observe([1, 2], 0.0)
    h.observe([1], 1.0)
    h.observe([2], 100.0)  # gaps of 1 s and 100 s
    now = 100.0
    table, reuse = h.table(now), h.curve(now)
    k = ONE_S  # the 1 s gap is later than EDGES[24], not than EDGES[25]
    mid = math.sqrt(edge(k) * edge(k + 1))  # halfway in log
    assert table[k] != table[k + 1]
    assert reuse(mid) == pytest.approx((table[k] + table[k + 1]) / 2)
    assert reuse(edge(k)) == pytest.approx(table[k])
    assert reuse(edge(0) / 10) == table[0] and reuse(edge(0)) == table[0]
    assert reuse(1e7) == table[-1] and reuse(edge(len(EDGES) - 1) * 1.0001) == table[-1]
    assert h.curve(now) is reuse  # the same table: the same curve
    h.observe([3], now)
    h.observe([3], now + 1.0)
    assert h.curve(now + 1.0) is not reuse


@pytest.mark.parametrize("kw", [dict(sample=0), dict(window_s=0.0), dict(halflife_s=0.0), dict(capacity=0)])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError, match="sample and capacity must be >= 1"):
        ReuseHistory(**kw)


def test_the_smallest_parameters_are_taken():
    h = ReuseHistory(sample=1, window_s=0.5, halflife_s=0.5, capacity=1)
    h.observe([1], 0.0)
    h.observe([1], 0.25)
    assert h.reuse(0.1, 0.25) == 1.0


def test_a_block_past_the_window_counts_at_every_idle_time_an_open_one_only_below_its_own():
    h = ReuseHistory(sample=1, halflife_s=FLAT, window_s=10.0)
    h.observe([1], 0.0)
    h.observe([2], 5.0)
    h.observe([1], 20.0)  # 1 reused after 20 s (no request in between to end it); 2 idle 15 s: ended unused
    # at EDGES[34] (17.8 s): the 20 s gap / (that gap + 2, which ended unused); still open, 2 would
    # not count there (idle 15 s < 17.8 s)
    assert h.table(20.0)[34] == pytest.approx(1 / 2)


def test_a_gap_just_over_a_millisecond_is_in_the_first_bin():
    h = ReuseHistory(sample=1, halflife_s=FLAT)
    h.observe([1], 0.0)
    h.observe([1], 0.0012)  # between EDGES[0] (1 ms) and EDGES[1] (1.33 ms)
    table = h.table(0.0012)
    assert table[0] == 1.0 and table[1] == 0.0
    assert h.curve(0.0012)(0.0005) == 1.0  # below the first edge: the first edge's value


def test_the_curve_between_the_last_two_edges_and_beyond_them():
    h = ReuseHistory(sample=1, halflife_s=FLAT, window_s=1e6)
    h.observe([1], 0.0)
    h.observe([1], 80_000.0)  # a gap between EDGES[63] (74,989 s) and EDGES[64] (100,000 s)
    table, reuse = h.table(80_000.0), h.curve(80_000.0)
    assert table[63] == 1.0 and table[64] == 0.0
    mid = math.sqrt(edge(63) * edge(64))
    assert reuse(mid) == pytest.approx(0.5)
    assert reuse(1e6) == 0.0


def test_rescaled_weights_keep_old_and_new_intervals_in_proportion():
    h = ReuseHistory(sample=1, halflife_s=1.0, window_s=3.0)
    h.observe([9], 0.0)
    h.observe([8], 61.0)  # 9 ends unused: weight 2 ** 0
    h.observe([2], 64.0)
    h.observe([2], 64.5)  # a 0.5 s gap started at 64; 8 ends unused (idle 3.5 s): weight 2 ** 61
    h.observe([3], 65.0)  # past 64 half-lives: every weight so far is rescaled
    h.observe([4], 66.0)
    h.observe([4], 66.5)  # a 0.5 s gap started at 66
    def w(t):  # any reference time gives the same proportions
        return 2.0 ** (t - 65.0)

    gaps, never = w(64.0) + w(66.0), w(0.0) + w(61.0)
    open_2, open_3 = w(64.5), w(65.0)  # idle 2 s and 1.5 s; 4 is idle 0
    assert h.table(66.5)[20] == pytest.approx(gaps / (gaps + never + open_2 + open_3), rel=1e-9)


def test_weights_stay_finite_over_many_thousand_half_lives():
    h = ReuseHistory(sample=1, halflife_s=0.001, window_s=1e9)
    for i in range(30):
        h.observe([1, 2], i * 0.5)  # 500 half-lives apart: 2 ** 500 per step without the rescaling
    assert h.table(14.5)[ONE_S - 8] == pytest.approx(1.0)
