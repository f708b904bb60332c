"""What the proxy does with each kind of engine answer (router/service/proxy.py), on loopback stubs:
a 5xx is retried and counted against the engine (kept routable), a plain 503 is retried and not
counted, a 503 with Retry-After reaches the client as overload, other statuses are relayed with
their headers, a stream that breaks after its first byte ends with an SSE error, a whole answer
slower than --read-timeout-s is waited for while the engine reports its load, and a silent engine
is given up on after --first-byte-timeout-s."""

import asyncio
import logging

import orjson
from aiohttp import web

from kvroute.router.service.app import CLUSTER
from tests.support.stub_engine import OK_CHUNK as CHUNK
from tests.support.stub_engine import answer_ok, stub_router


def answer(status, body=b'{"error": {"message": "pinned blocks gone"}}', headers=None):
    async def handler(request):
        return web.Response(status=status, body=body, headers=headers or {"Content-Type": "application/json"})

    return handler


async def good(request):
    """`answer_ok`, its whole answers with a header the router must relay."""
    resp = await answer_ok(request)
    if not resp.prepared:
        resp.headers["Cache-Control"] = "no-store"
    return resp


async def post(http, url, stream=False):
    async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1, "stream": stream}) as r:
        return r.status, r.headers, await r.read()


async def closing(stubs):
    for s in stubs:
        await s.close()


async def test_a_5xx_is_retried_and_counted_against_the_engine_which_stays_routable(start_router, http, caplog):
    caplog.set_level(logging.WARNING, logger="kvroute.router.service.proxy")
    bad = answer(500, body=b"\xff\xfe not utf-8 " + b"x" * 300)
    url, server, stubs = await stub_router(start_router, bad, good, policy="round_robin", eject_after=100)
    try:
        for stream in (False, True, False, True):
            status, headers, body = await post(http, url, stream)
            assert status == 200 and headers["x-kvroute-instance"] == "s1", body
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.request_failures >= 2 and inst.last_error == "answered HTTP 500" and inst.routable
        assert "instance s0 answered 500: \ufffd\ufffd not utf-8 xx" in caplog.text
    finally:
        await closing(stubs)


async def test_the_last_5xx_reaches_the_client_as_unavailable(start_router, http):
    url, server, stubs = await stub_router(start_router, answer(502), max_retries=0)
    try:
        status, _, body = await post(http, url)
        assert status == 503
        assert orjson.loads(body)["error"]["message"] == "instance s0 answered HTTP 502"
    finally:
        await closing(stubs)


async def test_a_plain_503_is_retried_and_not_counted(start_router, http):
    url, server, stubs = await stub_router(start_router, answer(503), good, policy="round_robin")
    try:
        for _ in range(2):
            status, headers, _ = await post(http, url)
            assert status == 200 and headers["x-kvroute-instance"] == "s1"
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.request_failures == 0 and inst.last_error is None
    finally:
        await closing(stubs)


async def test_a_503_with_retry_after_reaches_the_client_as_overload(start_router, http):
    busy = answer(503, headers={"Retry-After": "7", "Content-Type": "application/json"})
    url, server, stubs = await stub_router(start_router, busy, max_retries=0)
    try:
        status, headers, body = await post(http, url)
        assert status == 503 and headers["Retry-After"] == "7"
        error = orjson.loads(body)["error"]
        assert error["type"] == "overloaded_error" and error["message"] == "instance s0 is overloaded"
    finally:
        await closing(stubs)


async def test_other_statuses_are_relayed_with_their_headers_not_retried(start_router, http):
    teapot = answer(418, body=b'{"error": "short and stout"}',
                    headers={"Content-Type": "application/json", "Cache-Control": "no-cache", "Retry-After": "3",
                             "X-Other": "dropped"})
    url, server, stubs = await stub_router(start_router, teapot, good, policy="round_robin")
    try:
        for stream in (False, True):
            status, headers, body = await post(http, url, stream)
            assert (status, body) == (418, b'{"error": "short and stout"}')
            assert headers["x-kvroute-instance"] == "s0" and headers["Cache-Control"] == "no-cache"
            assert headers["Retry-After"] == "3" and "X-Other" not in headers
            assert headers["Content-Type"].startswith("application/json")
            status, headers, _ = await post(http, url, stream)  # round robin: s1 next
            assert status == 200 and headers["x-kvroute-instance"] == "s1"
        assert server.app[CLUSTER].by_id("s0").request_failures == 0
    finally:
        await closing(stubs)


