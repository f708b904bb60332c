"""A planted mismatch raises the silent-miss alarm naming its cause (router/fleet/silent_miss.py), over
loopback: a sim engine behind a sidecar (loadgen/chaos/sidecar.py) that makes it differ silently."""

import asyncio
import time

import pytest

from kvroute.loadgen.chaos.sidecar import Sidecar
from kvroute.router.service.app import CLUSTER, ROUTER
from tests.support.router_cluster import FAST, prompt
from tests.support.waiting import wait_for

ALARM_WAIT_S = 30.0  # the bound; here it comes after a handful of requests


async def planted(start_engine, start_router, **sidecar):
    """A router in front of one engine behind a sidecar planting `sidecar`'s mismatch."""
    engine_kw = {"block_size": 32} if "advertise_block_size" in sidecar else {}
    engine, _ = await start_engine(time_scale=FAST, **engine_kw)
    front = await Sidecar(engine, **sidecar).start()
    url, server = await start_router([front.url])
    await wait_for(lambda: all(i.routable and not i.needs_resync for i in server.app[CLUSTER].instances))
    return url, server, front


async def alarm_after_traffic(http, url, server):
    """Send prompts twice each until the alarm is raised: (the instance's alarm, seconds it took)."""
    started = time.monotonic()
    inst = server.app[CLUSTER].instances[0]
    k = 0
    while inst.silent_miss is None and time.monotonic() - started < ALARM_WAIT_S:
        for _ in range(2):  # the second time the engine serves it from cache
            text = prompt(40 + k, k) + " more" * (23 * k)  # lengths that differ by more than a block
            async with http.post(url + "/v1/completions", json={"prompt": text, "max_tokens": 1}) as r:
                assert r.status == 200
                await r.read()
        k += 1
        await asyncio.sleep(0.02)  # the router ends its requests in the next loop step
    return inst.silent_miss, time.monotonic() - started


@pytest.mark.parametrize(("sidecar", "cause"), [({"advertise_block_size": 16}, "block_size"),
                                                ({"cache_salt": "hidden"}, "hash_seed")])
async def test_a_planted_mismatch_raises_the_alarm_naming_its_cause(start_engine, start_router, http, caplog,
                                                                    sidecar, cause):
    url, server, front = await planted(start_engine, start_router, **sidecar)
    try:
        alarm, _ = await alarm_after_traffic(http, url, server)
        assert alarm is not None and alarm["cause"] == cause and alarm["alarm"] == "silent_miss_unpredicted"
        async with http.get(url + "/router/instances") as r:
            (row,) = (await r.json())["instances"]
        assert row["silent_miss"]["cause"] == cause and row["silent_miss"]["likely_cause"]
        async with http.get(url + "/metrics") as r:
            assert f'kvroute_router_silent_miss{{cause="{cause}",instance="{row["id"]}"}} 1.0' in await r.text()
        assert sum("silent miss on" in rec.getMessage() for rec in caplog.records) == 1
    finally:
        await front.close()


async def test_an_engine_the_index_describes_raises_no_alarm(start_engine, start_router, http):
    url, server, front = await planted(start_engine, start_router)  # a sidecar that changes nothing
    try:
        inst = server.app[CLUSTER].instances[0]
        for k in range(8):
            for _ in range(2):
                async with http.post(url + "/v1/completions", json={"prompt": prompt(60 + k, k),
                                                                     "max_tokens": 1}) as r:
                    await r.read()
            await wait_for(lambda: inst.blocks_indexed > 0)
        await asyncio.sleep(0.05)
        assert server.app[ROUTER].loss.stats(60)["cached"] > 0.2  # hits, predicted and served
        assert inst.silent_miss is None
    finally:
        await front.close()
