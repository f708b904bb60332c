"""How each way an attempt can fail is reported (router/service/proxy.py `_attempt`, `pump`), on
loopback stubs with no retry left: the client's message names the instance, what went wrong and the
flag that bounds it; the instance's last error says the same; each counts as a request failure.
A good second engine (round robin) keeps the failing one's failures on record: with one engine
alone the cluster keeps it routable and does not record them (router/fleet/cluster.py)."""

import asyncio

import orjson
from aiohttp import web

from kvroute.router.service.app import CLUSTER
from tests.support.stub_engine import answer_ok, close_all, stub_router
from tests.support.waiting import wait_for

CHUNK = b'data: {"choices": [{"index": 0, "text": "ok"}]}\n\n'


async def post(http, url, stream=False):
    async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1, "stream": stream}) as r:
        return r.status, await r.read()


async def failed(http, url, stream=False):
    """The message of the one 503 among two requests (round robin: one of them went to s0)."""
    answers = [await asyncio.wait_for(post(http, url, stream), 30) for _ in range(2)]
    [body] = [body for status, body in answers if status == 503]
    return orjson.loads(body)["error"]["message"]


async def test_a_stream_without_its_first_byte_gives_up_at_the_first_byte_timeout(start_router, http):
    stop = asyncio.Event()

    async def silent(request):
        await stop.wait()
        return web.Response()

    url, server, stubs = await stub_router(start_router, silent, answer_ok, policy="round_robin", max_retries=0,
                                           first_byte_timeout_s=0.3, request_timeout_s=20.0, eject_after=100)
    try:
        assert await failed(http, url, stream=True) == \
            "instance s0 timed out (no first byte within 0.3s, --first-byte-timeout-s)"
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.last_error == "no first byte within 0.3s" and inst.request_failures == 1
    finally:
        stop.set()
        await close_all(stubs)


async def test_a_whole_answer_gives_up_at_the_request_timeout_while_reports_come(start_router, http):
    stop = asyncio.Event()

    async def slow(request):
        await stop.wait()
        return web.Response()

    # load reports every 0.05 s: the engine looks alive, so only --request-timeout-s ends the wait
    url, server, stubs = await stub_router(start_router, slow, answer_ok, policy="round_robin", max_retries=0,
                                           first_byte_timeout_s=20.0, request_timeout_s=0.3, eject_after=100)
    try:
        assert await failed(http, url) == "instance s0 timed out (no answer within 0.3s, --request-timeout-s)"
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.last_error == "no answer within 0.3s" and inst.request_failures == 1
    finally:
        stop.set()
        await close_all(stubs)


async def test_a_stream_closed_before_its_first_byte_is_reported(start_router, http):
    async def empty(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write_eof()
        return resp

    url, server, stubs = await stub_router(start_router, empty, answer_ok, policy="round_robin", max_retries=0,
                                           eject_after=100)
    try:
        assert await failed(http, url, stream=True) == "instance s0 closed the stream before the first byte"
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.last_error == "closed the stream before its first byte" and inst.request_failures == 1
    finally:
        await close_all(stubs)


async def test_a_connection_torn_down_before_the_answer_is_reported(start_router, http):
    async def resets(request):
        request.transport.abort()
        return web.Response()

    url, server, stubs = await stub_router(start_router, resets, answer_ok, policy="round_robin", max_retries=0,
                                           eject_after=100)
    try:
        inst = server.app[CLUSTER].by_id("s0")
        for stream in (False, True):
            assert await wait_for(lambda: inst.routable)  # its health probe readmits it after a failure
            assert await failed(http, url, stream) == "instance s0 failed: the engine closed the connection"
            assert inst.last_error == "request failed: the engine closed the connection"
            assert inst.request_failures >= 1
    finally:
        await close_all(stubs)


async def test_a_stream_broken_mid_answer_names_the_break(start_router, http):
    async def breaks(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNK)
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    url, server, stubs = await stub_router(start_router, breaks, answer_ok, policy="round_robin", max_retries=0,
                                           eject_after=100)
    try:
        bodies = [(await post(http, url, stream=True))[1] for _ in range(2)]
        [body] = [b for b in bodies if b"failed mid-stream" in b]
        assert body.startswith(CHUNK)
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.last_error.startswith("stream broke: ") and inst.request_failures == 1
        why = inst.last_error.removeprefix("stream broke: ")
        assert why in ("the engine's answer broke off", "the engine closed the connection")
        assert f"instance s0 failed mid-stream: stream broke: {why}".encode() in body
    finally:
        await close_all(stubs)


async def test_an_engine_that_stops_reporting_counts_a_request_failure(start_router, http):
    stop = asyncio.Event()

    async def hangs(request):
        await stop.wait()
        return web.Response()

    url, server, stubs = await stub_router(start_router, hangs, answer_ok, policy="round_robin", max_retries=0,
                                           load_interval_s=3600.0, first_byte_timeout_s=0.3,
                                           request_timeout_s=20.0, eject_after=100)
    try:
        message = await failed(http, url)
        assert message.startswith("instance s0 timed out (no answer and no load report for ")
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.last_error.startswith("no answer and no load report for ") and inst.request_failures == 1
    finally:
        stop.set()
        await close_all(stubs)
