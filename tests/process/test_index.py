"""One suite for every BlockIndex backend, then what only Redis or the wrapper promise."""

import asyncio
import random
import signal

import pytest
import redis
from prometheus_client import CollectorRegistry

from kvroute.router.contract.protocol import TIERS, KVEvent
from kvroute.router.contract.tier_costs import store_owner
from kvroute.router.index import (
    INDEXES,
    BreakerIndex,
    IndexUnavailable,
    InstrumentedIndex,
    MemoryIndex,
    RedisIndex,
    make_index,
)
from kvroute.router.index.redis import GC_CHUNK, WRITE_CHUNK, pack
from tests.support.redis_server import RedisServer, free_port

CHAIN = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(1, 41)]  # spread over the u64 range


@pytest.fixture(params=sorted(INDEXES))
async def index(request):
    options = {"url": request.getfixturevalue("redis_url")} if request.param == "redis" else {}
    idx = make_index(request.param, **options)
    yield idx
    await idx.close()


def by_tier(result):
    return {inst: dict(m.by_tier) for inst, m in result.items()}


def reference_lookup(entries, chain):
    """Brute force over {(block, instance): set(tiers)}."""
    if not chain:
        return {}
    out = {}
    for inst in {i for (b, i) in entries if b == chain[0]}:
        counts = {}
        for b in chain:
            tiers = entries.get((b, inst))
            if not tiers:
                break
            best = min(tiers, key=TIERS.index)
            counts[best] = counts.get(best, 0) + 1
        out[inst] = counts
    return out


async def test_lookup_counts_each_instances_prefix(index):
    await index.add("a", "device", CHAIN[:5])
    await index.add("b", "device", CHAIN[:3])
    assert by_tier(await index.lookup(CHAIN[:8])) == {"a": {"device": 5}, "b": {"device": 3}}
    result = await index.lookup(CHAIN[:2])
    assert result["a"].blocks == 2 and result["a"].tokens(16) == 32


async def test_prefix_stops_at_first_gap(index):
    await index.add("a", "device", CHAIN[:2] + CHAIN[3:10])
    assert by_tier(await index.lookup(CHAIN[:10])) == {"a": {"device": 2}}


async def test_instance_without_first_block_is_omitted(index):
    await index.add("a", "device", CHAIN[1:10])
    await index.add("b", "device", CHAIN[:1])
    assert by_tier(await index.lookup(CHAIN[:10])) == {"b": {"device": 1}}


async def test_blocks_count_under_their_best_tier(index):
    await index.add("a", "host", CHAIN[:4])
    await index.add("a", "device", CHAIN[:2])
    await index.add("a", "remote", CHAIN[:6])
    assert by_tier(await index.lookup(CHAIN[:8])) == {"a": {"device": 2, "host": 2, "remote": 2}}


async def test_remove_one_tier_keeps_the_other(index):
    await index.add("a", "device", CHAIN[:4])
    await index.add("a", "host", CHAIN[:4])
    await index.remove("a", "device", CHAIN[:4])
    assert by_tier(await index.lookup(CHAIN[:4])) == {"a": {"host": 4}}
    assert await index.size() == 4
    await index.remove("a", "host", CHAIN[2:3])
    assert by_tier(await index.lookup(CHAIN[:4])) == {"a": {"host": 2}}
    assert await index.size() == 3


async def test_remove_of_a_tier_not_held_changes_nothing(index):
    await index.add("a", "device", CHAIN[:3])
    await index.remove("a", "host", CHAIN[:3])
    await index.remove("zz", "device", CHAIN[:3])
    assert by_tier(await index.lookup(CHAIN[:3])) == {"a": {"device": 3}}
    assert await index.size() == 3


async def test_clear_forgets_only_that_instance(index):
    await index.add("a", "device", CHAIN[:6])
    await index.add("a", "host", CHAIN[6:9])
    await index.add("b", "host", CHAIN[:3])
    await index.clear("a")
    assert by_tier(await index.lookup(CHAIN[:9])) == {"b": {"host": 3}}
    assert await index.size() == 3
    await index.clear("never-seen")
    await index.clear("b")
    assert await index.lookup(CHAIN[:9]) == {}
    assert await index.size() == 0


