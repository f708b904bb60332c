"""Admission shared by router replicas through a real redis-server (router/service/fleet_admission.py)."""

import asyncio
import time

import pytest

from kvroute.loadgen.redis_server import RedisServer
from kvroute.router.decision.base import PeerLoad
from kvroute.router.decision.fleet_ledger import FleetLedger, SyncRequest, TenantSync
from kvroute.router.service.admission_store import LedgerUnavailable, RedisLedger
from tests.support.router_cluster import FAST, prompt

SYNCS = [
    SyncRequest(replica="a", ttl_s=5, halflife_s=2, tenants={
        "A": TenantSync(admitted=3, arrived=5, rate=10, take=4, slots_max=5, slots_want=4, slots_min=1)},
        tags={"1:A": 0.5}, served={"1": 0.25}, heads={"1": 0.75}, load={"e1": PeerLoad(queued=100, inflight=2)}),
    SyncRequest(replica="b", ttl_s=5, halflife_s=2, tenants={
        "A": TenantSync(admitted=1, rate=10, take=20, owe=1, slots_max=5, slots_want=3, slots_min=2),
        "B": TenantSync(admitted=2, arrived=9)}, tags={"1:B": 1.0, "1:A": 0.25, "2:x:y": 1.0}, heads={"1": 2.0},
        load={"e1": PeerLoad(queued=5, inflight=1), "e2": PeerLoad(queued=7, inflight=1)}),
    SyncRequest(replica="a", ttl_s=5, halflife_s=2, tenants={"A": TenantSync(give=2, rate=10, slots_max=5)}),
    SyncRequest(replica="b", ttl_s=5, halflife_s=2),
]


async def test_the_redis_ledger_answers_as_the_memory_ledger(redis_url):
    redis, memory = RedisLedger(redis_url), FleetLedger()
    t0 = time.monotonic()
    try:
        for request in SYNCS:
            got = await redis.sync(request)
            want = memory.sync(request, time.monotonic() - t0)
            for field in ("replicas", "slots", "free", "tags", "vtime", "heads", "load"):
                assert getattr(got, field) == getattr(want, field), field
            for field in ("rates", "demand", "tokens", "left"):  # on two clocks a few ms apart
                assert getattr(got, field) == pytest.approx(getattr(want, field), abs=0.05), field
    finally:
        await redis.close()


async def test_an_unreachable_ledger_is_an_error_not_a_hang():
    ledger = RedisLedger("redis://127.0.0.1:1/0", timeout_s=0.2)
    with pytest.raises(LedgerUnavailable):
        await ledger.sync(SYNCS[0])
    await ledger.close()


async def routers(start_engine, start_router, tmp_path, redis_url, n=2, **kw):
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.A]\nrate = 4\nburst = 2\nkeys = ["ka"]\n')
    engine, _ = await start_engine(time_scale=FAST)
    started = [await start_router([engine], redis=redis_url, tenants=str(tenants), **kw) for _ in range(n)]
    return [url for url, _ in started]


async def health(http, url):
    async with http.get(url + "/health") as r:
        return await r.json()


async def admission_mode(http, url, mode, timeout_s=10.0):
    """Wait until the router's /health says admission is `mode` (shared or local)."""
    deadline = time.monotonic() + timeout_s
    while (await health(http, url))["admission"]["mode"] != mode:
        assert time.monotonic() < deadline, f"admission never became {mode}"
        await asyncio.sleep(0.05)


async def flood(http, urls, seconds):
    """Requests of tenant A, one after another, alternately to each router: (admitted, elapsed)."""
    admitted, start, i = 0, time.monotonic(), 0
    while time.monotonic() - start < seconds:
        body = {"prompt": prompt(1, i), "max_tokens": 1}
        async with http.post(urls[i % len(urls)] + "/v1/completions", json=body,
                             headers={"Authorization": "Bearer ka"}) as r:
            await r.read()
            assert r.status in (200, 429)
            admitted += r.status == 200
        i += 1
    return admitted, time.monotonic() - start


async def test_two_routers_hold_a_tenants_rate_over_the_fleet(start_engine, start_router, http, tmp_path, redis_url):
    urls = await routers(start_engine, start_router, tmp_path, redis_url)
    for url in urls:
        await admission_mode(http, url, "shared")
    admitted, elapsed = await flood(http, urls, 1.5)
    assert admitted <= 4 * elapsed + 2 + 2  # rate x time + burst, + one token ahead per router


async def test_routers_that_do_not_share_each_admit_the_whole_rate(start_engine, start_router, http, tmp_path,
                                                                   redis_url):
    """The control of the test above: the same routers with shared admission off."""
    urls = await routers(start_engine, start_router, tmp_path, redis_url, admission_sync_s=0)
    assert "admission" not in await health(http, urls[0])
    admitted, elapsed = await flood(http, urls, 1.5)
    assert admitted > 4 * elapsed + 2 + 2


async def test_losing_redis_admits_locally_says_so_and_recovers(start_engine, start_router, http, tmp_path):
    server = RedisServer()
    try:
        (url,) = await routers(start_engine, start_router, tmp_path, server.url, n=1, index_timeout_s=0.1)
        await admission_mode(http, url, "shared")
        server.stop()
        await admission_mode(http, url, "local")
        state = (await health(http, url))["admission"]
        assert "Redis unreachable" in state["reason"]
        async with http.get(url + "/metrics") as r:
            assert "kvroute_router_admission_shared 0.0" in await r.text()
        statuses = []
        for i in range(4):  # served, limited locally (rate 4, burst 2 over 1 router: the whole of each)
            async with http.post(url + "/v1/completions", json={"prompt": prompt(2, i), "max_tokens": 1},
                                 headers={"Authorization": "Bearer ka"}) as r:
                statuses.append(r.status)
        assert statuses[:2] == [200, 200] and set(statuses) <= {200, 429}
        server = RedisServer(port=server.port)
        await admission_mode(http, url, "shared")
    finally:
        server.stop()
        await asyncio.sleep(0)
