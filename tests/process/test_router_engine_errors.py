"""An engine the router cannot use: logged once with a short reason, again on recovery, shown in /router/instances."""

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from kvroute.router.fleet.upstream_errors import BadAnswer, NotAnEngine, describe_failure
from tests.support.loopback import LoopbackServer
from tests.support.redis_server import free_port


async def instances(http, url) -> list[dict]:
    async with http.get(url + "/router/instances") as r:
        return (await r.json())["instances"]


async def wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.05)):
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_refused_engine_logged_once_then_recovery(start_engine, start_router, http, caplog):
    caplog.set_level(logging.INFO, logger="kvroute.router.fleet.cluster")
    port = free_port()
    url, _ = await start_router([f"http://127.0.0.1:{port}"], health_interval_s=0.05)
    await asyncio.sleep(0.4)  # several failed probes
    rows = await instances(http, url)
    assert rows[0]["last_error"] == "connection refused" and not rows[0]["routable"]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("unreachable: connection refused" in m for m in lines) == 1, lines
    assert not any("ClientConnectorError" in m or "ConnectionKey" in m for m in lines)
    _, engine = await start_engine(port=port, time_scale=0.01)
    assert await wait_for(lambda: _routable(http, url))
    assert (await instances(http, url))[0]["last_error"] is None
    # never reached before: a first contact (INFO), not a recovery (WARNING)
    first = [r for r in caplog.records if "reached; until now: connection refused" in r.getMessage()]
    assert [r.levelno for r in first] == [logging.INFO], [r.getMessage() for r in caplog.records]
    assert not any("reachable again" in r.getMessage() for r in caplog.records)

    await engine.close()  # reached, then lost, then back: that is a recovery
    assert await wait_for(lambda: _unroutable(http, url))
    await start_engine(port=port, time_scale=0.01)
    assert await wait_for(lambda: _routable(http, url))
    again = [r for r in caplog.records if "reachable again; it was: connection refused" in r.getMessage()]
    assert [r.levelno for r in again] == [logging.WARNING], [r.getMessage() for r in caplog.records]


async def _unroutable(http, url) -> bool:
    return not (await instances(http, url))[0]["routable"]


async def _routable(http, url) -> bool:
    return (await instances(http, url))[0]["routable"]


async def test_dns_failure_and_a_server_that_is_not_an_engine(start_router, http):
    app = web.Application()
    app.router.add_get("/health", lambda r: web.json_response({"ok": True}))
    odd = web.Application()
    odd.router.add_get("/kv/info", lambda r: web.json_response({"instance_id": "x"}))
    listed = web.Application()  # JSON, but not an object: once an AttributeError that stopped the health loop
    listed.router.add_get("/kv/info", lambda r: web.json_response([]))
    other, old, array = (await LoopbackServer(app).start(), await LoopbackServer(odd).start(),
                         await LoopbackServer(listed).start())
    try:
        url, _ = await start_router(["http://no-such-host.invalid:8001", other.url, old.url, array.url],
                                    health_interval_s=0.05)
        await asyncio.sleep(0.3)
        errors = {row["url"]: row["last_error"] for row in await instances(http, url)}
    finally:
        await other.close()
        await old.close()
        await array.close()
    assert errors["http://no-such-host.invalid:8001"] == "DNS lookup failed for no-such-host.invalid"
    assert errors[other.url].startswith("not a kvroute engine: GET /kv/info answered HTTP 404")
    assert errors[old.url].startswith("incompatible: malformed /kv/info")
    assert errors[array.url] == "incompatible: malformed /kv/info: an object expected, got list"


@pytest.mark.parametrize("exc, reason", [
    (TimeoutError(), "timed out"),
    (aiohttp.ServerDisconnectedError(), "the engine closed the connection"),
    (NotAnEngine("GET /kv/info did not answer JSON"), "not a kvroute engine: GET /kv/info did not answer JSON"),
    (BadAnswer("GET /health answered HTTP 503"), "GET /health answered HTTP 503"),
])
def test_describe_failure(exc, reason):
    assert describe_failure(exc) == reason
