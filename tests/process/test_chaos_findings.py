"""Bugs `kvroute chaos` found, each pinned by a test that failed before its fix."""

import asyncio
import logging

import orjson
from aiohttp import web

from kvroute.engine.service.server import ENGINE, SERVICE
from kvroute.router.contract.http import error_middleware
from kvroute.router.service.app import CLUSTER, ENTRY
from tests.support.loopback import LoopbackServer
from tests.support.router_cluster import FAST, cluster
from tests.support.stub_engine import stub_engine, stub_router
from tests.support.waiting import wait_for


class NoCancelServer(LoopbackServer):
    async def start(self, port: int = 0):
        self.runner = web.AppRunner(self.app, handler_cancellation=False, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self


async def _closed_first(target, kind="completion"):
    """An app whose handler closes the client's connection, then runs `target`'s handler, not
    cancelled: the engine or router finds a closing transport when it sends its first bytes.
    That is the race chaos hit when a router gave up on a request just as its first token
    came (the handler resumed before aiohttp's cancellation reached it)."""

    async def handler(request):
        request.transport.close()
        return await target(request, kind)

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/v1/completions", handler)
    return await NoCancelServer(app).start()


async def _post_and_forget(http, url, body):
    try:
        async with http.post(url + "/v1/completions", data=orjson.dumps(body)) as r:
            await r.read()
    except Exception:  # the connection is closed under us, on purpose
        pass


async def test_engine_stream_to_a_closed_connection_is_the_clients_fault(start_engine, http, caplog):
    url, server = await start_engine(time_scale=FAST)
    engine, service = server.app[ENGINE], server.app[SERVICE]
    front = await _closed_first(service.handle)
    try:
        caplog.set_level(logging.WARNING)
        await _post_and_forget(http, front.url, {"prompt": [5] * 40, "max_tokens": 4, "stream": True})
        assert await wait_for(lambda: not engine.scheduler.running and engine.block_manager.num_used == 0)
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        await front.close()


async def test_router_stream_to_a_closed_connection_is_the_clients_fault(start_engine, start_router, http, caplog):
    url, server, _ = await cluster(start_engine, start_router, n=1)
    front = await _closed_first(server.app[ENTRY].handle)
    try:
        caplog.set_level(logging.WARNING)
        await _post_and_forget(http, front.url, {"prompt": [5] * 40, "max_tokens": 4, "stream": True})
        inst = server.app[CLUSTER].instances[0]
        assert await wait_for(lambda: inst.inflight == 0)
        assert inst.reachable and inst.request_failures == 0
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        await front.close()


async def test_handle_or_grant_with_a_huge_integer_is_refused_not_a_500(start_engine, http):
    """With a --kv-secret set, a handle field of 2^64 made signing it raise TypeError (a 500)."""
    url, _ = await start_engine(time_scale=FAST, kv_secret="s3cret")
    handle = {"cluster_id": "c", "address": "http://127.0.0.1:9", "request_id": "r", "block_hashes": [1],
              "num_tokens": 40, "first_token": 5, "cached_tokens": 0, "expires": 1e12, "signature": "ab"}
    grant = {"instance": "e0", "address": "http://127.0.0.1:9", "expires": 1e12, "nonce": "n", "signature": "ab"}
    bodies = [orjson.dumps({"prompt": [5] * 40, "kv_transfer_params": {"do_remote_prefill": True,
                                                                       "handle": {**handle, key: "@"}}})
              for key in ("num_tokens", "first_token", "cached_tokens")]
    bodies.append(orjson.dumps({"prompt": [5] * 40, "kv_transfer_params": {"do_remote_decode": True,
                                                                           "grant": {**grant, "expires": "@"}}}))
    for body in bodies:
        body = body.replace(b'"@"', str(1 << 64).encode())
        async with http.post(url + "/v1/completions", data=body) as r:
            assert r.status == 403, await r.text()
            assert (await r.json())["error"]["code"] == "kv_transfer_refused"


async def test_a_burst_slower_than_the_first_byte_timeout_does_not_take_every_engine_out(start_router, http):
    """1,000 streams at once with a 1 s first-byte timeout timed out on every engine, so every
    engine was excluded and ejected and all other traffic got 503 'no healthy instance'.
    Failed requests now take at most half of a model's engines out of routing."""

    async def slow_for_some(request):
        body = await request.json()
        if body.get("prompt") == "slow":
            await asyncio.sleep(0.5)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"index": 0, "text": "x"}]}\n\ndata: [DONE]\n\n')
        await resp.write_eof()
        return resp

    url, server, stubs = await stub_router(start_router, slow_for_some, slow_for_some, slow_for_some,
                                           first_byte_timeout_s=0.1, eject_after=1, health_interval_s=30.0)
    try:
        async def post(text):
            async with http.post(url + "/v1/completions", json={"prompt": text, "stream": True}) as r:
                return r.status, await r.read()

        results = await asyncio.gather(*(post("slow") for _ in range(6)))
        assert all(status in (200, 503) for status, _ in results)
        instances = server.app[CLUSTER].instances
        assert sum(i.routable for i in instances) >= 2, [i.to_dict() for i in instances]
        assert (await post("fast"))[0] == 200
    finally:
        for s in stubs:
            await s.close()


