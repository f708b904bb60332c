"""The fleet's GETs through the lean keep-alive client (router/fleet/kinds/http.py `EngineHTTP` with `lean`):
the same answers and the same errors as through aiohttp's client, on a real loopback server, with the
connection kept for the next poll; URLs the lean client does not serve still go through aiohttp."""

import asyncio

import aiohttp
import pytest
from aiohttp import web

from kvroute.router.fleet.kinds import http as engine_http
from kvroute.router.fleet.kinds.http import EngineHTTP, NotServed, plain_target
from kvroute.router.fleet.upstream_errors import BadAnswer
from kvroute.router.service.upstream import Upstream
from tests.support.loopback import LoopbackServer


@pytest.fixture
async def engine():
    async def load(request):
        return web.json_response({"running": 1, "query": request.query_string})

    async def status(request):
        return web.json_response({"error": "no"}, status=int(request.match_info["code"]))

    async def big(_):
        return web.Response(body=b"x" * 101)

    async def slow(_):
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/load", load)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    server = await LoopbackServer(app).start()
    yield server.url
    await server.close()


@pytest.fixture
async def clients():
    lean = Upstream()
    async with aiohttp.ClientSession() as session:
        yield EngineHTTP(session=session, timeout_s=2.0, lean=lean), EngineHTTP(session=session, timeout_s=2.0), lean
    lean.close()


async def test_a_poll_goes_through_the_lean_client_and_keeps_its_connection(engine, clients):
    http, _, lean = clients
    for _ in range(3):
        assert await http.json(engine + "/load?x=1") == {"running": 1, "query": "x=1"}
    target = plain_target(engine + "/load")
    assert target is not None and len(lean._idle[target[:2]]) == 1  # one connection, reused by every poll


@pytest.mark.parametrize("code, error, match", [(404, NotServed, "answered HTTP 404"),
                                                (501, NotServed, "answered HTTP 501"),
                                                (503, ValueError, "answered HTTP 503")])
async def test_an_error_status_is_the_same_error_through_either_client(engine, clients, code, error, match):
    for http in clients[:2]:
        with pytest.raises(error, match=match):
            await http.json(f"{engine}/status/{code}")


async def test_a_body_over_the_cap_and_a_slow_answer_fail_as_through_aiohttp(engine, clients, monkeypatch):
    monkeypatch.setattr(engine_http, "MAX_BODY_BYTES", 100)
    lean = clients[2]
    for http in clients[:2]:
        with pytest.raises(ValueError, match="answered more than 100 bytes"):
            await http.text(engine + "/big")
        with pytest.raises(TimeoutError):
            await EngineHTTP(session=http.session, timeout_s=0.2, lean=http.lean).json(engine + "/slow")
    assert not any(lean._idle.values())  # a connection given up on mid-answer is not reused


def test_only_plain_http_urls_go_through_the_lean_client_by_one_rule_for_polls_and_the_proxy():
    from kvroute.router.service.proxy import Proxy

    assert plain_target("http://10.0.0.1:8000/v1/load?a=b") == ("10.0.0.1", 8000, "/v1/load?a=b")
    assert plain_target("http://[::1]:9/load") == ("::1", 9, "/load")
    assert plain_target("http://e/load") == ("e", 80, "/load")
    for url in ("https://e:8000/load", "http://user:pw@e:8000/load", "http://e:99999/load", "http:///load"):
        assert plain_target(url) is None and Proxy._address(url) is None  # aiohttp sends these (or says why not)
    assert Proxy._address("http://e:8000/") == ("e", 8000, "")
    assert Proxy._address("http://e/base/") == ("e", 80, "/base")


async def test_a_poll_that_times_out_on_a_reused_connection_closes_it():
    """A connection taken from the pool and given up on before the answer's head is closed, not left open."""
    closed = asyncio.Event()
    requests = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while await reader.readuntil(b"\r\n\r\n"):
            requests += 1
            if requests > 1:  # the second request on this connection is never answered
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await reader.read()  # until the client closes
        closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    lean = Upstream()
    http = EngineHTTP(session=None, timeout_s=0.3, lean=lean)
    try:
        assert await http.json(f"http://127.0.0.1:{port}/load") == {}
        with pytest.raises(TimeoutError):
            await http.json(f"http://127.0.0.1:{port}/load")  # on the pooled connection
        await asyncio.wait_for(closed.wait(), 5.0)
    finally:
        lean.close()
        server.close()
        await server.wait_closed()


async def test_the_event_feeds_go_through_the_lean_client_with_their_query_and_errors(engine, clients):
    http, _, lean = clients
    assert await http.feed(engine, "/load", {"since": 3, "epoch": 1}, wait_s=0.1) == {
        "running": 1, "query": "since=3&epoch=1"}
    target = plain_target(engine + "/load")
    assert target is not None and len(lean._idle[target[:2]]) == 1  # through the lean client, kept
    with pytest.raises(BadAnswer, match=r"GET /status/503 answered HTTP 503"):
        await http.feed(engine, "/status/503")
    with pytest.raises(BadAnswer, match=r"GET /big did not answer JSON"):
        await http.feed(engine, "/big")


def test_the_host_header_brackets_an_ipv6_address():
    from kvroute.router.service.upstream import authority

    assert authority("::1", 8000) == "[::1]:8000"  # urlsplit's hostname drops the brackets
    assert authority("127.0.0.1", 8000) == "127.0.0.1:8000"
    assert authority("engine-0.svc", 80) == "engine-0.svc:80"
