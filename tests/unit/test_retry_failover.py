"""Failover before the first byte, on real sockets: an engine that refuses or resets the
connection, or opens a stream and ends it empty, costs a retry on the next instance, never
a 503 to the client (router/service/proxy.py). Nothing here waits for a timer: the dead
engine is a closed port that is still marked routable because nothing probes it again
(health and load intervals of an hour, and a vLLM-kind engine has no event feed to fail)."""

from __future__ import annotations

from aiohttp import web

from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.app import CLUSTER
from tests.support.foreign_stubs import StubEngine
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import stub_engine
from tests.support.waiting import wait_for

CHUNK = b'data: {"choices": [{"index": 0, "text": "ok"}]}\n\n'
NEVER = dict(health_interval_s=3600.0, load_interval_s=3600.0)  # after the first probe, nothing re-checks


async def good_stream(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(CHUNK + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def headers_then_end(request):
    """200 with SSE headers, then the stream ends with no byte of body."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write_eof()
    return resp


async def headers_then_drop(request):
    """200 with SSE headers, then the connection is closed under the stream."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    request.transport.close()
    return resp


async def resets(request):
    """The connection is torn down before any answer."""
    request.transport.abort()
    return web.Response()


async def post(http, url, stream):
    async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1, "stream": stream}) as r:
        return r.status, r.headers.get("x-kvroute-instance"), await r.read()


async def test_refused_connection_is_retried_on_the_next_instance(start_router, http):
    tokenizer = load_tokenizer()
    dead_stub, live_stub = StubEngine("vllm", tokenizer), StubEngine("vllm", tokenizer)
    dead = await LoopbackServer(dead_stub.app()).start()
    live = await LoopbackServer(live_stub.app()).start()
    try:
        url, server = await start_router([dead.url, live.url], policy="round_robin", engine_kinds=("vllm",),
                                         **NEVER)
        cluster = server.app[CLUSTER]
        assert await wait_for(lambda: all(i.routable for i in cluster.instances))
        assert await wait_for(lambda: all(i.load is not None for i in cluster.instances))  # the one load poll is done
        await dead.close()  # the port is closed now; the router has not been told
        dead_inst = next(i for i in cluster.instances if i.url == dead.url)
        assert dead_inst.routable
        for stream in (False, False, True, True):
            status, served_by, body = await post(http, url, stream)
            assert status == 200, body
            assert served_by != dead_inst.id
        assert live_stub.completions == 4 and dead_stub.completions == 0
        assert dead_inst.request_failures >= 1 and "refused" in dead_inst.last_error
    finally:
        await dead.close()
        await live.close()


async def _failover(start_router, http, bad_handler, stream):
    """A kvroute stub answering with `bad_handler` and a good one, round robin: every request
    must end 200 on the good one, and the bad one must have been tried."""
    stubs = [await LoopbackServer(stub_engine("bad", bad_handler)).start(),
             await LoopbackServer(stub_engine("good", good_stream)).start()]
    try:
        url, server = await start_router([s.url for s in stubs], policy="round_robin", **NEVER)
        cluster = server.app[CLUSTER]
        assert await wait_for(lambda: all(i.routable for i in cluster.instances))
        for _ in range(3):
            status, served_by, body = await post(http, url, stream)
            assert status == 200 and served_by == "good", body
            assert b"[DONE]" in body and b'"ok"' in body
        bad = cluster.by_id("bad")
        assert bad.request_failures >= 1
        return bad
    finally:
        for s in stubs:
            await s.close()


async def test_stream_that_ends_before_its_first_byte_is_retried(start_router, http):
    bad = await _failover(start_router, http, headers_then_end, stream=True)
    assert "before its first byte" in bad.last_error


async def test_stream_dropped_before_its_first_byte_is_retried(start_router, http):
    await _failover(start_router, http, headers_then_drop, stream=True)


async def test_connection_reset_before_the_answer_is_retried(start_router, http):
    for stream in (True, False):
        await _failover(start_router, http, resets, stream=stream)
