"""MemoryIndex bookkeeping that tests/process/test_index.py does not reach (router/index/memory.py):
the default tier of apply_sync, which instances `maintain` forgets, and a cleared instance's position."""

from kvroute.router.contract.protocol import KVEvent
from kvroute.router.index.memory import MemoryIndex


def blocks(index, chain):
    return {inst: dict(m.by_tier) for inst, m in index.lookup_sync(chain).items()}


def test_apply_sync_stores_on_the_device_tier_by_default():
    index = MemoryIndex()
    index.apply_sync("a", "stored", [1, 2])
    assert blocks(index, [1, 2]) == {"a": {"device": 2}}


async def test_an_unordered_add_counts_as_seen_and_is_forgotten_once_stale():
    index = MemoryIndex()
    await index.add("a", "device", [1, 2])
    await index.maintain([], ttl_s=60.0)
    assert blocks(index, [1, 2]) == {"a": {"device": 2}}
    await index.maintain([], ttl_s=-1.0)  # everything seen before a second from now is stale
    assert blocks(index, [1, 2]) == {}


async def test_an_applied_event_counts_as_seen():
    index = MemoryIndex()
    assert await index.replace("a", 1, 5, {"device": [1]})
    event = KVEvent(instance="a", epoch=1, seq=6, type="stored", tier="device", blocks=(2,))
    assert await index.apply(event) == "applied"
    await index.maintain([], ttl_s=60.0)
    assert blocks(index, [1, 2]) == {"a": {"device": 2}}
    await index.maintain([], ttl_s=-1.0)
    assert blocks(index, [1, 2]) == {}


async def test_a_cleared_instance_has_no_position_left():
    index = MemoryIndex()
    assert await index.replace("a", 1, 5, {"device": [1]})
    await index.clear("a")
    assert await index.apply(KVEvent(instance="a", epoch=1, seq=6, type="stored", tier="device", blocks=(2,))) == "gap"
    assert blocks(index, [1]) == {}
