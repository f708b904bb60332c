"""The routing-loss split on the router's HTTP path, in front of sim engines (router/service/routing_loss.py)."""

import pytest

from kvroute.router.service.app import CLUSTER, ROUTER
from tests.support.router_cluster import cluster, prompt
from tests.support.waiting import wait_for


async def send(http, url, text, stream=False, server=None):
    """Send one request; with `server`, wait until the index knows the blocks it left where it ran."""
    body = {"prompt": text, "max_tokens": 2, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with http.post(url + "/v1/completions", json=body) as r:
        await r.read()
        assert r.status == 200
        served_by = r.headers["x-kvroute-instance"]
        figures = {k: int(v) for k, v in r.headers.items() if k.endswith("-cached-tokens")}
    if server is not None:
        inst = next(i for i in server.app[CLUSTER].instances if i.id == served_by)
        assert await wait_for(lambda: inst.blocks_indexed > 0)
    return figures


async def stats(http, url):
    async with http.get(url + "/router/stats") as r:
        return (await r.json())["routing_loss"]


async def test_round_robin_loses_to_balancing_and_kv_aware_does_not(start_engine, start_router, http):
    split = {}
    for policy in ("round_robin", "kv_aware"):
        url, server, _ = await cluster(start_engine, start_router, n=2, policy=policy)
        text = prompt(7)
        first = await send(http, url, text, server=server)
        assert first == {"x-kvroute-best-cached-tokens": 0, "x-kvroute-predicted-cached-tokens": 0}
        for stream in (False, True, False):
            await send(http, url, text, stream, server=server)
        assert await wait_for(lambda s=server: s.app[ROUTER].loss.stats(60)["requests"] == 4)
        split[policy] = await stats(http, url)
        assert split[policy]["requests"] == 4
        assert split[policy]["cached"] + sum(split[policy][f"lost_to_{c}"] for c in ("workload", "balancing",
                                                                                    "index")) == pytest.approx(1)
    assert split["round_robin"]["lost_to_balancing"] > 0.2
    assert split["kv_aware"]["lost_to_balancing"] == 0
    assert split["kv_aware"]["cached"] > split["round_robin"]["cached"]


async def test_the_loss_counters_are_exported(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=1)
    await send(http, url, prompt(3))
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    assert 'kvroute_router_routing_tokens_total{part="prompt"}' in text
    assert 'kvroute_router_routing_loss_tokens_total{cause="workload"}' in text
