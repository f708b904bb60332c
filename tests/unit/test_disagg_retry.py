"""A disaggregated whole (non-streamed) request whose decode engine dies before answering is retried on
another decode engine, as a colocated request is retried, with the prefill's handle while it is valid
(router/service/disagg.py `_decode_whole`)."""

import time

import pytest
from aiohttp import web

from kvroute.router.service import prefilled
from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.router_cluster import FAST
from tests.support.stub_engine import stub_engine
from tests.support.waiting import wait_for

SECRET = "retry-test-secret"


async def _pd_fleet(start_engine, start_router, dies):
    """A sim prefill engine, a sim decode engine and a decode engine whose completions `dies` answers."""
    p_url, _ = await start_engine(time_scale=FAST, role="prefill", instance_id="p0", kv_secret=SECRET)
    d_url, _ = await start_engine(time_scale=FAST, role="decode", instance_id="d0", kv_secret=SECRET)
    dead = await LoopbackServer(stub_engine("d-dies", dies, role="decode")).start()
    url, server = await start_router([p_url, d_url, dead.url], kv_secret=SECRET, pd_min_uncached=16,
                                     eject_after=100, seed=1)
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    return url, server, dead


@pytest.mark.parametrize("how", ["drops the connection", "answers 500"])
async def test_whole_requests_survive_a_decode_engine_that_dies_before_answering(start_engine, start_router, http,
                                                                                how):
    reached = []

    async def dies(request):
        reached.append((await request.json()).get("kv_transfer_params"))
        if how == "answers 500":
            return web.Response(status=500, text="decode engine died")
        request.transport.close()
        return web.Response()

    url, server, dead = await _pd_fleet(start_engine, start_router, dies)
    try:
        statuses = []
        for i in range(12):
            body = {"prompt": f"request {i}: " + " ".join(f"w{i}x{j}" for j in range(60)), "max_tokens": 4}
            async with http.post(url + "/v1/completions", json=body) as r:
                statuses.append((r.status, r.headers.get("x-kvroute-instance")))
        assert statuses == [(200, "d0")] * 12
        assert reached and all(params and params.get("handle") for params in reached)  # it was picked, with handles
        assert all(i.inflight == 0 and i.queued_prefill_tokens == 0 for i in server.app[CLUSTER].instances)
    finally:
        await dead.close()


def test_a_handle_about_to_expire_is_not_sent_again():
    handle = {"kv_transfer_params": {"handle": {"expires": time.time() + 60}}}
    assert prefilled.valid_handle(handle) is handle["kv_transfer_params"]
    handle["kv_transfer_params"]["handle"]["expires"] = time.time() + prefilled.HANDLE_MARGIN_S / 2
    assert prefilled.valid_handle(handle) is None  # the retry goes whole: the decode engine computes it