async def _until_cancelled(coro_fn, attempts: int, max_sleep_s: float) -> int:
    """Start `coro_fn()` and cancel it after a random moment, `attempts` times; how many
    times it failed to end within half a second of its cancel."""
    import random

    rng, stuck = random.Random(0), 0
    for _ in range(attempts):
        task = asyncio.ensure_future(coro_fn())
        await asyncio.sleep(rng.uniform(0.0, max_sleep_s))
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=0.5)
        if not done:
            stuck += 1
            for _ in range(20):  # try not to leak it into the next test
                task.cancel()
                if (await asyncio.wait([task], timeout=0.05))[0]:
                    break
    return stuck


async def test_a_loop_on_wait_for_ends_when_cancelled():
    """Python 3.11's asyncio.wait_for returns normally if a cancel lands as its operation
    finishes; redis-py wraps every send in it. A loop that checks after each call ends."""
    from kvroute.router.contract.cancellation import raise_if_cancelled

    async def like_redis_py():
        while True:
            await asyncio.wait_for(asyncio.sleep(0), 5.0)
            raise_if_cancelled()

    assert await _until_cancelled(like_redis_py, attempts=5, max_sleep_s=0.02) == 0


async def test_router_event_follower_ends_when_cancelled(redis_url):
    """The router's Redis stream follower swallowed about one cancel in four, so a router
    given SIGTERM after chaos's Redis faults never finished shutting down."""
    import redis.asyncio as aioredis

    from kvroute.router.contract.cancellation import raise_if_cancelled
    from kvroute.router.fleet.cluster import Cluster
    from kvroute.router.index import make_index
    from kvroute.router.kvevents.engine_feed import EventSync, RedisFollower
    from kvroute.router.service.config import RouterConfig
    from kvroute.router.service.metrics import RouterMetrics

    cluster = Cluster(RouterConfig(engines=("http://127.0.0.1:9",)), make_index("memory"), "fp", RouterMetrics())
    writer = aioredis.Redis.from_url(redis_url)

    async def feed():
        while True:
            await writer.xadd("kvroute:events", {"data": b'{"instance": "nobody", "events": []}'}, maxlen=1000)
            raise_if_cancelled()  # this loop has the same problem
            await asyncio.sleep(0.002)

    feeding = asyncio.ensure_future(feed())
    follower = RedisFollower(EventSync(cluster), redis_url)
    try:
        assert await _until_cancelled(follower.run, attempts=100, max_sleep_s=0.02) == 0
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        await follower.close()
        await writer.aclose()


async def test_busy_engines_slow_to_answer_health_checks_are_not_all_taken_out(start_router, http):
    """Under the same burst the engines answered /health later than its timeout: every one was
    excluded by its health check and the fleet answered 503 to everything. A probe that times
    out (busy, or hung) is capped like a failed request; a refused one (dead) is not."""

    slow = asyncio.Event()

    async def health(_):
        if slow.is_set():
            await asyncio.sleep(0.5)
        return web.json_response({"status": "ok"})

    async def answer(request):
        return web.json_response({"choices": [{"index": 0, "text": "x"}]})

    stubs = [await LoopbackServer(stub_engine(f"s{i}", answer, health)).start() for i in range(3)]
    try:
        url, server = await start_router([s.url for s in stubs], connect_timeout_s=0.2, health_interval_s=0.05)
        instances = server.app[CLUSTER].instances
        assert await wait_for(lambda: all(i.routable for i in instances))
        slow.set()
        await asyncio.sleep(1.0)  # many health checks time out
        assert sum(i.routable for i in instances) >= 2, [i.to_dict() for i in instances]
        async with http.post(url + "/v1/completions", json={"prompt": "hi"}) as r:
            assert r.status == 200
        await stubs[0].close()  # dead (refused) engines are taken out whatever the cap
        assert await wait_for(lambda: not instances[0].routable)
    finally:
        for s in stubs:
            await s.close()
