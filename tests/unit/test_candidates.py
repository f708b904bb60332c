"""Candidates per decision (router/decision/candidates.py): index holders, recent senders, the K least loaded."""

from kvroute.router.decision.candidates import LeastLoaded, RecentSenders, pick


def test_least_loaded_follows_in_flight_counts():
    load = LeastLoaded("abcdef")
    for member, level in (("a", 3), ("b", 1), ("c", 0), ("d", 2), ("e", 0), ("f", 5)):
        load.set(member, level)
    assert load.least(3) == ["c", "e", "b"]
    load.set("c", 4)
    assert load.least(3) == ["e", "b", "d"]
    assert load.least(2, skip={"e": None}) == ["b", "d"]
    load.discard("b")
    assert load.least(10) == ["e", "d", "a", "c", "f"] and "b" not in load


def test_recent_senders_expire():
    recent = RecentSenders(ttl_s=2.0)
    recent.record(11, "a", now=0.0)
    recent.record(11, "b", now=1.0)
    assert list(recent.match(11, now=1.5)) == ["a", "b"]
    assert list(recent.match(11, now=2.5)) == ["b"]
    recent.record(11, "b", now=2.6)  # renewed: the old expiry does not drop it
    assert list(recent.match(11, now=3.5)) == ["b"]
    assert list(recent.match(11, now=5.0)) == []


def test_recent_senders_stay_bounded_without_matches():
    """A fleet at or below the fast-candidate k only records: the table must not grow per request."""
    recent = RecentSenders(ttl_s=1.0)
    for i in range(10_000):
        recent.record(i, "a", now=i * 0.01)
    assert len(recent) <= 101


def test_pick_is_holders_then_recent_then_least_loaded_each_once():
    load = LeastLoaded(["h1", "r1", "x", "y", "z"])
    load.set("h1", 9)
    load.set("z", 1)
    assert pick(["h1"], ["r1", "h1"], load, 2) == ["h1", "r1", "x", "y"]