async def test_empty_and_unknown_chains_match_nothing(index):
    await index.add("a", "device", CHAIN[:3])
    assert await index.lookup([]) == {}
    assert await index.lookup([12345]) == {}
    assert await index.lookup([12345] + CHAIN[:3]) == {}


async def test_size_counts_block_instance_entries(index):
    assert await index.size() == 0
    await index.add("a", "device", CHAIN[:5])
    await index.add("a", "host", CHAIN[:5])  # another tier of the same entries
    await index.add("a", "device", CHAIN[:5])  # again
    await index.add("b", "device", CHAIN[3:7])
    assert await index.size() == 9


async def test_extreme_hash_values_round_trip(index):
    chain = [0, 2**64 - 1, 2**63, 2**53 + 1]
    await index.add("a", "device", chain)
    assert by_tier(await index.lookup(chain)) == {"a": {"device": 4}}
    assert await index.lookup([2**53]) == {}


async def test_unknown_tier_is_refused(index):
    with pytest.raises(ValueError, match="tier"):
        await index.add("a", "gpu", CHAIN[:1])


def ev(seq, type, epoch=1, instance="e1", **kw):
    return KVEvent(instance=instance, epoch=epoch, seq=seq, type=type, **kw)


async def test_apply_maps_each_event_type(index):
    assert await index.replace("e1", 1, 0, {}) is True
    assert await index.apply(ev(1, "stored", blocks=tuple(CHAIN[:4]))) == "applied"
    assert await index.apply(ev(2, "stored", tier="host", blocks=tuple(CHAIN[:6]))) == "applied"
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"device": 4, "host": 2}}
    assert await index.apply(ev(3, "removed", blocks=tuple(CHAIN[:2]))) == "applied"
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"host": 4, "device": 2}}
    assert await index.apply(ev(4, "cleared")) == "applied"
    assert await index.lookup(CHAIN[:6]) == {} and await index.size() == 0
    assert await index.apply(ev(5, "stored", blocks=tuple(CHAIN[:1]))) == "applied"
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"device": 1}}


async def test_shared_store_events_order_the_instance_and_fill_the_stores_owner(index):
    owner = store_owner("S#ns")
    assert await index.replace("e1", 1, 0, {"device": CHAIN[:2]}) is True
    stored = ev(1, "stored", tier="remote", blocks=tuple(CHAIN[:5]), store="S#ns")
    assert await index.apply(stored) == "applied"
    assert by_tier(await index.lookup(CHAIN[:5])) == {"e1": {"device": 2}, owner: {"remote": 5}}
    assert await index.apply(stored) == "duplicate"  # another replica's copy: the watermark moved
    assert await index.apply(ev(2, "removed", tier="remote", blocks=tuple(CHAIN[3:5]), store="S#ns")) == "applied"
    assert await index.apply(ev(3, "cleared")) == "applied"  # an engine restart never clears the store
    assert by_tier(await index.lookup(CHAIN[:5])) == {owner: {"remote": 3}}
    assert await index.apply(ev(5, "stored", tier="remote", blocks=tuple(CHAIN[:1]), store="S#ns")) == "gap"


async def test_writes_are_ordered_per_instance(index):
    assert await index.apply(ev(1, "stored", blocks=tuple(CHAIN[:3]))) == "gap"  # no snapshot yet
    await index.replace("e1", 1, 0, {})
    assert await index.apply(ev(1, "stored", blocks=tuple(CHAIN[:3]))) == "applied"
    assert await index.apply(ev(2, "removed", blocks=tuple(CHAIN[:3]))) == "applied"
    # a lagging replica delivers seq 1 again, after the removal: it must not bring the blocks back
    assert await index.apply(ev(1, "stored", blocks=tuple(CHAIN[:3]))) == "duplicate"
    assert await index.lookup(CHAIN[:3]) == {}
    assert await index.apply(ev(4, "stored", blocks=tuple(CHAIN[:3]))) == "gap"  # seq 3 is missing
    assert await index.apply(ev(1, "stored", epoch=0, blocks=tuple(CHAIN[:3]))) == "duplicate"  # older epoch
    assert await index.apply(ev(1, "stored", epoch=2, blocks=tuple(CHAIN[:3]))) == "gap"  # restarted engine
    assert await index.lookup(CHAIN[:3]) == {}


