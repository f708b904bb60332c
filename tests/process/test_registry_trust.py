"""The fleet registry is a trust boundary: with a fleet secret, only signed records enlist engines."""

import asyncio
import dataclasses
import time

import pytest
import redis.asyncio as aioredis

from router.contract.registry_record import IDS, EngineRecord, engine_key
from router.service.app import CLUSTER, METRICS
from tests.support.redis_server import free_port

SECRET = "fleet-secret"
FAST = 0.01
FAST_REGISTRY = {"registry_refresh_s": 0.1, "registry_ttl_s": 0.4}


async def _until(check, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _engine(start_engine, redis_url=None, **kw):
    port = free_port()
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
    assert dataclasses.replace(record, url="http://127.0.0.1:2").refusal(SECRET, now=1001.0) == "bad_signature"
    assert EngineRecord(instance_id="e1", url="http://x").refusal(SECRET, now=0) == "unsigned"
    assert EngineRecord(instance_id="e1", url="http://x").refusal(None, now=0) is None  # no secret: believed
    assert EngineRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize("kind", ["leave"])
async def test_a_forged_announcement_cannot_empty_the_fleet(start_engine, start_router, http, redis_url, kind):
    import orjson

    from router.contract.registry_record import CHANNEL

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
    from router.contract.redact import redact

    assert redact("redis://kv:s3cret@10.0.0.1:6380/2") == "redis://kv:***@10.0.0.1:6380/2"
    assert redact("rediss://:s3cret@cache.internal/0") == "rediss://:***@cache.internal/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


async def test_a_password_protected_redis_serves_index_events_and_registry(start_engine, start_router, http, caplog):
    """Redis URLs with a password work for the index, the event stream and the registry, and the
    password is never logged."""
    from loadgen.redis_server import RedisServer

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
