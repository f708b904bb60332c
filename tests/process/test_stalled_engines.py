"""Progress, not presence (router/fleet/progress.py): an engine whose load reports keep coming
while its progress counter stands still with work held is taken out of routing, and brought back
the moment it moves; an idle engine, or one that reports no counter, never is. One table for the
three engine kinds and the counter each is read by."""

import asyncio
import time

import pytest
from aiohttp import web

from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.app import CLUSTER, METRICS
from tests.support.foreign_stubs import StubEngine
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import stub_engine
from tests.support.waiting import wait_for

PATIENCE_S = 0.3  # --first-byte-timeout-s


class KvrouteStub:
    """A kvroute stub engine whose /load reports `running` and `progress` as the test sets them."""

    def __init__(self) -> None:
        self.running, self.waiting, self.progress = 0, 0, 0

    def app(self) -> web.Application:
        async def load(_default, _request):
            return web.json_response({"instance": "k0", "running": self.running, "waiting": self.waiting,
                                      "kv_used_blocks": 0, "kv_total_blocks": 64, "queued_prefill_tokens": 0,
                                      "progress": self.progress})

        async def never(_request):
            await asyncio.sleep(3600)

        return stub_engine("k0", never, on_load=load)


def _stub(kind: str, counters: bool = True):
    return KvrouteStub() if kind == "kvroute" else StubEngine(kind, load_tokenizer(), counters=counters)


# (kind, the counter that proves progress, a counter that must not, /metrics has counters)
MOVERS = [
    ("kvroute", "progress", None, True),
    ("vllm", "generation_tokens", None, True),
    ("vllm", "prompt_tokens", None, True),
    ("sglang", "realtime_tokens", "generation_tokens", True),  # SGLang's generation counter moves at the end only
]


async def _router(start_router, stub, kind):
    server = await LoopbackServer(stub.app()).start()
    url, router = await start_router([server.url], engine_kinds=(kind,), first_byte_timeout_s=PATIENCE_S,
                                     load_interval_s=0.05)
    inst = router.app[CLUSTER].instances[0]
    assert await wait_for(lambda: inst.routable and inst.load is not None)
    return server, router, inst


async def _tick(stub, field: str | None, stop: asyncio.Event) -> None:
    """Bump `field` of the stub every 50 ms (a counter that moves) until `stop`."""
    while field is not None and not stop.is_set():
        setattr(stub, field, getattr(stub, field) + 7)
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kind,mover,decoy,counters", MOVERS)
async def test_an_engine_holding_work_without_progress_is_out_until_it_moves(start_router, kind, mover, decoy,
                                                                             counters):
    stub = _stub(kind, counters)
    server, router, inst = await _router(start_router, stub, kind)
    stop = asyncio.Event()
    decoy_task = asyncio.ensure_future(_tick(stub, decoy, stop))
    try:
        stub.running = 2
        started = time.monotonic()
        assert await wait_for(lambda: inst.stalled, timeout=5.0), inst.to_dict()
        assert time.monotonic() - started >= PATIENCE_S - 0.05  # not before its patience ran out
        assert not inst.routable and inst.healthy and inst.reachable  # its probes pass: progress decides
        stalls = router.app[METRICS].registry.get_sample_value
        assert stalls("kvroute_router_stalls_total") == 1
        setattr(stub, mover, getattr(stub, mover) + 1)
        assert await wait_for(lambda: inst.routable, timeout=5.0), inst.to_dict()
        assert not inst.stalled and stalls("kvroute_router_stalls_total") == 1
    finally:
        stop.set()
        await decoy_task
        await server.close()


@pytest.mark.parametrize("kind,running,counters", [
    ("kvroute", 0, True),  # idle: nothing running or waiting, never stalled
    ("vllm", 0, True),
    ("sglang", 0, True),
    ("vllm", 2, False),  # busy, but no counter to read: its reports' presence is all there is
    ("sglang", 2, False),
])
async def test_an_idle_engine_or_one_without_a_counter_is_never_stalled(start_router, kind, running, counters):
    stub = _stub(kind, counters)
    stub.running = running
    server, router, inst = await _router(start_router, stub, kind)
    try:
        until = time.monotonic() + 4 * PATIENCE_S
        while time.monotonic() < until:
            assert inst.routable and not inst.stalled, inst.to_dict()
            await asyncio.sleep(0.05)
        assert inst.load.running == running
        assert (inst.load.progress == -1) == (not counters)
    finally:
        await server.close()