async def test_replace_swaps_a_snapshot_in_unless_the_index_is_newer(index):
    await index.replace("e1", 1, 0, {"device": CHAIN[:2]})
    await index.apply(ev(1, "stored", blocks=tuple(CHAIN[2:4])))
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"device": 4}}
    assert await index.replace("e1", 1, 1, {"device": CHAIN[:1]}) is False  # another replica is past seq 1
    assert await index.replace("e1", 1, 0, {"device": CHAIN[:1]}) is False
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"device": 4}}
    assert await index.replace("e1", 1, 5, {"device": CHAIN[:5], "host": CHAIN[:1]}) is True
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"device": 5}}
    assert await index.apply(ev(4, "stored", blocks=tuple(CHAIN[5:6]))) == "duplicate"
    assert await index.apply(ev(6, "stored", blocks=tuple(CHAIN[5:6]))) == "applied"
    assert await index.replace("e1", 2, 0, {"host": CHAIN[:3]}) is True  # a new epoch always replaces
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"host": 3}}
    assert await index.size() == 3


async def test_maintain_forgets_only_instances_nobody_saw(index):
    await index.replace("a", 1, 0, {"device": CHAIN[:3]})
    await index.replace("b", 1, 0, {"device": CHAIN[:3]})
    await asyncio.sleep(0.25)
    await index.maintain(["a"], ttl_s=0.2)  # a is seen; b was last seen 0.25 s ago
    assert by_tier(await index.lookup(CHAIN[:3])) == {"a": {"device": 3}}
    assert await index.size() == 3
    await index.maintain(["a"], ttl_s=60)
    assert by_tier(await index.lookup(CHAIN[:3])) == {"a": {"device": 3}}


