"""The router end to end over loopback, in front of real sim engines."""

import asyncio
import functools

import orjson
import pytest

from kvroute.router.service.app import CLUSTER, ROUTER
from tests.support.redis_server import RedisServer
from tests.support.router_cluster import FAST, cluster, complete, prompt
from tests.support.waiting import wait_for


def all_synced(server) -> bool:
    return all(i.routable and not i.needs_resync for i in server.app[CLUSTER].instances)


def prompt_hashes(text: str) -> tuple[int, ...]:
    from kvroute.router.contract.protocol import block_hashes, hash_seed
    from kvroute.router.contract.tokenizer import load_tokenizer

    return tuple(block_hashes(load_tokenizer().encode(text), 16, hash_seed("kvroute-tiny")))


async def test_shared_prefix_sticks_and_distinct_prefixes_spread(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router)
    where = {}
    for group in range(6):
        for q in range(4):
            status, inst, body = await complete(http, url, prompt(group, q))
            assert status == 200
            where.setdefault(group, []).append(inst)
            if q:
                assert orjson.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert all(len(set(v)) == 1 for v in where.values()), where  # each group stays on one instance
    assert len({v[0] for v in where.values()}) >= 2  # groups spread over instances


async def test_streaming_passthrough_and_header(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=2)
    status, inst, body = await complete(http, url, prompt(1), max_tokens=5, stream=True,
                                        stream_options={"include_usage": True})
    assert status == 200 and inst in ("e0", "e1")
    lines = [line for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    final = orjson.loads(lines[-2][6:])
    assert final["usage"]["completion_tokens"] == 5


async def test_explain_agrees_with_routing(start_engine, start_router, http):
    url, server, _ = await cluster(start_engine, start_router)
    _, first, _ = await complete(http, url, prompt(7, 0))
    assert await wait_for(lambda: all(i.load is not None for i in server.app[CLUSTER].instances))
    async with http.post(url + "/router/explain", json={"prompt": prompt(7, 1), "max_tokens": 3}) as r:
        explained = await r.json()
    _, second, _ = await complete(http, url, prompt(7, 1))
    assert explained["choice"] == second == first
    rows = {row["instance"]: row for row in explained["instances"]}
    assert rows[first]["cached_tokens"] > 0 and set(rows) == {"e0", "e1", "e2"}
    assert all(row["cost"] is not None for row in rows.values())
    for row in rows.values():  # what the placement costs the request (wait, prefill) and the others
        assert set(row["cost_terms"]) == {"wait_s", "prefill_s", "compute_s", "evict_s"}
        assert sum(row["cost_terms"].values()) == pytest.approx(row["cost"])
    assert rows[first]["load"]["kv_free_blocks"] >= 0  # the engines report their eviction profile


async def test_instances_endpoint_and_metrics(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=2)
    await complete(http, url, prompt(2))
    async with http.get(url + "/router/instances") as r:
        instances = (await r.json())["instances"]
    assert {i["id"] for i in instances} == {"e0", "e1"}
    assert all(i["healthy"] and i["block_size"] == 16 and i["mismatch"] == [] for i in instances)
    assert sum(i["blocks_indexed"] for i in instances) > 0
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    for name in ("kvroute_router_requests_total", "kvroute_router_decision_seconds_bucket",
                 "kvroute_router_cached_token_ratio_bucket", "kvroute_router_index_entries",
                 "kvroute_router_retries_total", "kvroute_router_errors_total"):
        assert name in text


async def test_killed_engine_costs_no_unstarted_request(start_engine, start_router, http):
    url, server, engines = await cluster(start_engine, start_router, max_retries=2)
    victim = engines[0][1]
    await victim.close()  # dies without warning
    statuses = [(await complete(http, url, prompt(g)))[:2] for g in range(9)]
    assert all(s == 200 for s, _ in statuses)
    assert all(inst != "e0" for _, inst in statuses)
    inst = server.app[CLUSTER].by_id("e0")
    assert not inst.routable


async def test_restarted_engine_is_resynced(start_engine, start_router, http):
    url, server, engines = await cluster(start_engine, start_router, n=2, index_ttl_s=0.5, policy="round_robin")
    cl = server.app[CLUSTER]
    for g in range(2):  # round robin: one prompt lands on each engine
        await complete(http, url, prompt(20 + g))
    assert await wait_for(lambda: cl.by_id("e0").blocks_indexed > 0)
    assert "e0" in await cl.index.lookup(prompt_hashes(prompt(20)))  # round robin sent it to e0
    e0_url, e0 = engines[0]
    port = int(e0_url.rsplit(":", 1)[1])
    old_epoch = cl.by_id("e0").epoch
    await e0.close()
    assert await wait_for(lambda: not cl.by_id("e0").routable)
    # After the grace period its entries leave the index; e1's stay.
    assert await wait_for(lambda: cl.by_id("e0").blocks_indexed == 0, timeout=5)
    for _ in range(40):  # the index forgets it once no router has seen it for the TTL
        if "e0" not in await cl.index.lookup(prompt_hashes(prompt(20))):
            break
        await asyncio.sleep(0.05)
    assert "e0" not in await cl.index.lookup(prompt_hashes(prompt(20)))
    assert "e1" in await cl.index.lookup(prompt_hashes(prompt(21)))
    await start_engine(port=port, instance_id="e0", time_scale=FAST)
    assert await wait_for(lambda: cl.by_id("e0").routable and cl.by_id("e0").epoch != old_epoch, timeout=10)
    inst = cl.by_id("e0")
    assert inst.resyncs >= 2 and not inst.needs_resync


async def test_mismatched_engine_is_flagged_and_routed_on_load_only(start_engine, start_router, http):
    good = await start_engine(time_scale=FAST)
    odd = await start_engine(time_scale=FAST, block_size=32)
    third = await start_engine(time_scale=FAST)
    url, server = await start_router([good[0], odd[0], third[0]])
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    async with http.get(url + "/router/instances") as r:
        rows = {i["id"]: i for i in (await r.json())["instances"]}
    assert rows["e1"]["mismatch"] and "block size 32" in rows["e1"]["mismatch"][0]
    assert rows["e0"]["mismatch"] == []
    async with http.get(url + "/metrics") as r:
        assert 'kvroute_router_instance_mismatch{instance="e1"} 1.0' in await r.text()
    async with http.post(url + "/router/explain", json={"prompt": prompt(3), "max_tokens": 2}) as r:
        explained = await r.json()
    row = next(x for x in explained["instances"] if x["instance"] == "e1")
    assert row["cache_ok"] is False and row["cached_tokens"] == 0


async def test_max_inflight_gives_429(start_engine, start_router, http):
    engines = [await start_engine(time_scale=20.0)]
    url, server = await start_router([engines[0][0]], max_inflight=1)
    await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
    slow = asyncio.ensure_future(complete(http, url, prompt(1), max_tokens=200, ignore_eos=True))
    await wait_for(lambda: server.app[CLUSTER].instances[0].inflight == 1)
    async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert (await r.json())["error"]["type"] == "overloaded_error"
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)