async def test_a_stream_broken_after_its_first_byte_ends_with_an_sse_error(start_router, http):
    async def breaks(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNK)
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    url, server, stubs = await stub_router(start_router, breaks, good, policy="round_robin", eject_after=100)
    try:
        answers = {}
        for _ in range(2):  # round robin: one of them goes to s0
            status, headers, body = await post(http, url, stream=True)
            assert status == 200
            answers[headers["x-kvroute-instance"]] = body
        body = answers["s0"]
        assert body.startswith(CHUNK) and body.endswith(b"data: [DONE]\n\n")
        assert b"instance s0 failed mid-stream: stream broke" in body
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.request_failures == 1 and inst.last_error.startswith("stream broke")
    finally:
        await closing(stubs)


async def test_a_whole_answer_slower_than_the_read_timeout_is_waited_for(start_router, http):
    async def slow(request):
        await asyncio.sleep(0.6)
        return web.json_response({"choices": [{"index": 0, "text": "late"}]})

    # the stub keeps reporting its load: it is working, only --request-timeout-s bounds the wait
    url, server, stubs = await stub_router(start_router, slow, max_retries=0, read_timeout_s=0.2,
                                           first_byte_timeout_s=0.3, request_timeout_s=30.0)
    try:
        status, _, body = await post(http, url)
        assert status == 200 and b"late" in body
        assert server.app[CLUSTER].by_id("s0").request_failures == 0
    finally:
        await closing(stubs)


async def test_a_whole_answer_from_an_engine_that_stops_reporting_gives_up_at_the_first_byte_timeout(
        start_router, http):
    async def hangs(request):
        await asyncio.sleep(3600)

    # one load report at start, then none for an hour: the engine looks silent while it owes an answer
    url, server, stubs = await stub_router(start_router, hangs, good, policy="round_robin", max_retries=0,
                                           load_interval_s=3600.0, first_byte_timeout_s=0.3,
                                           request_timeout_s=30.0, eject_after=100)
    try:
        failed = [body for status, _, body in [await asyncio.wait_for(post(http, url), 20) for _ in range(2)]
                  if status == 503]
        assert len(failed) == 1  # round robin: one of them went to s0
        message = orjson.loads(failed[0])["error"]["message"]
        assert message.startswith("instance s0 timed out (no answer and no load report for ")
        assert message.endswith("s, --first-byte-timeout-s)")
        assert server.app[CLUSTER].by_id("s0").last_error.startswith("no answer and no load report for")
    finally:
        await closing(stubs)


async def ttft_counts(http, url):
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("kvroute_router_time_to_first_token_seconds_count{") or \
                line.startswith("kvroute_router_time_to_first_token_seconds_sum{"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_only_a_streams_first_byte_is_a_time_to_first_token(start_router, http):
    url, server, stubs = await stub_router(start_router, good)
    try:
        assert (await post(http, url))[0] == 200  # a whole answer: its arrival includes the decode
        assert not any(v for k, v in (await ttft_counts(http, url)).items() if k.endswith("_count"))
        for _ in range(2):
            assert (await post(http, url, stream=True))[0] == 200
        counts = await ttft_counts(http, url)
        [(count_name, count)] = [(k, v) for k, v in counts.items() if "_count{" in k]
        assert count == 2 and 'instance="s0"' in count_name and 'model="' in count_name
        assert 'model=""' not in count_name and 'model="None"' not in count_name
        [total] = [v for k, v in counts.items() if "_sum{" in k]
        assert 0 < total < 60
    finally:
        await closing(stubs)


async def test_a_stream_stalled_after_its_first_byte_ends_at_the_read_timeout(start_router, http):
    async def stalls(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNK)
        await asyncio.sleep(3600)

    url, server, stubs = await stub_router(start_router, stalls, good, policy="round_robin", eject_after=100,
                                           read_timeout_s=0.3)
    try:
        answers = {}
        for _ in range(2):
            status, headers, body = await asyncio.wait_for(post(http, url, stream=True), 20)
            answers[headers["x-kvroute-instance"]] = body
        body = answers["s0"]
        assert body.startswith(CHUNK) and b"instance s0 failed mid-stream: no chunk within 0.3s" in body
        assert body.endswith(b"data: [DONE]\n\n")
        inst = server.app[CLUSTER].by_id("s0")
        assert inst.request_failures == 1 and inst.last_error == "no chunk within 0.3s"
    finally:
        await closing(stubs)