async def test_large_chain_with_many_instances(index):
    chain = [random.Random(7).getrandbits(64) for _ in range(1000)]
    chain = [(h + i) % 2**64 for i, h in enumerate(chain)]
    entries = {}
    for k in range(64):
        inst, n = f"e{k}", min(1000, 10 + 16 * k)
        tier = TIERS[k % 3]
        await index.add(inst, tier, chain[:n])
        await index.add(inst, "device", chain[: n // 2])
        for b in chain[:n]:
            entries.setdefault((b, inst), set()).add(tier)
        for b in chain[: n // 2]:
            entries[(b, inst)].add("device")
    assert by_tier(await index.lookup(chain)) == reference_lookup(entries, chain)
    assert await index.size() == len(entries)


async def test_random_operations_match_a_reference(index):
    rng = random.Random(1)
    chain = CHAIN[:12]
    entries = {}
    for _ in range(300):
        inst, tier = rng.choice("abcd"), rng.choice(TIERS)
        lo = rng.randrange(len(chain))
        blocks = chain[lo : lo + rng.randrange(1, 6)]
        op = rng.random()
        if op < 0.5:
            await index.add(inst, tier, blocks)
            for b in blocks:
                entries.setdefault((b, inst), set()).add(tier)
        elif op < 0.9:
            await index.remove(inst, tier, blocks)
            for b in blocks:
                entries.get((b, inst), set()).discard(tier)
        else:
            await index.clear(inst)
            entries = {k: v for k, v in entries.items() if k[1] != inst}
        entries = {k: v for k, v in entries.items() if v}
        start = rng.randrange(3)
        assert by_tier(await index.lookup(chain[start:])) == reference_lookup(entries, chain[start:])
        assert await index.size() == len(entries)


async def test_lookup_now_answers_as_lookup_or_leaves_it_to_lookup(index):
    """Memory answers at once, as `lookup` would; Redis says None (the caller awaits `lookup`)."""
    await index.add("a", "device", CHAIN[:4])
    await index.add("b", "host", CHAIN[:2])
    now = index.lookup_now(CHAIN[:6])
    if isinstance(index, RedisIndex):
        assert now is None
    else:
        assert by_tier(now) == by_tier(await index.lookup(CHAIN[:6])) == {"a": {"device": 4}, "b": {"host": 2}}
        assert index.lookup_now([]) == {}


async def test_lookup_now_through_the_routers_layers(redis_url):
    """Split, breaker and metrics pass a memory answer through (the local one merged, the call counted
    as a lookup); over Redis, or while the breaker is open, they answer None."""
    from kvroute.router.index.split import SplitIndex

    registry = CollectorRegistry()
    local, shared = MemoryIndex(), MemoryIndex()
    breaker = BreakerIndex(shared, failures=1, cooldown_s=60.0)
    idx = InstrumentedIndex(SplitIndex(breaker, local), registry=registry)
    shared.add_sync("a", "device", CHAIN[:3])
    local.add_sync("z", "device", CHAIN[:1])
    assert by_tier(idx.lookup_now(CHAIN[:5])) == {"a": {"device": 3}, "z": {"device": 1}}
    assert registry.get_sample_value("kvroute_index_operations_total", {"backend": "memory", "op": "lookup"}) == 1
    assert registry.get_sample_value("kvroute_index_lookup_blocks_sum", {"backend": "memory"}) == 5
    breaker.open_until = breaker.clock() + 60.0  # tripped: the awaited path refuses or probes
    assert idx.lookup_now(CHAIN[:5]) is None
    assert registry.get_sample_value("kvroute_index_operations_total", {"backend": "memory", "op": "lookup"}) == 1
    over_redis = SplitIndex(BreakerIndex(RedisIndex(redis_url), failures=1, cooldown_s=60.0), local)
    assert over_redis.lookup_now(CHAIN[:5]) is None
    await over_redis.close()


def test_memory_index_offers_sync_methods():
    idx = MemoryIndex()
    idx.add_sync("a", "device", CHAIN[:3])
    idx.add_sync("b", "host", CHAIN[:1])
    assert by_tier(idx.lookup_sync(CHAIN)) == {"a": {"device": 3}, "b": {"host": 1}}
    idx.remove_sync("a", "device", CHAIN[1:2])
    idx.clear_sync("b")
    assert by_tier(idx.lookup_sync(CHAIN)) == {"a": {"device": 1}}
    assert idx.size_sync() == 2


def test_make_index_rejects_unknown_names_and_ignores_foreign_options():
    with pytest.raises(ValueError, match="unknown index"):
        make_index("sqlite")
    assert isinstance(make_index("memory", url="redis://127.0.0.1:1/0"), MemoryIndex)
    with pytest.raises(ValueError, match="Redis URL"):
        make_index("redis", url=None)


# --- Redis only -------------------------------------------------------------------


def commandstats(r):
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def delta(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


async def test_two_redis_clients_share_one_index(redis_url):
    one, two = RedisIndex(redis_url), RedisIndex(redis_url)
    try:
        await one.add("a", "device", CHAIN[:4])
        assert by_tier(await two.lookup(CHAIN[:4])) == {"a": {"device": 4}}
        await two.clear("a")
        assert await one.lookup(CHAIN[:4]) == {} and await one.size() == 0
    finally:
        await one.close()
        await two.close()


async def test_redis_lookup_is_one_round_trip_and_stops_early(redis_url):
    idx = RedisIndex(redis_url)
    chain = [(h * 7) % 2**64 for h in range(1, 513)]
    await idx.add("a", "device", chain[:200])
    await idx.add("a", "host", chain[150:200])
    await idx.add("b", "host", chain[:5])
    await idx.lookup(chain)  # loads the script
    with redis.Redis.from_url(redis_url) as r:
        before = commandstats(r)
        result = await idx.lookup(chain)
        calls = delta(before, commandstats(r))
    await idx.close()
    assert by_tier(result) == {"a": {"device": 200}, "b": {"host": 5}}
    assert calls.pop("evalsha") == 1 and calls.pop("info") == 1
    # inside the script: the first block's holders, one generation check per holder, then each
    # holder's chain in growing chunks (32, 128, 512 blocks) up to its first missing block: a's
    # 200 blocks take three reads, b's 5 one, whatever the chain's length
    assert calls == {"hgetall": 1, "hget": 2, "hmget": 4}


async def test_redis_generation_hashes_stay_hashtables_and_size_counts_blocks_only(redis_url):
    """A small hash would be a ziplist, where each HMGET field costs a scan of the hash."""
    idx = RedisIndex(redis_url)
    await idx.add("a", "device", CHAIN[:5])
    with redis.Redis.from_url(redis_url) as r:
        (key,) = r.keys(idx.prefix + "i:*")
        assert r.object("encoding", key) == b"hashtable"
    assert await idx.size() == 5
    await idx.remove("a", "device", CHAIN[:5])
    assert await idx.size() == 0 and by_tier(await idx.lookup(CHAIN[:5])) == {}
    await idx.close()


async def test_redis_lookup_survives_a_script_flush(redis_url):
    idx = RedisIndex(redis_url)
    await idx.add("a", "device", CHAIN[:3])
    with redis.Redis.from_url(redis_url) as r:
        r.script_flush()
    assert by_tier(await idx.lookup(CHAIN[:3])) == {"a": {"device": 3}}
    await idx.close()


async def test_redis_clear_costs_own_blocks_and_never_scans(redis_url):
    idx = RedisIndex(redis_url)
    many = list(range(1, 2 * WRITE_CHUNK + 100))  # more than one chunk
    await idx.add("a", "device", many)
    await idx.add("b", "device", many[:10])
    with redis.Redis.from_url(redis_url) as r:
        before = commandstats(r)
        await idx.clear("a")
        # forgotten at once, before its garbage is collected
        assert by_tier(await idx.lookup(many[:20])) == {"b": {"device": 10}}
        await idx.maintain(["b"], ttl_s=60)
        calls = delta(before, commandstats(r))
        assert not {"scan", "keys"} & set(calls)
        # one per block hash, and one per GC chunk on a's generation hash (its blocks and '~')
        assert calls["hdel"] == len(many) + -(-(len(many) + 1) // GC_CHUNK)
        # 10 block hashes, b's generation hash and state, the generation counter, live: a's keys are gone
        assert r.dbsize() == 14, r.keys()
    assert await idx.size() == 10
    assert by_tier(await idx.lookup(many[:20])) == {"b": {"device": 10}}
    await idx.close()


async def test_redis_resync_is_invisible_until_its_swap(redis_url):
    """A snapshot being written is not visible: readers see the old entries, then the new."""
    idx = RedisIndex(redis_url)
    await idx.replace("a", 1, 0, {"device": CHAIN[:4]})
    gen = int(await idx._call("STAGE_BEGIN", "a", 1, 9, 0))
    await idx._call("STAGE_ADD", "a", gen, 1, pack(CHAIN[:1]))  # half-written snapshot
    assert by_tier(await idx.lookup(CHAIN[:8])) == {"a": {"device": 4}}
    await idx._call("STAGE_ADD", "a", gen, 1, pack(CHAIN[1:8]))
    assert by_tier(await idx.lookup(CHAIN[:8])) == {"a": {"device": 4}}
    assert int(await idx._call("STAGE_COMMIT", "a", gen, 1, 9, 0)) == 1
    assert by_tier(await idx.lookup(CHAIN[:8])) == {"a": {"device": 8}}
    await idx.close()


async def test_redis_down_raises_index_unavailable_then_recovers():
    port = free_port()
    server = RedisServer(port)
    idx = RedisIndex(server.url, timeout=0.5)
    try:
        await idx.add("a", "device", CHAIN[:2])
        server.stop()
        for call in (idx.lookup(CHAIN[:2]), idx.add("a", "device", CHAIN[:1]), idx.size()):
            with pytest.raises(IndexUnavailable):
                await call
        server = RedisServer(port)  # same port, empty
        await idx.add("a", "host", CHAIN[:2])
        assert by_tier(await idx.lookup(CHAIN[:2])) == {"a": {"host": 2}}
    finally:
        await idx.close()
        server.stop()


async def test_breaker_stops_calling_a_frozen_redis_then_recovers(redis_url):
    server = RedisServer()
    idx = BreakerIndex(RedisIndex(server.url, timeout=0.1), failures=2, cooldown_s=0.5)
    try:
        await idx.replace("a", 1, 0, {"device": CHAIN[:2]})
        server.proc.send_signal(signal.SIGSTOP)  # frozen: connections hang instead of failing
        for _ in range(2):
            with pytest.raises(IndexUnavailable):
                await idx.lookup(CHAIN[:2])
        assert idx.is_open
        for _ in range(20):  # open: refused without calling Redis (which would time out again)
            with pytest.raises(IndexUnavailable, match="circuit open"):
                await idx.lookup(CHAIN[:2])
        assert idx.consecutive == 2
        server.proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(0.6)  # cool-down over: the next call probes and closes it
        assert by_tier(await idx.lookup(CHAIN[:2])) == {"a": {"device": 2}}
        assert not idx.is_open
    finally:
        server.proc.send_signal(signal.SIGCONT)
        await idx.close()
        server.stop()


# --- the metrics wrapper ------------------------------------------------------------


async def test_instrumented_index_records_calls_errors_and_latency():
    registry = CollectorRegistry()
    idx = InstrumentedIndex(MemoryIndex(), registry=registry)
    await idx.add("a", "device", CHAIN[:3])
    assert by_tier(await idx.lookup(CHAIN[:5])) == {"a": {"device": 3}}
    await idx.lookup(CHAIN[:1])
    with pytest.raises(ValueError):
        await idx.remove("a", "gpu", CHAIN[:1])
    assert await idx.size() == 3

    def value(name, **labels):
        return registry.get_sample_value(name, {"backend": "memory", **labels})

    assert value("kvroute_index_operations_total", op="lookup") == 2
    assert value("kvroute_index_operations_total", op="add") == 1
    assert value("kvroute_index_errors_total", op="remove") == 1
    assert value("kvroute_index_errors_total", op="lookup") is None
    assert value("kvroute_index_lookup_seconds_count") == 2
    assert value("kvroute_index_lookup_blocks_sum") == 6
    await idx.close()


async def test_an_instances_indexed_block_count_leaves_out_the_shared_stores_blocks():
    """/router/instances' blocks_indexed is the instance's own blocks, after a snapshot (which puts
    the store's under its owner) and after events alike."""
    from kvroute.router.fleet.cluster import Cluster
    from kvroute.router.kvevents.engine_feed import EventSync
    from kvroute.router.service.config import RouterConfig
    from kvroute.router.service.metrics import RouterMetrics

    cluster = Cluster(RouterConfig(engines=("http://127.0.0.1:9",)), make_index("memory"), "fp", RouterMetrics())
    inst, sync = cluster.instances[0], EventSync(cluster)
    await sync.load_snapshot(inst, {"epoch": 1, "seq": 0, "store": "S#ns",
                                    "tiers": {"device": CHAIN[:2], "remote": CHAIN[:6]}})
    assert inst.blocks_indexed == 2
    await sync.apply(inst, [ev(1, "stored", instance=inst.id, blocks=tuple(CHAIN[2:4])),
                            ev(2, "stored", instance=inst.id, tier="remote", blocks=tuple(CHAIN[6:9]), store="S#ns"),
                            ev(3, "removed", instance=inst.id, tier="remote", blocks=tuple(CHAIN[:6]), store="S#ns")])
    assert inst.seq == 3 and inst.blocks_indexed == 4
    assert by_tier(await cluster.index.lookup(CHAIN[:4])) == {inst.id: {"device": 4}}
