"""The router's request path makes no reference cycles: what a request allocates is freed by reference
counting when it ends, so the cyclic collector has nothing to find (router/contract/serve.py
`settle_gc` counts on it). One stray cycle per request (a self-referencing closure, an object that
points at itself) costs a collection's walk over it, and once cost the router a sixth of its CPU."""

import asyncio
import gc

import orjson
import pytest

from kvroute.loadgen.processes import free_port, kvroute_argv, spawn, stop_process
from tests.support.waiting import wait_for

REQUESTS = 120


@pytest.fixture(scope="module")
def sim_engine():
    port = free_port()
    proc = spawn(kvroute_argv("engine", "--backend", "sim", "--host", "127.0.0.1", "--port", str(port),
                              "--time-scale", "0.001", "--log-level", "WARNING"))
    yield f"http://127.0.0.1:{port}"
    stop_process(proc, grace_s=10.0)


async def post(reader, writer, path: str, body: dict) -> tuple[int, bytes]:
    """One request on a kept-alive connection; the answer by Content-Length or chunks."""
    payload = orjson.dumps(body)
    writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (path.encode(), len(payload), payload))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        out = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if not size:
                return status, out
            out += chunk[:-2]
    length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    return status, await reader.readexactly(length)


async def cycles_left(url: str) -> tuple[int, list[str]]:
    """Objects in reference cycles left by REQUESTS requests to `url` (after a warm-up), and their types."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    bodies = [("/v1/completions", {"prompt": f"a shared prefix and then question {i}", "max_tokens": 3,
                                   "stream": bool(i % 2)}) for i in range(4)]
    bodies.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
    for path, body in bodies:  # warm: connections, caches, first-use tables
        assert (await post(reader, writer, path, body))[0] == 200
    gc.collect()
    gc.disable()
    try:
        for i in range(REQUESTS):
            path, body = bodies[i % len(bodies)]
            status, answer = await post(reader, writer, path, body)
            assert status == 200, answer
        gc.set_debug(gc.DEBUG_SAVEALL)
        found = gc.collect()
        kinds = sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        writer.close()
    return found, kinds


async def test_router_requests_leave_nothing_for_the_cyclic_collector(sim_engine, start_router):
    from kvroute.router.service.app import CLUSTER

    url, router = await start_router([sim_engine])
    await wait_for(lambda: all(i.routable for i in router.app[CLUSTER].instances), timeout=30)
    found, kinds = await cycles_left(url)
    # the load and event polls in the background may leave a little; a cycle per request leaves >= REQUESTS
    assert found < REQUESTS // 2, f"{found} objects in reference cycles after {REQUESTS} requests: {kinds}"


async def test_engine_requests_leave_nothing_for_the_cyclic_collector(start_engine):
    url, _ = await start_engine(time_scale=0.001)
    found, kinds = await cycles_left(url)
    assert found < REQUESTS // 2, f"{found} objects in reference cycles after {REQUESTS} requests: {kinds}"
