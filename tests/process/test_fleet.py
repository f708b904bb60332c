"""A fleet that changes (issue 11): registry membership, the admin API, drain and role switches."""

import asyncio
import functools

import orjson
import pytest
import redis.asyncio as aioredis
import torch
from aiohttp import web

from kvroute.engine.service.server import ENGINE, REGISTRATION
from kvroute.router.contract.protocol import REDIS_EVENT_STREAM
from kvroute.router.contract.registry_record import IDS, engine_key
from kvroute.router.contract.serve import SHUTDOWN
from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.redis_server import free_port
from tests.support.router_cluster import FAST, prompt
from tests.support.waiting import wait_for

torch.set_num_threads(1)
KEY = "fleet-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAST_REGISTRY = {"registry_refresh_s": 0.1, "registry_ttl_s": 0.4}


async def registered_engine(start_engine, redis_url, **kw):
    port = free_port()
    return await start_engine(port=port, registry=redis_url, advertise_url=f"http://127.0.0.1:{port}",
                              time_scale=FAST, admin_key=KEY, **FAST_REGISTRY, **kw)


async def served_by(http, url, text="hello there", **body):
    async with http.post(url + "/v1/completions", json={"prompt": text, "max_tokens": 2, **body}) as r:
        await r.read()
        return r.status, r.headers.get("x-kvroute-instance")


async def test_registration_refresh_and_expiry(start_engine, redis_url):
    url, server = await registered_engine(start_engine, redis_url, instance_id="reg-a")
    client = aioredis.Redis.from_url(redis_url)
    try:
        record = orjson.loads(await client.get(engine_key("reg-a")))
        assert record["url"] == url and record["role"] == "both" and record["state"] == "ready"
        assert record["model"] == "kvroute-tiny" and record["epoch"] == server.app[ENGINE].events.epoch
        assert 0 < await client.pttl(engine_key("reg-a")) <= 400
        await asyncio.sleep(0.6)  # longer than the TTL: the refresh keeps it alive
        assert await client.exists(engine_key("reg-a"))
        registration = server.app[REGISTRATION]
        registration.left = True  # stops refreshing, as a killed engine would, without leaving
        await asyncio.sleep(0.6)
        assert not await client.exists(engine_key("reg-a"))
        registration.left = False
        await server.close()  # a clean stop deregisters
        assert not await client.sismember(IDS, "reg-a")
    finally:
        await client.aclose()


def any_routable(router) -> bool:
    return any(i.routable for i in router.app[CLUSTER].instances)


def no_instances(router) -> bool:
    return not router.app[CLUSTER].instances


async def test_two_routers_follow_the_registry(start_engine, start_router, http, redis_url):
    a_url, a = await start_router([], registry=redis_url)
    b_url, b = await start_router([], registry=redis_url)
    e_url, e = await registered_engine(start_engine, redis_url, instance_id="joiner")
    for router in (a, b):
        assert await wait_for(functools.partial(any_routable, router), timeout=5)
    for url in (a_url, b_url):
        assert await served_by(http, url) == (200, "joiner")
    e.app[REGISTRATION].left = True  # it dies without a word: its registration lapses
    for router in (a, b):
        assert await wait_for(functools.partial(no_instances, router), timeout=5)


