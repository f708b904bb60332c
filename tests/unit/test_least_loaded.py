"""LeastLoaded's buckets at their edges (router/decision/candidates.py): the default level, a
member added below the lowest level seen, empty levels skipped, an emptied set."""

from kvroute.router.decision.candidates import LeastLoaded


def test_members_without_a_level_start_at_zero_in_arrival_order():
    load = LeastLoaded(["a", "b"])
    load.add("c")
    load.add("d", 0)
    assert load.least(4) == ["a", "b", "c", "d"]
    load.set("a", 1)
    assert load.least(4) == ["b", "c", "d", "a"]


def test_a_member_below_the_lowest_level_seen_comes_first():
    load = LeastLoaded(["a"])
    load.set("a", 3)
    assert load.least(1) == ["a"]  # skips levels 0-2
    load.add("b", 1)
    assert load.least(2) == ["b", "a"]


def test_empty_levels_are_skipped_in_order():
    load = LeastLoaded(["x", "y", "z"], level_of={"x": 2, "y": 1, "z": 4}.get)
    assert load.least(1) == ["y"] and load.least(3) == ["y", "x", "z"]
    assert LeastLoaded(["x"], level_of={"x": 2}.get).least(2) == ["x"]


def test_an_emptied_set_offers_nobody():
    load = LeastLoaded(["a"])
    load.discard("a")
    assert load.least(1) == [] and len(load) == 0 and "a" not in load
