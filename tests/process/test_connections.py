"""Connection hygiene: silent and slow-header clients are closed, excess connections refused, and
normal requests keep answering meanwhile (router/contract/connections.py)."""

import asyncio
import time

from router.contract.connections import CONNECTION_GUARD
from router.service.app import CLUSTER

FAST = 0.01


async def _router(start_engine, start_router, **kw):
    engine_url, _ = await start_engine(time_scale=FAST)
    url, server = await start_router([engine_url], **kw)
    deadline = time.monotonic() + 5
    while not server.app[CLUSTER].instances[0].routable:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    return url, server


async def _closed(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """The server closed (or reset: it aborts) the connection within `timeout_s`."""
    try:
        return await asyncio.wait_for(reader.read(), timeout_s) == b""
    except ConnectionError:
        return True
    except asyncio.TimeoutError:
        return False


async def _trickle(port: int, every_s: float, stop: asyncio.Event):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    try:
        while not stop.is_set() and not reader.at_eof():
            await asyncio.sleep(every_s)
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()
    except ConnectionError:
        pass
    return reader, writer


async def test_slow_header_and_silent_clients_are_closed_normal_requests_go_on(start_engine, start_router, http):
    """300 clients trickling header lines and 300 that never send a byte were all still open after
    30 s; now each is closed at the header timeout while a normal request still answers."""
    url, server = await _router(start_engine, start_router, header_timeout_s=1.0)
    port = int(url.rsplit(":", 1)[1])
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
    slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
    for _, writer in slow:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
        assert r.status == 200
    for _ in range(3):  # a header line every 0.3 s keeps no connection alive past the timeout
        await asyncio.sleep(0.3)
        for _, writer in slow:
            if not writer.is_closing():
                writer.write(b"X-Slow: 1\r\n")
    results = await asyncio.gather(*(_closed(reader, 5.0) for reader, _ in silent + slow))
    guard = server.app[CONNECTION_GUARD]
    assert all(results), (f"{results.count(False)} of {len(results)} still open (silent {results[:300].count(False)}, "
                          f"slow {results[300:].count(False)}; guard open {guard.open}, closed {dict(guard.closed)})")
    guard = server.app[CONNECTION_GUARD]
    assert guard.closed["header_timeout"] >= 600
    async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
        assert r.status == 200
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    assert 'kvroute_router_connections_closed_total{reason="header_timeout"}' in text
    for _, writer in silent + slow:
        writer.close()


async def test_a_kept_alive_connection_serves_many_requests_within_the_header_timeout(start_engine, start_router,
                                                                                       http):
    url, server = await _router(start_engine, start_router, header_timeout_s=0.5)
    for _ in range(4):  # one pooled connection, idle gaps longer than the header timeout in between
        async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
            assert r.status == 200
        await asyncio.sleep(0.7)
    assert server.app[CONNECTION_GUARD].closed["header_timeout"] <= 1  # at most the idle pooled one


async def test_connections_past_the_per_peer_cap_are_refused_the_open_ones_kept(start_engine, start_router, http):
    url, server = await _router(start_engine, start_router, max_connections_per_peer=20, header_timeout_s=30.0)
    port = int(url.rsplit(":", 1)[1])
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(25)]
    await asyncio.sleep(0.2)
    guard = server.app[CONNECTION_GUARD]
    assert guard.closed["over_peer_capacity"] >= 5 and guard.by_peer["127.0.0.1"] <= 20
    for _, writer in held[:20]:
        writer.close()
    await asyncio.sleep(0.2)
    async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
        assert r.status == 200
    for _, writer in held[20:]:
        writer.close()
