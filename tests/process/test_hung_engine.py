"""A hung engine does not hold a non-streamed request longer than a stream's first-byte timeout."""

import asyncio
import time

from aiohttp import web

from kvroute.engine.service.app_keys import ENGINE
from kvroute.router.service.app import CLUSTER, METRICS
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import stub_engine
from tests.support.waiting import wait_for

FAST = 0.01


def hangable_engine(instance_id: str):
    """A stub engine whose every answer (load reports included) stops once `state["hung"]` is set, as
    a SIGSTOPped engine's would: it accepts connections and never answers."""
    state = {"hung": False}

    async def completions(request):
        await asyncio.sleep(3600)

    app = stub_engine(instance_id, completions)

    @web.middleware
    async def hang(request, handler):
        if state["hung"]:
            await asyncio.sleep(3600)
        return await handler(request)

    app.middlewares.append(hang)
    return app, state


async def test_non_streamed_requests_fail_over_from_a_hung_engine(start_engine, start_router, http):
    """With one hung engine beside a good one, 3 of 6 non-streamed requests used to wait for
    --request-timeout-s (600 s); now each answers within --first-byte-timeout-s plus one request."""
    good_url, _ = await start_engine(time_scale=FAST, instance_id="good")
    app, state = hangable_engine("hung")
    hung = await LoopbackServer(app).start()
    url, router = await start_router([good_url, hung.url], policy="round_robin", first_byte_timeout_s=1.0)
    cluster = router.app[CLUSTER]
    deadline = time.monotonic() + 5
    while not all(i.routable for i in cluster.instances):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    state["hung"] = True

    async def ask(n):
        async with http.post(url + "/v1/completions", json={"prompt": f"question {n}", "max_tokens": 2}) as r:
            return r.status, r.headers.get("x-kvroute-instance")

    started = time.monotonic()
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(ask(n) for n in range(6))), 6.0)
    finally:
        await hung.close()
    assert answers == [(200, "good")] * 6
    assert time.monotonic() - started < 1.0 + 3.0  # the first-byte timeout plus a normal request, with slack
    assert router.app[METRICS].registry.get_sample_value("kvroute_router_retries_total") >= 1  # failed over


async def test_a_slow_but_alive_engine_is_waited_for(start_router, http):
    """An engine that keeps reporting its load is working: its non-streamed answer is awaited past
    the first-byte timeout (bounded by --request-timeout-s alone)."""
    async def slow(request):
        await asyncio.sleep(1.5)
        return web.json_response({"id": "x", "object": "text_completion", "choices": [
            {"index": 0, "text": "ok", "finish_reason": "stop"}], "usage": {"prompt_tokens": 1,
                                                                          "completion_tokens": 1}})

    engine = await LoopbackServer(stub_engine("slow", slow)).start()
    try:
        url, router = await start_router([engine.url], first_byte_timeout_s=0.5)
        deadline = time.monotonic() + 5
        while not router.app[CLUSTER].instances[0].routable:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}) as r:
            assert r.status == 200 and (await r.json())["choices"][0]["text"] == "ok"
    finally:
        await engine.close()


STUCK = 1e6  # --time-scale of an engine whose first step never ends: a stuck step loop, a live HTTP server


async def test_whole_requests_fail_over_from_an_engine_whose_step_loop_is_stuck(start_engine, start_router, http):
    """Finding 8 of issue 36: an engine whose /load and /kv/events keep answering while its step loop
    is stuck held whole requests: 3 of 6 through a round_robin router with --first-byte-timeout-s 3
    were unanswered after 12 s, because load reports counted as proof of life. Its progress counter
    stands still now, so each is failed over within the first-byte timeout plus 1 s, and the engine
    stays out of routing while it holds work without moving."""
    patience = 2.0
    good_url, _ = await start_engine(time_scale=FAST, instance_id="good")
    stuck_url, stuck_server = await start_engine(time_scale=STUCK, instance_id="stuck")
    url, router = await start_router([good_url, stuck_url], policy="round_robin", first_byte_timeout_s=patience)
    cluster = router.app[CLUSTER]
    assert await wait_for(lambda: all(i.routable and i.load is not None for i in cluster.instances))

    async def ask(n):
        started = time.monotonic()
        async with http.post(url + "/v1/completions", json={"prompt": f"question {n}", "max_tokens": 2}) as r:
            return r.status, r.headers.get("x-kvroute-instance"), time.monotonic() - started

    answers = await asyncio.wait_for(asyncio.gather(*(ask(n) for n in range(6))), 3 * patience + 5)
    assert [(status, who) for status, who, _ in answers] == [(200, "good")] * 6
    assert max(took for _, _, took in answers) <= patience + 1.0, answers
    stuck = cluster.by_id("stuck")
    assert stuck_server.app[ENGINE].scheduler.has_work()  # it still holds them, stuck in its first step
    assert time.monotonic() - stuck.load_seen < 1.0  # and still reports its load
    assert await wait_for(lambda: stuck.stalled and not stuck.routable)
    assert router.app[METRICS].registry.get_sample_value("kvroute_router_stalls_total") == 1
