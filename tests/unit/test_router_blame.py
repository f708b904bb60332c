"""Blame and bounded waits (issue 9): a client that leaves is the client's fault, an engine
that hangs is the engine's, and nothing unexpected leaves as a plain-text 500."""

import asyncio
import logging

import orjson
from aiohttp import web

from kvroute.router.contract.http import error_middleware
from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.raw_client import stream_then_hang_up
from tests.support.router_cluster import FAST
from tests.support.stub_engine import stub_engine, stub_router
from tests.support.waiting import wait_for

CHUNK = b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'


async def done_then_linger(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(CHUNK + b"data: [DONE]\n\n")
    await asyncio.sleep(0.3)  # the stream ends a moment after [DONE]
    await resp.write_eof()
    return resp


async def slow_stream(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(20):
        await resp.write(CHUNK)
        await asyncio.sleep(0.05)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def hangs(request):
    await asyncio.sleep(3600)


async def busy_with_http_date(request):
    return web.json_response({"error": {"message": "busy"}}, status=503,
                             headers={"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"})


async def test_client_leaving_right_after_done_logs_no_error(start_router, caplog):
    url, server, stubs = await stub_router(start_router, done_then_linger)
    try:
        caplog.set_level(logging.WARNING)
        for _ in range(3):
            assert b"[DONE]" in await stream_then_hang_up(url, {"prompt": "hi", "stream": True})
        await asyncio.sleep(0.6)
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        inst = server.app[CLUSTER].instances[0]
        assert inst.reachable and inst.failures == 0 and inst.inflight == 0
    finally:
        for s in stubs:
            await s.close()


async def test_client_leaving_mid_stream_is_not_the_engines_fault(start_router, http):
    url, server, stubs = await stub_router(start_router, slow_stream)
    try:
        for _ in range(3):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "stream": True}) as r:
                await r.content.readline()
            # leaving the block closes the connection with chunks still coming
        inst = server.app[CLUSTER].instances[0]
        assert await wait_for(lambda: inst.inflight == 0)  # each request has ended (and been counted)
        assert inst.reachable and inst.failures == 0 and inst.inflight == 0
        async with http.get(url + "/metrics") as r:
            text = await r.text()
        assert 'status="cancelled"' in text and 'status="broken"' not in text
    finally:
        for s in stubs:
            await s.close()


async def test_hung_engine_is_retried_elsewhere_and_ejected(start_engine, start_router, http):
    hung = await LoopbackServer(stub_engine("hung", hangs)).start()
    try:
        good_url, _ = await start_engine(time_scale=FAST)
        # /health keeps answering (and readmits it every 0.1 s), but requests time out
        url, server = await start_router([hung.url, good_url], policy="round_robin", first_byte_timeout_s=0.3,
                                         request_timeout_s=0.5, eject_after=2, health_interval_s=0.1)
        await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
        hung_inst = server.app[CLUSTER].by_id("hung")
        for stream in (True, False, True, False, True, False):
            await wait_for(lambda: hung_inst.reachable or not hung_inst.healthy, timeout=1.0)
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                                "stream": stream}) as r:
                assert r.status == 200 and r.headers["x-kvroute-instance"] == "e0"
                await r.read()
        assert hung_inst.request_failures >= 2 and not hung_inst.healthy  # ejected, and health checks
        await asyncio.sleep(0.5)  # that still pass do not readmit it during its ejection time
        assert not hung_inst.routable
    finally:
        await hung.close()


async def test_http_date_retry_after_gives_openai_503(start_router, http):
    url, _, stubs = await stub_router(start_router, busy_with_http_date, max_retries=0)
    try:
        async with http.post(url + "/v1/completions", json={"prompt": "hi"}) as r:
            assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
            assert (await r.json())["error"]["type"] == "overloaded_error"
    finally:
        for s in stubs:
            await s.close()


async def test_unexpected_error_is_an_openai_shaped_500(http, caplog):
    async def broken(_):
        raise RuntimeError("boom")

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/x", broken)
    server = await LoopbackServer(app).start()
    try:
        caplog.set_level(logging.ERROR)
        async with http.get(server.url + "/x") as r:
            assert r.status == 500 and r.content_type == "application/json"
            err = orjson.loads(await r.read())["error"]
        assert err["code"] == "internal_error" and "RuntimeError" in err["message"]
        assert sum("boom" in (rec.exc_text or "") or rec.exc_info is not None for rec in caplog.records) == 1
    finally:
        await server.close()


async def test_engine_with_a_stuck_step_fails_its_health_check(start_engine, http):
    url, _ = await start_engine(time_scale=2000.0, stall_timeout_s=0.2)  # one step takes seconds
    async with http.get(url + "/health") as r:
        assert r.status == 200
    task = asyncio.ensure_future(http.post(url + "/v1/completions", json={"prompt": [5] * 300, "max_tokens": 1}))
    await asyncio.sleep(0.6)
    async with http.get(url + "/health") as r:
        assert r.status == 503 and (await r.json())["status"] == "stalled"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
