"""The fleet registry is a trust boundary: with a fleet secret, only signed records enlist engines."""

import asyncio
import dataclasses
import time

import pytest
import redis.asyncio as aioredis

from kvroute.router.contract.registry_record import (
    CHANNEL,
    IDS,
    LEFT,
    MAX_CLOCK_SKEW_S,
    SIGNED_FOR_S,
    EngineRecord,
    announcement,
    engine_key,
)
from kvroute.router.fleet.registry_trust import RegistryTrust
from kvroute.router.service.app import CLUSTER, METRICS
from tests.support.redis_server import free_port

SECRET = "fleet-secret"
FAST = 0.01
FAST_REGISTRY = {"registry_refresh_s": 0.1, "registry_ttl_s": 0.4}


async def _until(check, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _engine(start_engine, redis_url=None, port=None, **kw):
    port = port or free_port()
    registry = {"registry": redis_url, **FAST_REGISTRY} if redis_url else {}
    return await start_engine(port=port, advertise_url=f"http://127.0.0.1:{port}", time_scale=FAST, **registry, **kw)


async def test_a_rogue_registry_record_gets_no_request(start_engine, start_router, http, redis_url):
    """A fake engine written into the registry used to be probed, admitted and sent prompts."""
    good_url, _ = await _engine(start_engine, redis_url, instance_id="honest", kv_secret=SECRET)
    rogue_url, rogue = await _engine(start_engine, instance_id="rogue")  # answers like an engine
    client = aioredis.Redis.from_url(redis_url)
    unsigned = EngineRecord(instance_id="rogue", url=rogue_url)
    forged = dataclasses.replace(EngineRecord(instance_id="rogue2", url=rogue_url).signed("not-the-secret"))
    try:
        for record in (unsigned, forged):
            await client.set(engine_key(record.instance_id), record.to_json(), px=60_000)
            await client.sadd(IDS, record.instance_id)
        url, router = await start_router([], registry=redis_url, kv_secret=SECRET)
        cluster = router.app[CLUSTER]
        await _until(lambda: any(i.routable for i in cluster.instances))
        for _ in range(10):
            async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
                assert r.status == 200 and r.headers["x-kvroute-instance"] == "honest"
        assert [i.url for i in cluster.instances] == [good_url]
        metric = router.app[METRICS].registry.get_sample_value
        assert metric("kvroute_router_registry_refused_total", {"reason": "unsigned"}) >= 1
        assert metric("kvroute_router_registry_refused_total", {"reason": "bad_signature"}) >= 1
    finally:
        await client.aclose()


def test_a_signed_record_verifies_only_with_its_secret_and_until_it_expires():
    record = EngineRecord(instance_id="e1", url="http://127.0.0.1:1", ts=1000.0).signed(SECRET)
    assert record.refusal(SECRET, now=1001.0) is None
    assert record.refusal("other", now=1001.0) == "bad_signature"
    assert record.refusal(SECRET, now=record.expires + 1) == "expired"
    for field, value in (("url", "http://127.0.0.1:2"), ("epoch", 7), ("nonce", "0" * 16), ("state", LEFT)):
        assert dataclasses.replace(record, **{field: value}).refusal(SECRET, now=1001.0) == "bad_signature", field
    assert EngineRecord(instance_id="e1", url="http://x").refusal(SECRET, now=time.time()) == "unsigned"
    assert EngineRecord(instance_id="e1", url="http://x").refusal(None, now=time.time()) is None  # no secret
    assert EngineRecord.from_json(record.to_json()) == record
    assert EngineRecord(instance_id="e1", url="http://x").nonce != EngineRecord(instance_id="e1", url="http://x").nonce
    with pytest.raises(ValueError, match="nonce longer than"):
        EngineRecord.from_json(dataclasses.replace(record, nonce="n" * 65).to_json())


@pytest.mark.parametrize("secret", [SECRET, None])
def test_a_record_dated_beyond_the_clock_skew_is_refused_signed_or_not(secret):
    now = 5000.0
    for ahead, refused in ((0.0, None), (MAX_CLOCK_SKEW_S - 0.5, None), (MAX_CLOCK_SKEW_S + 0.5, "future"),
                           (3600.0, "future")):
        record = EngineRecord(instance_id="e1", url="http://x", ts=now + ahead).signed(secret)
        assert record.refusal(secret, now=now) == refused, ahead


def _record(epoch, ts, state="ready", secret=SECRET, nonce=None):
    record = EngineRecord(instance_id="e1", url="http://x", epoch=epoch, ts=ts, state=state)
    return (record if nonce is None else dataclasses.replace(record, nonce=nonce)).signed(secret)


# (records the router believed, then a record and how it came (None: read from its key), why refused)
ORDER = [
    ([_record(2, 100.0)], _record(1, 110.0), None, "stale"),  # an older epoch, however late it is dated
    ([_record(2, 100.0)], _record(1, 110.0, LEFT), "leave", "stale"),  # the last life's leave, replayed
    ([_record(2, 100.0)], _record(2, 99.0), None, "stale"),  # an older refresh of this life
    ([_record(2, 100.0)], _record(2, 100.0), None, None),  # the same record read again
    ([_record(2, 100.0)], _record(3, 90.0), None, None),  # a restart (its clock stepped back a little)
    ([_record(2, 100.0)], _record(2, 101.0, LEFT), "leave", None),  # its own leave
    ([_record(2, 100.0)], _record(2, 101.0), "leave", "kind_mismatch"),  # the live record sent as a leave
    ([_record(2, 100.0)], _record(2, 101.0, LEFT), "join", "kind_mismatch"),
    ([_record(2, 100.0, nonce="a")], _record(2, 100.0, nonce="a"), "role", None),  # announced as written
    ([_record(2, 100.0, nonce="a")], _record(2, 100.0, nonce="a"), "role", "replayed"),  # ... twice: replayed
    ([_record(2, 100.0, secret=None)], _record(1, 110.0, secret=None), None, "stale"),  # no secret: order holds
]


@pytest.mark.parametrize("believed,record,kind,refused", ORDER)
def test_a_router_believes_only_the_newest_record_of_an_instance(believed, record, kind, refused):
    secret = SECRET if record.signature else None
    trust = RegistryTrust(secret)
    for earlier in believed:
        assert trust.refusal(earlier, now=105.0) is None
    if refused == "replayed":  # the same announcement once before
        assert trust.refusal(record, now=105.0, kind=kind) is None
    assert trust.refusal(record, now=105.0, kind=kind) == refused


def test_what_the_newest_records_hold_is_forgotten_once_nothing_older_could_be_valid():
    trust = RegistryTrust(SECRET)
    assert trust.refusal(_record(2, 100.0), now=100.0) is None
    trust.forget_old(now=100.0 + SIGNED_FOR_S + MAX_CLOCK_SKEW_S - 1)
    assert trust.refusal(_record(1, 99.0), now=110.0) == "stale"
    trust.forget_old(now=100.0 + SIGNED_FOR_S + MAX_CLOCK_SKEW_S + 1)
    assert not trust.newest and not trust.announced
    assert _record(1, 99.0).refusal(SECRET, now=100.0 + SIGNED_FOR_S + 1) == "expired"  # what it kept out still is


@pytest.mark.parametrize("kind", ["leave"])
async def test_a_forged_announcement_cannot_empty_the_fleet(start_engine, start_router, http, redis_url, kind):
    import orjson

    from kvroute.router.contract.registry_record import CHANNEL

    await _engine(start_engine, redis_url, instance_id="honest", kv_secret=SECRET)
    url, router = await start_router([], registry=redis_url, kv_secret=SECRET)
    cluster = router.app[CLUSTER]
    await _until(lambda: any(i.routable for i in cluster.instances))
    victim = cluster.instances[0]
    client = aioredis.Redis.from_url(redis_url)
    try:
        fake = EngineRecord(instance_id="honest", url=victim.url)
        await client.publish(CHANNEL, orjson.dumps({"type": kind, "record": dataclasses.asdict(fake)}))
        await asyncio.sleep(0.5)
        assert victim in cluster.instances and victim.routable
    finally:
        await client.aclose()


def test_a_logged_url_never_shows_its_password():
    from kvroute.router.contract.redact import redact

    assert redact("redis://kv:s3cret@10.0.0.1:6380/2") == "redis://kv:***@10.0.0.1:6380/2"
    assert redact("rediss://:s3cret@cache.internal/0") == "rediss://:***@cache.internal/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


async def test_a_password_protected_redis_serves_index_events_and_registry(start_engine, start_router, http, caplog):
    """Redis URLs with a password work for the index, the event stream and the registry, and the
    password is never logged."""
    from kvroute.loadgen.redis_server import RedisServer

    server = RedisServer(password="s3cret")
    try:
        url = server.url
        assert ":s3cret@" in url
        await _engine(start_engine, url, instance_id="e-auth", kv_secret=SECRET, redis=url)
        r_url, router = await start_router([], registry=url, kv_secret=SECRET, index="redis", redis=url,
                                           events="redis")
        cluster = router.app[CLUSTER]
        await _until(lambda: any(i.routable and not i.needs_resync for i in cluster.instances))
        text = "a shared system prompt for the password test " * 8
        for _ in range(2):
            async with http.post(r_url + "/v1/completions", json={"prompt": text, "max_tokens": 2}) as r:
                assert r.status == 200 and r.headers["x-kvroute-instance"] == "e-auth"
                cached = (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0
        await _until(lambda: cluster.instances[0].blocks_indexed > 0)
        assert "s3cret" not in caplog.text
    finally:
        server.stop()


async def _leave_of(pubsub, instance_id: str, timeout_s: float = 5.0) -> bytes:
    """The next "leave" announcement of `instance_id` on the registry channel, as it was sent."""
    import orjson

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            body = orjson.loads(message["data"])
            if body["type"] == "leave" and body["record"]["instance_id"] == instance_id:
                return message["data"]
    raise AssertionError(f"no leave from {instance_id} within {timeout_s}s")


async def _restarted_engine(start_engine, start_router, http, redis_url, client):
    """An engine that registered, left and came back at the same URL (a new epoch), a router that
    follows the registry and holds its prefix, and what an attacker recorded of the first life:
    its live record and its leave, as they were on the wire."""
    port = free_port()
    pubsub = client.pubsub()
    await pubsub.subscribe(CHANNEL)
    _, first = await _engine(start_engine, redis_url, port=port, instance_id="honest", kv_secret=SECRET)
    old_record = await client.get(engine_key("honest"))
    url, router = await start_router([], registry=redis_url, kv_secret=SECRET)
    cluster = router.app[CLUSTER]
    await _until(lambda: any(i.routable for i in cluster.instances))
    await first.close()  # a clean stop: it leaves the registry
    old_leave = await _leave_of(pubsub, "honest")
    await pubsub.aclose()
    await _until(lambda: not cluster.instances)
    await _engine(start_engine, redis_url, port=port, instance_id="honest", kv_secret=SECRET)
    await _until(lambda: any(i.routable and not i.needs_resync for i in cluster.instances))
    async with http.post(url + "/v1/completions", json={"prompt": "a prefix the engine holds " * 8,
                                                        "max_tokens": 2}) as r:
        assert r.status == 200
    inst = cluster.instances[0]
    await _until(lambda: inst.blocks_indexed > 0)
    return url, router, inst, old_record, old_leave


async def test_records_replayed_from_an_engines_earlier_life_change_nothing(start_engine, start_router, http,
                                                                             redis_url):
    """Finding 10 of issue 36: with write access to the registry's Redis but not the secret, an
    engine's old "leave" replayed after it restarted dropped it and its cache index (it was signed
    and within its 30 s). A router keeps the newest (epoch, ts) per instance and refuses older."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        url, router, inst, old_record, old_leave = await _restarted_engine(start_engine, start_router, http,
                                                                           redis_url, client)
        indexed, cluster = inst.blocks_indexed, router.app[CLUSTER]
        await client.publish(CHANNEL, old_leave)
        await client.publish(CHANNEL, announcement("join", EngineRecord.from_json(old_record)))
        await asyncio.sleep(0.5)
        assert cluster.instances == [inst] and inst.routable and inst.blocks_indexed == indexed
        refused = router.app[METRICS].registry.get_sample_value
        assert refused("kvroute_router_registry_refused_total", {"reason": "stale"}) == 2
    finally:
        await client.aclose()


async def test_a_key_overwritten_with_a_record_the_router_refuses_drops_nothing(start_engine, start_router, http,
                                                                                 redis_url):
    """A refused record changes nothing: the key rewritten (over and over, faster than the engine
    refreshes it) with its earlier life's record, an unsigned one or garbage used to read as a
    lapsed registration, dropping the engine and its index."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        url, router, inst, old_record, _ = await _restarted_engine(start_engine, start_router, http, redis_url,
                                                                   client)
        indexed, cluster = inst.blocks_indexed, router.app[CLUSTER]
        unsigned = EngineRecord(instance_id="honest", url=inst.url).to_json()
        refused = router.app[METRICS].registry.get_sample_value
        for fake in (old_record, unsigned, b"{not json"):
            until = time.monotonic() + 1.2  # more than a router's registry poll (1 s)
            while time.monotonic() < until:
                await client.set(engine_key("honest"), fake, px=60_000)
                await asyncio.sleep(0.01)
            assert cluster.instances == [inst] and inst.routable and inst.blocks_indexed == indexed, fake
        assert refused("kvroute_router_registry_refused_total", {"reason": "stale"}) >= 1
        assert refused("kvroute_router_registry_refused_total", {"reason": "unsigned"}) >= 1
        async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
            assert r.status == 200 and r.headers["x-kvroute-instance"] == "honest"
    finally:
        await client.aclose()


async def test_the_live_record_sent_as_a_leave_drops_nothing(start_engine, start_router, http, redis_url):
    """The announcement's type is not signed: the engine's own valid record, read from its key and
    published as a "leave", used to drop it. A leave needs a record that says "left"."""
    import orjson

    await _engine(start_engine, redis_url, instance_id="honest", kv_secret=SECRET)
    url, router = await start_router([], registry=redis_url, kv_secret=SECRET)
    cluster = router.app[CLUSTER]
    await _until(lambda: any(i.routable for i in cluster.instances))
    client = aioredis.Redis.from_url(redis_url)
    try:
        live = orjson.loads(await client.get(engine_key("honest")))
        await client.publish(CHANNEL, orjson.dumps({"type": "leave", "record": live}))
        await asyncio.sleep(0.5)
        assert len(cluster.instances) == 1 and cluster.instances[0].routable
        refused = router.app[METRICS].registry.get_sample_value
        assert refused("kvroute_router_registry_refused_total", {"reason": "kind_mismatch"}) == 1
    finally:
        await client.aclose()


async def test_a_record_dated_an_hour_ahead_enlists_nothing(start_engine, start_router, http, redis_url):
    """A signed record dated an hour ahead (an engine whose clock is wrong, or a record signed ahead
    of time) was believed for 3,628 s; it is refused now, and the engine gets no request."""
    _, _ = await _engine(start_engine, redis_url, instance_id="honest", kv_secret=SECRET)
    ahead_url, _ = await _engine(start_engine, instance_id="ahead")
    record = EngineRecord(instance_id="ahead", url=ahead_url, ts=time.time() + 3600).signed(SECRET)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set(engine_key("ahead"), record.to_json(), px=60_000)
        await client.sadd(IDS, "ahead")
        url, router = await start_router([], registry=redis_url, kv_secret=SECRET)
        cluster = router.app[CLUSTER]
        await _until(lambda: any(i.routable for i in cluster.instances))
        await client.publish(CHANNEL, announcement("join", record))
        await asyncio.sleep(0.5)
        assert [i.id for i in cluster.instances] == ["honest"]
        refused = router.app[METRICS].registry.get_sample_value
        assert refused("kvroute_router_registry_refused_total", {"reason": "future"}) >= 2
    finally:
        await client.aclose()
