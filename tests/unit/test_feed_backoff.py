"""The ZeroMQ feed supervisor's restart backoff (router/kvevents/follower.py `restart_delay`)."""

from kvroute.router.kvevents.follower import HEALTHY_RUN_S, RESTART_MAX_S, RESTART_MIN_S, restart_delay


def test_doubles_while_the_feed_keeps_failing_fast_up_to_the_cap():
    delays, last = [], None
    for _ in range(10):
        last = restart_delay(last, ran_s=0.5)
        delays.append(last)
    assert delays[:4] == [RESTART_MIN_S, 2 * RESTART_MIN_S, 4 * RESTART_MIN_S, 8 * RESTART_MIN_S]
    assert max(delays) == delays[-1] == RESTART_MAX_S


def test_a_feed_that_ran_healthy_for_a_while_starts_over():
    assert restart_delay(RESTART_MAX_S, ran_s=HEALTHY_RUN_S) == RESTART_MIN_S
    assert restart_delay(RESTART_MAX_S, ran_s=HEALTHY_RUN_S - 1) == RESTART_MAX_S
