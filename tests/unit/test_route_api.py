"""The route-only API (router/service/route_api.py): POST /v1/route answers the choice /router/explain
shows, with its endpoint, fallbacks, prediction and admission verdict, and charges it as sent; the
companion calls release the prefill and everything else; a route nobody finishes is timed out; a
refusal is the proxy's 429/503 with Retry-After; the subset header limits the choice."""

import asyncio
import json

import orjson
import pytest

from kvroute.router.service.app import CLUSTER
from kvroute.router.service.app_keys import ROUTES
from tests.support.picker_fleet import BODY, charged, endpoint, explained, finished
from tests.support.waiting import wait_for


async def route(http, url, body: bytes = BODY, headers: dict | None = None):
    async with http.post(url + "/v1/route", data=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.json()


async def test_a_route_is_the_explained_choice_charged_until_its_finish(picker, http):
    url, server, _ = await picker(engines=3)
    want = await explained(http, url, BODY)
    status, _, answer = await route(http, url)
    assert status == 200, answer
    inst = server.app[CLUSTER].by_id(answer["instance"])
    assert answer["instance"] == want and answer["url"] == inst.url and answer["endpoint"] == endpoint(inst)
    assert len(answer["fallbacks"]) == 2 and want not in [f["instance"] for f in answer["fallbacks"]]
    assert answer["predicted_ttft_s"] > 0 and answer["admission"]["action"] == "admit"
    assert inst.inflight == 1 and inst.queued_prefill_tokens > 0
    async with http.post(f"{url}/v1/route/{answer['route_id']}/first_token") as r:
        assert r.status == 200
    assert inst.queued_prefill_tokens == 0 and inst.inflight == 1
    usage = {"prompt_tokens": 300, "completion_tokens": 7}
    async with http.post(f"{url}/v1/route/{answer['route_id']}/finish", json={"status": 200, "usage": usage}) as r:
        assert r.status == 200
    assert not charged(server)
    assert await wait_for(lambda: finished(server)["requests"] == 1)
    assert finished(server)["output_tokens_per_s"] * 60.0 == pytest.approx(7)
    async with http.post(f"{url}/v1/route/{answer['route_id']}/finish") as r:  # once
        assert r.status == 404


async def test_a_route_nobody_finishes_is_timed_out(picker, http):
    url, server, _ = await picker(request_timeout_s=0.3)
    status, _, answer = await route(http, url)
    assert status == 200 and charged(server)
    assert await wait_for(lambda: not charged(server), timeout=3.0), charged(server)
    async with http.post(f"{url}/v1/route/{answer['route_id']}/first_token") as r:
        assert r.status == 404 and "timed out" in (await r.json())["error"]["message"]


async def test_a_refusal_is_a_429_with_retry_after(picker, http, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"default": {"max_concurrency": 1}}}))
    url, server, _ = await picker(tenants=str(tenants))
    first = await route(http, url)
    status, headers, answer = await route(http, url)
    assert first[0] == 200 and status == 429 and int(headers["Retry-After"]) >= 1
    assert answer["error"]["code"] == "concurrency"
    async with http.post(f"{url}/v1/route/{first[2]['route_id']}/finish", json={"status": 200}) as r:
        assert r.status == 200
    assert not charged(server)
    assert (await route(http, url))[0] == 200  # the tenant's place is free again


async def test_the_subset_header_limits_the_choice_or_is_a_503(picker, http):
    url, server, _ = await picker(engines=3)
    for inst in server.app[CLUSTER].instances:
        status, _, answer = await route(http, url, headers={"x-gateway-destination-endpoint-subset": endpoint(inst)})
        assert status == 200 and answer["instance"] == inst.id and answer["fallbacks"] == []
    status, _, answer = await route(http, url, headers={"x-gateway-destination-endpoint-subset": "10.9.9.9:1"})
    assert status == 503


async def test_a_fallback_that_served_takes_the_charge_and_bad_reports_are_400s(picker, http):
    url, server, _ = await picker(engines=2)
    status, _, answer = await route(http, url)
    first = server.app[CLUSTER].by_id(answer["instance"])
    fallback = server.app[CLUSTER].by_id(answer["fallbacks"][0]["instance"])
    finish = f"{url}/v1/route/{answer['route_id']}/finish"
    for bad in ({"status": "ok"}, {"status": 99}, {"served_by": 5}):
        async with http.post(finish, json=bad) as r:
            assert r.status == 400, bad
    assert first.inflight == 1
    async with http.post(finish, json={"status": 200, "served_by": endpoint(fallback)}) as r:
        assert r.status == 200 and (await r.json())["instance"] == fallback.id
    assert not charged(server)


async def test_routes_still_open_when_the_router_stops_are_released(picker, http):
    url, server, _ = await picker()
    statuses = await asyncio.gather(*(route(http, url, orjson.dumps({**orjson.loads(BODY), "prompt": f"p{i}"}))
                                      for i in range(3)))
    assert [s[0] for s in statuses] == [200] * 3 and charged(server)
    server.app[ROUTES].close()  # what the router's shutdown runs
    assert not charged(server)


async def test_a_full_route_table_is_a_503_with_retry_after_before_the_body_is_read(picker, http, monkeypatch):
    from kvroute.router.service import route_api

    monkeypatch.setattr(route_api, "MAX_OPEN", 1)
    url, server, _ = await picker()
    first = await route(http, url)
    status, headers, answer = await route(http, url, b"{not json")  # refused before the body matters
    assert first[0] == 200 and status == 503 and int(headers["Retry-After"]) >= 1, answer
    assert answer["error"]["code"] == "routes_open"
    async with http.post(f"{url}/v1/route/{first[2]['route_id']}/finish", json={"status": 200}) as r:
        assert r.status == 200
    assert (await route(http, url))[0] == 200 and len(server.app[ROUTES]) == 1
