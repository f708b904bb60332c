"""Admission on the router's HTTP path, over loopback in front of sim engines (docs/admission.md)."""

import json
import os
import signal

import orjson
import pytest

from kvroute.router.service.app_keys import GATE, TENANTS
from kvroute.router.service.steering import with_token_ids
from tests.support.router_cluster import cluster, complete, prompt


async def metric_lines(http, url, name):
    async with http.get(url + "/metrics") as r:
        return [line for line in (await r.text()).splitlines() if line.startswith(name)]


async def post(http, url, body, headers=None):
    async with http.post(url + "/v1/completions", json=body, headers=headers or {}) as r:
        return r.status, dict(r.headers), await r.read()


async def test_a_request_that_cannot_meet_its_slo_is_refused_at_once_with_retry_after(start_engine, start_router,
                                                                                       http):
    url, _, _ = await cluster(start_engine, start_router, n=1, slo_ttft_s=0.0001)
    probe = await post(http, url, {"prompt": prompt(1), "max_tokens": 2})
    assert probe[0] == 200  # nothing admitted yet: a probe goes, so the predictions can learn
    status, headers, body = await post(http, url, {"prompt": prompt(1), "max_tokens": 2})
    assert status == 503 and int(headers["Retry-After"]) >= 1
    error = orjson.loads(body)["error"]
    assert error["type"] == "overloaded_error" and error["code"] == "saturated" and "SLO" in error["message"]
    refused = await metric_lines(http, url, "kvroute_router_admission_requests_total")
    assert any('outcome="refused"' in line and 'reason="saturated"' in line for line in refused)


async def test_below_its_slo_a_request_is_admitted_and_its_prediction_recorded(start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=2, slo_ttft_s=5.0)
    status, _, _ = await complete(http, url, prompt(2), stream=True)
    assert status == 200
    lines = await metric_lines(http, url, "kvroute_router_admission_")
    assert any('outcome="admitted"' in line and 'tenant="default"' in line and line.endswith(" 1.0")
               for line in lines)
    assert any(line.startswith("kvroute_router_admission_observed_ttft_seconds_count") and line.endswith(" 1.0")
               for line in lines)
    assert any(line.startswith("kvroute_router_admission_predicted_ttft_seconds_count") for line in lines)


async def test_an_admitted_request_is_sent_where_its_prediction_chose_without_deciding_again(
        start_engine, start_router, http):
    url, _, _ = await cluster(start_engine, start_router, n=2, slo_ttft_s=5.0)
    for i in range(3):
        status, _, _ = await complete(http, url, prompt(10 + i), stream=True)
        assert status == 200
    lookups = await metric_lines(http, url, "kvroute_router_index_lookup_seconds_count")
    assert lookups == ["kvroute_router_index_lookup_seconds_count 3.0"]  # one per request: the prediction's


async def test_named_keys_are_tenants_and_a_rate_limit_answers_429(start_engine, start_router, http, tmp_path):
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.A]\nweight = 2\nrate = 0.01\nburst = 1\n\n[tenants.C]\nkeys = ["kc"]\n')
    url, _, _ = await cluster(start_engine, start_router, n=1, api_key=("A=ka", "B=kb"),
                              tenants=str(tenants))
    body = {"prompt": prompt(3), "max_tokens": 2}
    assert (await post(http, url, body, {"Authorization": "Bearer ka"}))[0] == 200
    status, headers, raw = await post(http, url, body, {"Authorization": "Bearer ka"})
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert orjson.loads(raw)["error"]["code"] == "rate_limit"
    assert (await post(http, url, body, {"Authorization": "Bearer kb"}))[0] == 200  # B has no limit
    assert (await post(http, url, body, {"Authorization": "Bearer kc"}))[0] == 200  # a key from the file
    assert (await post(http, url, body, {"Authorization": "Bearer nope"}))[0] == 401
    lines = await metric_lines(http, url, "kvroute_router_admission_requests_total")
    assert any('tenant="A"' in line and 'reason="rate_limit"' in line for line in lines)


