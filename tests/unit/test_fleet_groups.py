"""Routable groups follow their own fleet's changes: each Cluster counts its own Generation."""

from kvroute.router.fleet.instance import EngineInfo
from tests.support.fleets import fleet


def test_a_change_regroups_its_own_fleet_only():
    a, b = fleet(), fleet()
    group_a, group_b = a.group("m"), b.group("m")
    assert [i.id for i in group_a.members] == ["e0", "e1"]
    before = b.generation.value
    a.instances[0].reachable = False
    assert b.generation.value == before and b.group("m") is group_b  # b's groups are not rebuilt
    assert [i.id for i in a.group("m").members] == ["e1"]


def test_joining_and_leaving_regroup():
    a = fleet(1)
    assert [i.id for i in a.group("m").members] == ["e0"]
    inst, created = a.add("http://127.0.0.1:9100", "admin")
    assert created and inst.generation is a.generation
    inst.info = EngineInfo("e9", "m", 16, 0, "fp")
    inst.healthy = inst.reachable = True
    assert sorted(i.id for i in a.group("m").members) == ["e0", "e9"]


def test_an_unchanged_value_does_not_regroup():
    a = fleet()
    group = a.group("m")
    a.instances[0].reachable = True  # already so
    assert a.group("m") is group
