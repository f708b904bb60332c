"""Stopping a server: a part that hangs in its own cleanup does not hold the exit, whether the
server stops after serving or its startup was cut short (router/contract/serve.py `_serve`)."""

import asyncio

import pytest
from aiohttp import web

from kvroute.router.contract import serve


def hanging_app(cleaned: asyncio.Event, released: asyncio.Event) -> web.Application:
    async def hangs(app: web.Application):
        yield
        cleaned.set()
        await released.wait()  # never set: a part stuck in its own cleanup

    app = web.Application()
    app.cleanup_ctx.append(hangs)
    return app


async def test_a_server_whose_cleanup_hangs_still_stops_and_says_so(monkeypatch):
    monkeypatch.setattr(serve, "CLEANUP_S", 0.3)
    monkeypatch.setattr(serve, "settle_gc", lambda: None)  # the test process's collector stays as it is
    cleaned, released = asyncio.Event(), asyncio.Event()
    app = hanging_app(cleaned, released)
    sock = serve.bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    served = asyncio.create_task(serve._serve(app, sock, "test", None))
    for _ in range(100):  # until it listens
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            await asyncio.sleep(0.05)
    app[serve.SHUTDOWN].set()
    status = await asyncio.wait_for(served, timeout=5)
    assert status == 1 and cleaned.is_set() and not released.is_set()  # ran, given up on, reported


async def test_a_startup_cut_short_is_cleaned_up_within_the_limit(monkeypatch):
    monkeypatch.setattr(serve, "CLEANUP_S", 0.3)
    cleaned, released = asyncio.Event(), asyncio.Event()
    app = hanging_app(cleaned, released)

    async def fails(app: web.Application) -> None:
        raise RuntimeError("startup failed part way")

    app.on_startup.append(fails)
    with pytest.raises(RuntimeError, match="part way"):
        await asyncio.wait_for(serve._serve(app, serve.bind_socket("127.0.0.1", 0), "test", None), timeout=5)
    assert cleaned.is_set() and not released.is_set()
