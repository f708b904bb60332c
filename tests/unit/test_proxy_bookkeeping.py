"""The proxy's per-request bookkeeping (router/service/proxy.py `Dispatch`, `pump`), on loopback
stubs: every chunk of a long stream reaches the client, the instance's in-flight count and queued
prefill tokens while a request runs and after, which answers wait in the non-streamed set, and the
outcome each request is counted under."""

import asyncio

from aiohttp import web

from kvroute.router.service.app import CLUSTER
from tests.support.stub_engine import stub_router

CHUNKS = [f'data: {{"choices": [{{"index": 0, "text": "t{i}"}}]}}\n\n'.encode() for i in range(5)]


class Gate:
    """A completions handler that holds each request until released, streaming or whole."""

    def __init__(self):
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, request):
        stream = (await request.json()).get("stream")
        self.entered.set()
        if not stream:
            await self.release.wait()
            return web.json_response({"choices": [{"index": 0, "text": "whole"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNKS[0])
        await self.release.wait()
        for chunk in CHUNKS[1:]:
            await resp.write(chunk)
            await asyncio.sleep(0.01)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def post(http, url, stream):
    async with http.post(url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 4,
                                                        "stream": stream}) as r:
        return r.status, await r.read()


async def metric_lines(http, url, name):
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{")}


async def test_every_chunk_of_a_long_stream_reaches_the_client_and_the_counts_return_to_zero(start_router, http):
    gate = Gate()
    url, server, stubs = await stub_router(start_router, gate)
    inst = server.app[CLUSTER].by_id("s0")
    try:
        task = asyncio.create_task(post(http, url, stream=True))
        await gate.entered.wait()
        await asyncio.sleep(0.1)  # the first chunk is relayed: the prefill is done
        assert inst.inflight == 1 and inst.queued_prefill_tokens == 0 and not inst.nonstreamed
        gate.release.set()
        status, body = await task
        assert status == 200 and body == b"".join(CHUNKS) + b"data: [DONE]\n\n"
        assert inst.inflight == 0 and inst.queued_prefill_tokens == 0
        gauges = await metric_lines(http, url, "kvroute_router_inflight")
        assert gauges == {'kvroute_router_inflight{instance="s0"}': 0.0}
    finally:
        gate.release.set()
        for s in stubs:
            await s.close()


async def test_whole_answers_wait_in_the_nonstreamed_set_charged_with_their_prefill(start_router, http):
    gate = Gate()
    url, server, stubs = await stub_router(start_router, gate)
    inst = server.app[CLUSTER].by_id("s0")
    try:
        tasks = [asyncio.create_task(post(http, url, stream=False)) for _ in range(2)]
        await gate.entered.wait()
        for _ in range(100):
            if inst.inflight == 2:
                break
            await asyncio.sleep(0.02)
        assert inst.inflight == 2 and len(inst.nonstreamed) == 2
        assert inst.queued_prefill_tokens > 0 and inst.queued_prefill_tokens % 2 == 0  # the same prompt twice
        gauges = await metric_lines(http, url, "kvroute_router_inflight")
        assert gauges == {'kvroute_router_inflight{instance="s0"}': 2.0}
        gate.release.set()
        assert [(await t)[0] for t in tasks] == [200, 200]
        assert inst.inflight == 0 and inst.queued_prefill_tokens == 0
    finally:
        gate.release.set()
        for s in stubs:
            await s.close()


async def test_requests_are_counted_under_their_outcome(start_router, http):
    async def breaks(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNKS[0])
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    async def fine(request):
        if (await request.json()).get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(CHUNKS[0] + b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"choices": [{"index": 0, "text": "ok"}]})

    url, server, stubs = await stub_router(start_router, breaks, fine, policy="round_robin", eject_after=100)
    try:
        for stream in (True, True, False):
            assert (await post(http, url, stream))[0] == 200
        counts = await metric_lines(http, url, "kvroute_router_requests_total")
        by_status = {}
        for labels, value in counts.items():
            status = labels.split('status="')[1].split('"')[0]
            by_status[status] = by_status.get(status, 0) + value
        assert by_status.get("broken") == 1 and by_status.get("200", 0) >= 2
        assert set(by_status) <= {"broken", "200", "retried"}
    finally:
        for s in stubs:
            await s.close()


async def test_a_retry_never_goes_back_to_an_instance_it_tried(start_router, http):
    async def fails(request):
        return web.Response(status=500, text="broken engine")

    async def fine(request):
        return web.json_response({"choices": [{"index": 0, "text": "ok"}]})

    # prefix_hash sends a prompt to the same instance every time: only the exclusion of the instance
    # tried (a 5xx keeps it routable) moves the retry elsewhere
    url, server, stubs = await stub_router(start_router, fails, fine, policy="prefix_hash", max_retries=1,
                                           eject_after=100)
    try:
        for i in range(8):
            async with http.post(url + "/v1/completions", json={"prompt": f"{i} " + "word " * 40,
                                                                "max_tokens": 1}) as r:
                assert r.status == 200 and r.headers["x-kvroute-instance"] == "s1", await r.text()
        assert server.app[CLUSTER].by_id("s0").request_failures >= 1
    finally:
        for s in stubs:
            await s.close()
