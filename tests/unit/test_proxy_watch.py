"""The silence watch on a non-streamed answer (router/service/attempt_deadlines.py), on loopback
stubs: a load report that comes during the wait re-arms the watch, so an engine that then goes
silent is still given up on at --first-byte-timeout-s of silence (not at --request-timeout-s), and
no watch timer outlives the answer it watched."""

import asyncio
import logging
import time

import orjson
from aiohttp import web

from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import stub_engine
from tests.support.waiting import wait_for


async def test_a_load_report_during_the_wait_rearms_the_watch(start_router, http):
    entered, stop = [], asyncio.Event()

    async def hangs(request):
        entered.append(time.monotonic())
        await stop.wait()
        return web.json_response({"choices": [{"index": 0, "text": "too late"}]})

    async def reports_then_goes_silent(get_load, request):
        if entered and time.monotonic() - entered[0] > 0.15:  # reports for 0.15 s of the 0.3 s patience
            await stop.wait()
        return await get_load(request)

    stub = await LoopbackServer(stub_engine("s0", hangs, on_load=reports_then_goes_silent)).start()
    try:
        url, server = await start_router([stub.url], max_retries=0, load_interval_s=0.05, first_byte_timeout_s=0.3,
                                         request_timeout_s=5.0, eject_after=100)
        assert await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
        async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as r:
            status, body = r.status, await r.read()
        assert status == 503, body
        message = orjson.loads(body)["error"]["message"]
        # the watch fired while reports still came, waited again, then found the silence
        assert message.startswith("instance s0 timed out (no answer and no load report for "), message
    finally:
        stop.set()
        await stub.close()


async def test_no_watch_timer_outlives_the_answer(start_router, http, caplog):
    quiet, stop = asyncio.Event(), asyncio.Event()

    async def quick(request):
        return web.json_response({"choices": [{"index": 0, "text": "ok"}]})

    async def reports_until_quiet(get_load, request):
        if quiet.is_set():
            await stop.wait()
        return await get_load(request)

    caplog.set_level(logging.ERROR)
    stub = await LoopbackServer(stub_engine("s0", quick, on_load=reports_until_quiet)).start()
    try:
        url, server = await start_router([stub.url], load_interval_s=0.05, first_byte_timeout_s=0.2,
                                         request_timeout_s=5.0)
        assert await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
        for _ in range(3):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as r:
                assert r.status == 200
        quiet.set()  # no load report from now on: a watch still armed would fire into a finished wait
        await asyncio.sleep(0.5)
        assert not [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    finally:
        stop.set()
        await stub.close()