async def test_api_and_admin_keys(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=1, api_key=("k1",), admin_key="k2")
    async with http.post(url + "/v1/completions", json={"prompt": "hi"}) as r:
        assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
    async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                         headers={"Authorization": "Bearer k1"}) as r:
        assert r.status == 200
    async with http.get(url + "/router/instances", headers={"Authorization": "Bearer k1"}) as r:
        assert r.status == 401
    async with http.get(url + "/router/instances", headers={"Authorization": "Bearer k2"}) as r:
        assert r.status == 200


async def test_introspection_needs_the_api_key_when_there_is_no_admin_key(start_engine, start_router, http):
    """A router with only --api-key used to answer /router/explain (another tenant's cached prompt) and
    list the fleet's URLs to anyone."""
    url, _, _ = await cluster(start_engine, start_router, n=1, api_key=("k1",))
    explain = {"prompt": prompt(1), "max_tokens": 2}
    for method, path, body in (("POST", "/router/explain", explain), ("GET", "/router/instances", None),
                               ("GET", "/router/stats", None), ("GET", "/router/engines", None),
                               ("GET", "/workers", None)):
        async with http.request(method, url + path, json=body) as r:
            assert r.status == 401, path
            assert "API key" in (await r.json())["error"]["message"]
    key = {"Authorization": "Bearer k1"}
    async with http.post(url + "/router/explain", json=explain, headers=key) as r:
        assert r.status == 200 and "choice" in await r.json()
    async with http.get(url + "/router/instances", headers=key) as r:
        assert r.status == 200
    for path in ("/health", "/metrics"):  # probes and scrapers: open, as documented
        async with http.get(url + path) as r:
            assert r.status == 200, path


async def test_an_empty_cache_salt_is_refused(start_engine, start_router, http):
    url, _, engines = await cluster(start_engine, start_router, n=1)
    for target in (url, engines[0][0]):
        async with http.post(target + "/v1/completions", json={"prompt": "hi", "cache_salt": ""}) as r:
            assert r.status == 400, target
            assert (await r.json())["error"]["param"] == "cache_salt"


