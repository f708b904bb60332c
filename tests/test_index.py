"""One suite for every BlockIndex backend, then what only Redis or the wrapper promise."""

import random

import pytest
import redis
from prometheus_client import CollectorRegistry

from router.index import INDEXES, IndexUnavailable, InstrumentedIndex, MemoryIndex, RedisIndex, make_index
from router.index.base import apply_event
from router.index.redis import WRITE_CHUNK
from router.protocol import TIERS, KVEvent
from tests.redis_server import RedisServer, free_port

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


async def test_apply_event_maps_each_event_type(index):
    def ev(seq, type, **kw):
        return KVEvent(instance="e1", epoch=1, seq=seq, type=type, **kw)

    await apply_event(index, ev(0, "stored", blocks=tuple(CHAIN[:4])))
    await apply_event(index, ev(1, "stored", tier="host", blocks=tuple(CHAIN[:6])))
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"device": 4, "host": 2}}
    await apply_event(index, ev(2, "removed", blocks=tuple(CHAIN[:2])))
    assert by_tier(await index.lookup(CHAIN[:6])) == {"e1": {"host": 4, "device": 2}}
    await apply_event(index, ev(3, "cleared"))
    assert await index.lookup(CHAIN[:6]) == {} and await index.size() == 0


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
    await idx.add("a", "device", chain[:10])
    await idx.add("b", "host", chain[:5])
    await idx.lookup(chain)  # loads the script
    with redis.Redis.from_url(redis_url) as r:
        before = commandstats(r)
        result = await idx.lookup(chain)
        calls = delta(before, commandstats(r))
    await idx.close()
    assert by_tier(result) == {"a": {"device": 10}, "b": {"host": 5}}
    assert calls.pop("evalsha") == 1 and calls.pop("info") == 1
    assert calls == {"hgetall": 11}  # inside the script, stopping at block 10 that nobody holds


async def test_redis_lookup_survives_a_script_flush(redis_url):
    idx = RedisIndex(redis_url)
    await idx.add("a", "device", CHAIN[:3])
    with redis.Redis.from_url(redis_url) as r:
        r.script_flush()
    assert by_tier(await idx.lookup(CHAIN[:3])) == {"a": {"device": 3}}
    await idx.close()


async def test_redis_clear_costs_own_blocks_and_never_scans(redis_url):
    idx = RedisIndex(redis_url)
    many = list(range(1, 2 * WRITE_CHUNK + 100))  # more than one clear chunk
    await idx.add("a", "device", many)
    await idx.add("b", "device", many[:10])
    with redis.Redis.from_url(redis_url) as r:
        before = commandstats(r)
        await idx.clear("a")
        calls = delta(before, commandstats(r))
        assert not {"scan", "keys"} & set(calls)
        assert calls["hdel"] == len(many)
        # 10 block hashes, b's set, the entry counter: a's set and its other blocks are gone
        assert r.dbsize() == 12
        assert r.scard(idx.prefix + "i:b") == 10
    assert await idx.size() == 10
    assert by_tier(await idx.lookup(many[:20])) == {"b": {"device": 10}}
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