async def test_admin_api_adds_refuses_and_deletes(start_engine, start_router, http):
    good_url, _ = await start_engine(time_scale=FAST, instance_id="good")
    odd_url, _ = await start_engine(time_scale=FAST, instance_id="odd", block_size=32)
    other = web.Application()
    other.router.add_get("/kv/info", lambda _: web.Response(status=404, text="nope"))
    not_engine = await LoopbackServer(other).start()
    try:
        url, server = await start_router([good_url], admin_key=KEY)
        await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
        new_url, _ = await start_engine(time_scale=FAST, instance_id="new")

        async def add(target, headers=AUTH, **extra):
            async with http.post(url + "/router/engines", json={"url": target, **extra}, headers=headers) as r:
                return r.status, await r.json()

        assert (await add(new_url, headers={}))[0] == 401
        status, body = await add(new_url)
        assert status == 201 and body["engine"]["id"] == "new" and body["created"]
        assert (await add(new_url))[0] == 200  # again: a no-op
        for target, needle in ((f"http://127.0.0.1:{free_port()}", "connection refused"),
                               (not_engine.url, "not a kvroute engine"), (odd_url, "block size 32"),
                               ("ftp://x", "http(s) URL")):
            status, body = await add(target)
            assert status == 400 and needle in body["error"]["message"], (target, body)
        status, body = await add(new_url, role="superstar")
        assert status == 400 and "role" in body["error"]["message"]
        seen = {(await served_by(http, url, prompt(g)))[1] for g in range(8)}
        assert seen == {"good", "new"}
        async with http.delete(url + "/router/engines/new", headers=AUTH) as r:
            assert r.status == 200
        seen = {(await served_by(http, url, prompt(g)))[1] for g in range(6)}
        assert seen == {"good"}
        async with http.get(url + "/router/engines", headers=AUTH) as r:
            assert [e["id"] for e in (await r.json())["engines"]] == ["good"]
    finally:
        await not_engine.close()


async def test_admin_api_is_off_without_a_key_and_speaks_sglang(start_engine, start_router, http):
    e_url, _ = await start_engine(time_scale=FAST, instance_id="w0", admin_key=KEY)
    open_url, _ = await start_router([e_url])
    async with http.post(open_url + "/router/engines", json={"url": e_url}) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "admin_disabled"
    url, server = await start_router([], admin_key=KEY)
    async with http.post(url + "/workers", json={"url": e_url, "worker_type": "decode"}, headers=AUTH) as r:
        assert r.status == 201
    async with http.get(url + "/workers", headers=AUTH) as r:
        workers = (await r.json())["workers"]
    assert workers[0]["url"] == e_url and workers[0]["worker_type"] == "decode"
    async with http.post(url + "/workers", json={"url": e_url, "worker_type": "gpu"}, headers=AUTH) as r:
        assert r.status == 400


async def test_drain_under_load_loses_nothing(start_engine, start_router, http):
    engines = [await start_engine(time_scale=0.5, instance_id=f"d{i}", admin_key=KEY) for i in range(2)]
    url, server = await start_router([e[0] for e in engines], policy="round_robin")
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))

    async def one(i):
        body = {"prompt": prompt(i), "max_tokens": 30, "ignore_eos": True, "stream": True}
        async with http.post(url + "/v1/completions", json=body) as r:
            text = await r.read()
            return r.status, b"[DONE]" in text and b'"error"' not in text

    load = [asyncio.ensure_future(one(i)) for i in range(20)]
    await asyncio.sleep(0.2)
    victim_url, victim = engines[0]
    async with http.post(victim_url + "/admin/drain", headers=AUTH) as r:
        assert r.status == 202
    async with http.get(victim_url + "/health") as r:
        assert r.status == 503 and (await r.json())["status"] == "draining"
    late = [asyncio.ensure_future(one(100 + i)) for i in range(10)]  # sent while it drains
    results = await asyncio.gather(*load, *late)
    assert all(r == (200, True) for r in results), results
    assert await wait_for(lambda: victim.app[SHUTDOWN].is_set(), timeout=10)
    assert not server.app[CLUSTER].by_id("d0").routable


