"""A startup cut short is cleaned up, and a part that hangs in its own cleanup does not hold the exit
(router/contract/serve.py)."""

import asyncio

from aiohttp import web

from kvroute.router.contract import serve


async def test_a_cleanup_that_hangs_is_given_up_after_its_limit(monkeypatch):
    monkeypatch.setattr(serve, "SETUP_CLEANUP_S", 0.2)
    cleaned, released = asyncio.Event(), asyncio.Event()

    async def hangs(app: web.Application) -> None:
        cleaned.set()
        await released.wait()  # never set: a part stuck in its own cleanup

    app = web.Application()
    app.on_cleanup.append(hangs)
    runner = web.AppRunner(app)
    await runner.setup()
    await asyncio.wait_for(serve._cleanup_after_failed_setup(runner), timeout=5)
    assert cleaned.is_set() and not released.is_set()  # the cleanup ran, and was given up on
