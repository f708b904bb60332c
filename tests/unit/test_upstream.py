"""The router's lean HTTP/1.1 client (router/service/upstream.py) against real aiohttp servers on loopback."""

import asyncio

import aiohttp
import pytest
from aiohttp import web

from kvroute.router.fleet.upstream_errors import describe_failure
from kvroute.router.service.upstream import Upstream
from tests.support.loopback import LoopbackServer


async def serve(routes) -> LoopbackServer:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    return await LoopbackServer(app).start()


def address(server):
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


async def test_whole_bodies_streams_and_connection_reuse():
    async def whole(request):
        return web.json_response({"echo": (await request.json())["x"]}, headers={"Retry-After": "3"})

    async def stream(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(50):
            await resp.write(f"data: {i}\n\n".encode())
        await resp.write_eof()
        return resp

    server = await serve({"/whole": whole, "/stream": stream})
    up = Upstream()
    try:
        host, port = address(server)
        for i in range(5):
            r = await up.post(host, port, "/whole", b'{"x": %d}' % i, 1.0, 5.0)
            assert r.status == 200 and r.headers.get("Content-Type").startswith("application/json")
            assert "retry-after" in r.headers and r.headers["Retry-After"] == "3"
            assert await r.read() == b'{"echo": %d}' % i
            r.close()
        assert len(up._idle[(host, port)]) == 1  # one connection, reused
        r = await up.post(host, port, "/stream", b"{}", 1.0, 5.0)
        got = bytearray()
        while chunk := await r.readany():
            got += chunk
        r.close()
        assert got.decode() == "".join(f"data: {i}\n\n" for i in range(50))  # chunked encoding decoded
        assert len(up._idle[(host, port)]) == 1
    finally:
        up.close()
        await server.close()


async def test_refused_slow_and_broken_engines_raise_aiohttps_errors():
    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def broken(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"partial")
        request.transport.close()  # dies mid-answer
        return resp

    server = await serve({"/slow": slow, "/broken": broken})
    up = Upstream()
    try:
        host, port = address(server)
        with pytest.raises(aiohttp.ClientOSError) as e:
            dead = await LoopbackServer(web.Application()).start()
            dead_port = address(dead)[1]
            await dead.close()
            await up.post(host, dead_port, "/x", b"{}", 1.0, 1.0)
        assert describe_failure(e.value) == "connection refused"
        with pytest.raises(asyncio.TimeoutError):
            await up.post(host, port, "/slow", b"{}", 1.0, 0.2)  # no head within the read timeout
        r = await up.post(host, port, "/broken", b"{}", 1.0, 2.0)
        with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
            while await r.readany():
                pass
        r.close()
    finally:
        up.close()
        await server.close()


async def test_a_pooled_connection_the_engine_drops_unanswered_is_retried_once_on_a_fresh_one():
    """The engine closes a kept-alive connection as the next request goes out: it never read
    it, so the request goes again on a new connection (what an answered byte would forbid)."""
    answered = []

    async def engine(reader, writer):  # answers the first request of each connection, drops the second
        for n in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if n == 1:
                writer.close()
                return
            answered.append(1)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = Upstream()
    try:
        for _ in range(3):
            r = await up.post("127.0.0.1", port, "/x", b"{}", 1.0, 2.0)
            assert (r.status, await r.read()) == (200, b"ok")
            r.close()
        assert len(answered) == 3
    finally:
        up.close()
        server.close()


async def test_a_slow_reader_pauses_the_engine_and_gets_every_byte():
    size = 8 << 20

    async def big(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(size // 65536):
            await resp.write(b"x" * 65536)
        await resp.write_eof()
        return resp

    server = await serve({"/big": big})
    up = Upstream()
    try:
        host, port = address(server)
        r = await up.post(host, port, "/big", b"{}", 1.0, 5.0)
        total = 0
        await asyncio.sleep(0.3)  # the engine writes while nobody reads: the client pauses at 1 MiB
        assert r._buffered <= (1 << 20) + (1 << 18)
        while chunk := await r.readany():
            total += len(chunk)
        r.close()
        assert total == size
    finally:
        up.close()
        await server.close()


async def test_the_read_timeout_bounds_each_wait_not_the_whole_stream():
    """One timer per answer, moved on lazily: chunks 0.1 s apart for 0.8 s in all pass a 0.3 s read
    timeout (a timer that did not move on would fire mid-stream), a 0.6 s stall does not, and
    with no read timeout (the proxy's whole answers) nothing times the wait out here."""

    async def paced(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(8):
            await resp.write(b"chunk %d;" % i)
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)
        await resp.write(b"late")
        await resp.write_eof()
        return resp

    server = await serve({"/paced": paced})
    up = Upstream()
    try:
        host, port = address(server)
        r = await up.post(host, port, "/paced", b"{}", 1.0, 0.3)
        got = bytearray()
        with pytest.raises(asyncio.TimeoutError):
            while chunk := await r.readany():
                got += chunk
        r.close()
        assert got == b"".join(b"chunk %d;" % i for i in range(8))
        assert r._timer is None  # closed: no timer left holding the answer
        r = await up.post(host, port, "/paced", b"{}", 1.0, None)
        assert (await r.read()).endswith(b"chunk 7;late")
        r.close()
    finally:
        up.close()
        await server.close()
