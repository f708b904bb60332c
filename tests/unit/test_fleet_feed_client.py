"""The fleet's public client for the event feeds (router/fleet/kinds/http.py `EngineHTTP.feed`): the JSON of
/kv/snapshot and of a /kv/events long poll from a real engine, waiting up to the connect timeout plus the
poll's own wait, and BadAnswer (never another exception) for an error status or a body that is not JSON."""

import time

import aiohttp
import pytest
from aiohttp import web

from kvroute.router.fleet.kinds.http import EngineHTTP
from kvroute.router.fleet.upstream_errors import BadAnswer
from tests.support.loopback import LoopbackServer


async def test_feed_reads_a_real_engines_snapshot_and_long_poll(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    client = EngineHTTP(session=http, timeout_s=0.5)
    snap = await client.feed(url, "/kv/snapshot")
    assert isinstance(snap["seq"], int) and isinstance(snap["epoch"], int)
    t0 = time.monotonic()
    params = {"since": snap["seq"], "timeout": 1.0, "epoch": snap["epoch"]}  # nothing new: it waits the second
    events = await client.feed(url, "/kv/events", params, wait_s=1.0)
    assert events["events"] == [] and time.monotonic() - t0 >= 0.9  # the poll's 1 s wait outlasts the 0.5 s timeout


@pytest.fixture
async def bad_engine():
    async def error(_):
        return web.json_response({"error": "down"}, status=503)

    async def not_json(_):
        return web.Response(text="<html>hello</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/kv/events", error)
    app.router.add_get("/kv/snapshot", not_json)
    server = await LoopbackServer(app).start()
    yield server.url
    await server.close()


async def test_an_error_status_or_a_body_not_json_is_a_bad_answer(bad_engine):
    async with aiohttp.ClientSession() as session:
        client = EngineHTTP(session=session, timeout_s=2.0)
        with pytest.raises(BadAnswer, match=r"GET /kv/events answered HTTP 503"):
            await client.feed(bad_engine, "/kv/events", {"since": 0})
        with pytest.raises(BadAnswer, match=r"GET /kv/snapshot did not answer JSON"):
            await client.feed(bad_engine, "/kv/snapshot")
