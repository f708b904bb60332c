"""The test process's memory plugin (tests/support/process_memory.py): what a test leaves behind goes
after it, even where a simulation froze it or aiohttp cached it."""

import asyncio
import gc
import subprocess
import sys
import weakref

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.support.process_memory import children_peak_mb, reclaim, rss_mb


class _Node:
    pass


def test_reclaim_frees_a_dead_cycle_that_a_simulation_froze():
    node = _Node()
    node.me = node  # a cycle: only the cyclic collector frees it
    ref = weakref.ref(node)
    gc.freeze()  # what loadgen/sim/parallel.py does after each in-process simulation
    del node
    gc.collect()
    assert ref() is not None  # frozen: no collection looks at it any more
    reclaim(None)
    assert ref() is None and gc.get_freeze_count() == 0


async def _serve_once() -> weakref.ref:
    @web.middleware
    async def passthrough(request: web.Request, handler):
        return await handler(request)

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application(middlewares=[passthrough])
    app.router.add_get("/", hello)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert (await client.get("/")).status == 200
    return weakref.ref(app)


def test_reclaim_lets_go_of_an_app_whose_middleware_chain_aiohttp_cached():
    ref = asyncio.run(_serve_once())
    gc.collect()
    assert ref() is not None  # aiohttp's process-wide lru_cache holds the app, served once and closed
    reclaim(None)
    gc.collect()
    assert ref() is None


def test_the_figures_it_reports_are_this_process_and_its_children():
    assert rss_mb() is not None and rss_mb() > 10
    subprocess.run([sys.executable, "-c", "x = bytearray(300 << 20); x[::4096] = b'1' * len(x[::4096])"], check=True)
    assert children_peak_mb() >= 300  # a child that touched 300 MB, waited for