async def test_tenant_from_a_trusted_header(start_engine, start_router, http, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"gw-team": {"max_concurrency": 4}}}))
    url, _, _ = await cluster(start_engine, start_router, n=1, tenant_header="x-tenant", tenants=str(tenants))
    assert (await post(http, url, {"prompt": prompt(4), "max_tokens": 2}, {"x-tenant": "gw-team"}))[0] == 200
    lines = await metric_lines(http, url, "kvroute_router_admission_requests_total")
    assert any('tenant="gw-team"' in line and 'outcome="admitted"' in line for line in lines)


async def test_admin_reload_and_sighup_reread_the_tenant_file(start_engine, start_router, http, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"A": {"weight": 1}}}))
    url, server, _ = await cluster(start_engine, start_router, n=1, admin_key="adm", tenants=str(tenants))
    book = server.app[TENANTS]
    tenants.write_text(json.dumps({"tenants": {"A": {"weight": 3}, "B": {"rate": 5}}}))
    async with http.post(url + "/admin/tenants/reload") as r:
        assert r.status == 401
    auth = {"Authorization": "Bearer adm"}
    async with http.post(url + "/admin/tenants/reload", headers=auth) as r:
        assert r.status == 200 and {t["name"] for t in (await r.json())["tenants"]} == {"A", "B"}
    assert book.tenants["A"].weight == 3
    tenants.write_text("{not json")
    async with http.post(url + "/admin/tenants/reload", headers=auth) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "bad_tenant_file"
    assert book.tenants["A"].weight == 3  # unchanged
    if signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, signal.SIG_IGN, None):
        pytest.skip("this event loop takes no signal handlers")
    tenants.write_text(json.dumps({"tenants": {"A": {"weight": 7}}}))
    os.kill(os.getpid(), signal.SIGHUP)
    from tests.support.waiting import wait_for
    assert await wait_for(lambda: "A" in book.tenants and book.tenants["A"].weight == 7)


async def test_priority_is_validated_passed_on_and_explained(start_engine, start_router, http, tmp_path):
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.U]\nkeys = ["ku"]\nmin_priority = -1\n')
    url, server, _ = await cluster(start_engine, start_router, n=1, slo_ttft_s=5.0, api_key=("B=kb",),
                                   tenants=str(tenants))
    b, u = {"Authorization": "Bearer kb"}, {"Authorization": "Bearer ku"}
    status, _, body = await post(http, url, {"prompt": prompt(5), "max_tokens": 2, "priority": "high"}, b)
    assert status == 400 and orjson.loads(body)["error"]["param"] == "priority"
    assert (await post(http, url, {"prompt": prompt(5), "max_tokens": 2, "priority": -1000}, b))[0] == 200
    lines = await metric_lines(http, url, "kvroute_router_admission_requests_total")
    assert not any('band="0"' in line for line in lines)  # B may not ask for more than priority 0
    assert any('tenant="B"' in line and 'band="1"' in line and 'outcome="admitted"' in line for line in lines)
    assert (await post(http, url, {"prompt": prompt(5), "max_tokens": 2, "priority": -1}, u))[0] == 200
    lines = await metric_lines(http, url, "kvroute_router_admission_requests_total")
    assert any('tenant="U"' in line and 'band="0"' in line and 'outcome="admitted"' in line for line in lines)
    forwarded = orjson.loads(with_token_ids({"prompt": "x", "priority": 3}, "completion", [1, 2]))
    assert forwarded["priority"] == 3  # engines that schedule by priority see it
    async with http.post(url + "/router/explain", json={"prompt": prompt(5), "max_tokens": 2},
                         headers={"x-kvroute-priority": "2", **b}) as r:
        explained = (await r.json())["admission"]
    assert explained["band"] == 2 and explained["action"] == "admit" and explained["predicted_ttft_s"] > 0
    assert len(server.app[GATE].queue) == 0