@pytest.mark.parametrize("via_router", [False, True])
async def test_role_switch_keeps_the_cache_and_the_output(start_engine, start_router, http, via_router):
    e_url, e = await start_engine(backend="torch", instance_id="r0", admin_key=KEY)
    url, server = await start_router([e_url], admin_key=KEY)
    await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
    body = {"prompt": prompt(7), "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    async with http.post(e_url + "/v1/completions", json=body) as r:
        before = await r.json()
    target = (url + "/router/engines/r0/role") if via_router else (e_url + "/admin/role")
    async with http.post(target, json={"role": "prefill"}, headers=AUTH) as r:
        assert r.status == 200, await r.text()
    if via_router:  # the router regroups at once, before any poll
        assert server.app[CLUSTER].instances[0].info.role == "prefill"
    async with http.get(e_url + "/kv/info") as r:
        assert (await r.json())["role"] == "prefill"
    async with http.post(e_url + "/v1/completions", json=body) as r:
        after = await r.json()
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prefix cache survived
    async with http.post(e_url + "/admin/role", json={"role": "chef"}, headers=AUTH) as r:
        assert r.status == 400
    async with http.post(e_url + "/admin/role", json={"role": "both"}) as r:
        assert r.status == 401
    assert await wait_for(lambda: server.app[CLUSTER].instances[0].info.role == "prefill", timeout=2)


async def test_admin_api_takes_an_engines_kind_and_zmq_sources(start_engine, start_router, http):
    e_url, _ = await start_engine(time_scale=FAST, instance_id="z0", kv_events_zmq="tcp://127.0.0.1:0",
                                  kv_events_replay="tcp://127.0.0.1:0")
    async with http.get(e_url + "/kv/info") as r:
        info = await r.json()
    endpoint = info["kv_events_zmq"]
    url, server = await start_router([], admin_key=KEY)
    bad = {"url": e_url, "kind": "kvroute", "kv_event_source": "tcp://*:5557"}
    async with http.post(url + "/router/engines", json=bad, headers=AUTH) as r:
        assert r.status == 400 and "wildcard" in (await r.json())["error"]["message"]
    body = {"url": e_url, "kind": "kvroute", "kv_event_source": endpoint,
            "kv_event_replay_source": info["kv_events_replay"]}
    async with http.post(url + "/router/engines", json=body, headers=AUTH) as r:
        assert r.status == 201
    inst = server.app[CLUSTER].instances[0]
    assert inst.kv_feed is not None and not inst.follows_engine_feed  # learns from ZeroMQ only
    await served_by(http, url, prompt(3))
    await wait_for(lambda: inst.kv_feed.source_stats()[0].batches > 0, timeout=5)
    await wait_for(lambda: inst.blocks_indexed > 0, timeout=5)
    async with http.post(url + "/router/explain", json={"prompt": prompt(3)}, headers=AUTH) as r:
        explained = await r.json()
        assert explained.get("predicted_cached_tokens", 0) > 0, explained


async def test_drain_leaves_the_registry_first_and_flushes_the_event_stream(start_engine, redis_url, http):
    port = free_port()
    url, server = await start_engine(port=port, registry=redis_url, redis=redis_url, admin_key=KEY,
                                     advertise_url=f"http://127.0.0.1:{port}", time_scale=0.5,
                                     instance_id="drainee", **FAST_REGISTRY)
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.exists(engine_key("drainee"))
        body = {"prompt": prompt(3), "max_tokens": 40, "ignore_eos": True}
        long_request = asyncio.ensure_future(http.post(url + "/v1/completions", json=body))
        await asyncio.sleep(0.2)
        async with http.post(url + "/admin/drain", headers=AUTH) as r:
            assert r.status == 202
        # step 1: gone from the registry while the running request still holds the engine up
        for _ in range(20):
            if not await client.exists(engine_key("drainee")):
                break
            await asyncio.sleep(0.05)
        assert not await client.exists(engine_key("drainee")) and not await client.sismember(IDS, "drainee")
        assert not server.app[SHUTDOWN].is_set()
        async with await long_request as r:
            assert r.status == 200
        assert await wait_for(lambda: server.app[SHUTDOWN].is_set(), timeout=10)
        # step 4: the last events are in the stream before the engine stops
        entries = await client.xrange(REDIS_EVENT_STREAM)
        seqs = [e["seq"] for _, fields in entries for e in orjson.loads(fields[b"data"])["events"]]
        assert seqs and seqs[-1] == server.app[ENGINE].events.seq
    finally:
        await client.aclose()