@pytest.mark.parametrize("body,status,needle", [
    (b"{oops", 400, "not valid JSON"),
    (b'{"max_tokens": 2}', 400, "'prompt' is required"),
    (b'{"prompt": "x", "max_tokens": -1}', 400, "at least 1"),
    (b'{"prompt": "x", "model": "nope"}', 404, "does not exist"),
])
async def test_bad_input_rejected_before_forwarding(start_engine, start_router, http, body, status, needle):
    url, server, _ = await cluster(start_engine, start_router, n=1)
    async with http.post(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == status
        assert needle in (await r.json())["error"]["message"]
    assert server.app[CLUSTER].instances[0].inflight == 0


async def test_two_routers_share_the_redis_index(start_engine, start_router, http, redis_url):
    engines = [await start_engine(time_scale=FAST, redis=redis_url) for _ in range(3)]
    urls = [e[0] for e in engines]
    a_url, a = await start_router(urls, index="redis", redis=redis_url)
    b_url, b = await start_router(urls, index="redis", redis=redis_url, events="redis")
    for srv in (a, b):
        await wait_for(functools.partial(all_synced, srv))
    _, first, _ = await complete(http, a_url, prompt(11, 0))
    await asyncio.sleep(0.3)  # events reach the shared index
    async with http.post(b_url + "/router/explain", json={"prompt": prompt(11, 1), "max_tokens": 2}) as r:
        explained = await r.json()
    assert explained["choice"] == first and explained["predicted_cached_tokens"] > 0
    _, second, _ = await complete(http, b_url, prompt(11, 1))
    assert second == first


async def test_redis_down_keeps_serving_on_load(start_engine, start_router, http):
    server_redis = RedisServer()
    try:
        url, _, _ = await cluster(start_engine, start_router, n=2, index="redis", redis=server_redis.url)
        status, _, _ = await complete(http, url, prompt(5))
        assert status == 200
        server_redis.stop()
        statuses = [(await complete(http, url, prompt(g)))[0] for g in range(3)]
        assert statuses == [200, 200, 200]
        async with http.get(url + "/metrics") as r:
            assert 'kvroute_router_errors_total{kind="index"}' in await r.text()
    finally:
        server_redis.stop()


@pytest.mark.parametrize("index", ["memory", "redis"])
async def test_engine_back_under_a_new_id_clears_the_old_one(start_engine, start_router, http, redis_url, index):
    e_url, e = await start_engine(time_scale=FAST, instance_id="pod-a")
    url, server = await start_router([e_url], index=index, redis=redis_url, index_ttl_s=3600)
    cl = server.app[CLUSTER]
    await wait_for(lambda: cl.instances[0].routable and not cl.instances[0].needs_resync)
    await complete(http, url, prompt(30))
    hashes = prompt_hashes(prompt(30))
    for _ in range(40):
        if "pod-a" in await cl.index.lookup(hashes):
            break
        await asyncio.sleep(0.05)
    assert "pod-a" in await cl.index.lookup(hashes)
    port = int(e_url.rsplit(":", 1)[1])
    await e.close()
    await start_engine(port=port, instance_id="pod-b", time_scale=FAST)  # a restarted pod, a new name
    assert await wait_for(lambda: cl.instances[0].id == "pod-b" and cl.instances[0].routable, timeout=10)
    assert "pod-a" not in await cl.index.lookup(hashes)
    await complete(http, url, prompt(30))
    for _ in range(40):
        if "pod-b" in await cl.index.lookup(hashes):
            break
        await asyncio.sleep(0.05)
    assert set(await cl.index.lookup(hashes)) == {"pod-b"}


async def test_router_metrics_follow_what_engines_report(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=1)
    for _ in range(2):
        body = {"prompt": prompt(40), "max_tokens": 5, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with http.post(url + "/v1/completions", json=body) as r:
            await r.read()
    status, _, _ = await complete(http, url, prompt(41), max_tokens=3)
    async with http.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": -1}) as r:
        assert r.status == 400
    async with http.get(url + "/metrics") as r:
        text = await r.text()

    def value(name):
        line = next(line for line in text.splitlines() if line.startswith(name))
        return float(line.split()[-1])

    assert value('kvroute_router_output_tokens_total{instance="e0",model="kvroute-tiny"}') == 13
    assert value('kvroute_router_cached_tokens_total{instance="e0",model="kvroute-tiny"}') > 0  # the repeat hit
    assert value('kvroute_router_request_duration_seconds_count{instance="e0",model="kvroute-tiny"}') == 3
    assert value('kvroute_router_time_per_output_token_seconds_count{instance="e0",model="kvroute-tiny"}') == 2
    assert value('kvroute_router_rejected_requests_total{status="400"}') == 1
    async with http.get(url + "/router/stats", params={"window": "60", "slo_ttft": "5"}) as r:
        stats = (await r.json())["models"]["kvroute-tiny"]
    assert stats["requests"] == 3 and stats["slo_attainment"] == 1.0
    assert stats["ttft_s"]["p50"] is not None and stats["tpot_s"]["p50"] is not None
    async with http.get(url + "/router/stats", params={"window": "-1"}) as r:
        assert r.status == 400


async def test_fast_candidates_keep_holders_and_the_least_loaded(start_engine, start_router, http):
    url, server, _ = await cluster(start_engine, start_router, n=4, fast_candidates=1)
    policy, scored = server.app[ROUTER].policy, []
    select = policy.select
    policy.select = lambda request, candidates, matches: (scored.append({c.id for c in candidates}),
                                                          select(request, candidates, matches))[1]
    for q in range(3):  # one group: it sticks to its holder although only 1 least-loaded extra is scored
        status, inst, body = await complete(http, url, prompt(50, q))
        assert status == 200
        if q == 0:
            holder = inst
        assert inst == holder
    assert len(scored[0]) == 1  # nothing held yet: the one least loaded
    assert all(len(ids) == 2 and holder in ids for ids in scored[1:]), scored  # the holder + 1 least loaded
    group = server.app[CLUSTER].group("kvroute-tiny")
    assert len(group.members) == 4 and {i.inflight for i in group.members} == {0}
