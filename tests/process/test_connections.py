"""Connection hygiene: silent and slow-header clients are closed, excess connections refused, and
normal requests keep answering meanwhile (router/contract/connections.py)."""

import asyncio
import time

from kvroute.router.contract.connections import CONNECTION_GUARD
from kvroute.router.service.app import CLUSTER

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
    except TimeoutError:
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


STALLED_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n")


async def _stall(port: int, address: str, length: int, sent: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from `address` that sends a head declaring `length` body bytes, `sent` of them, and stops."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    writer.write(STALLED_HEAD % length + b" " * sent)
    await writer.drain()
    return reader, writer


async def test_stalled_connections_from_many_addresses_cannot_keep_a_client_out(start_engine, start_router, http):
    """200 connections from 200 loopback addresses, each stalled in its body, filled --max-connections
    200 and a normal client was reset; now the newcomer displaces the one waiting longest on its
    client, and a connection serving a request is never the one displaced."""
    url, server = await _router(start_engine, start_router, max_connections=200,
                                body_timeout_s=30.0)
    port = int(url.rsplit(":", 1)[1])
    stalled = [await _stall(port, f"127.0.0.{2 + i}", 1 << 20, 1000) for i in range(200)]
    guard = server.app[CONNECTION_GUARD]
    await _until(lambda: guard.open == 200)
    for _ in range(5):
        async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
            assert r.status == 200
    assert 1 <= guard.closed["displaced"] <= 5 and guard.closed["over_capacity"] == 0
    assert await _closed(stalled[0][0], 2.0)  # the oldest went first
    assert not stalled[-1][0].at_eof()
    for _, writer in stalled:
        writer.close()


async def test_bodies_being_received_are_capped_together_and_released(start_engine, start_router, http):
    """Stalled bodies hold at most --body-buffer-bytes together: past it a body gets 503 with
    Retry-After; the stalled ones get 408 at --body-timeout-s and their bytes are released."""
    url, server = await _router(start_engine, start_router, body_buffer_bytes=1 << 20,
                                body_timeout_s=1.0)
    port = int(url.rsplit(":", 1)[1])
    guard = server.app[CONNECTION_GUARD]
    first = [await _stall(port, "127.0.0.1", 1 << 20, 300_000) for _ in range(3)]
    await _until(lambda: guard.body_bytes == 900_000)
    reader, writer = await _stall(port, "127.0.0.1", 1 << 20, 300_000)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
    assert guard.body_buffer_refused == 1
    for stalled_reader, _ in first:  # the default --body-timeout-s would take 30 s
        head = await asyncio.wait_for(stalled_reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
    assert guard.closed["body_timeout"] == 3
    await _until(lambda: guard.body_bytes == 0)
    async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
        assert r.status == 200
    for _, w in [*first, (reader, writer)]:
        w.close()


async def _until(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
