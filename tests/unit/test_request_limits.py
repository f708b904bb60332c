"""Limits a client cannot choose, counted where they are checked: a request's own SLO only tightens its
tenant's; with API keys the key decides the tenant, a header only selects among the file's tenants;
a tenant's concurrency and rate hold whatever the prompts' lengths; the tokenizer pool is shared
fairly between tenants."""

import asyncio
import json
import threading

import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from kvroute.router.contract.errors import Overloaded
from kvroute.router.contract.tokenize_pool import TokenizePool
from kvroute.router.decision.admission import AdmissionConfig
from kvroute.router.decision.tenants import TenantSpec
from kvroute.router.service.admission_gate import AdmissionGate, no_prediction
from kvroute.router.service.admission_metrics import AdmissionMetrics
from kvroute.router.service.app_keys import GATE
from kvroute.router.service.cli import main as router_main
from kvroute.router.service.tenant_book import TenantBook
from tests.support.router_cluster import cluster, prompt
from tests.support.stub_engine import close_all, stub_router
from tests.support.waiting import wait_for

LONG = 5000  # characters: past the tokenizer pool's inline limit, so tokenizing awaits


@pytest.mark.parametrize("tenant_slo, allow, asked, expected", [
    (None, False, 3600.0, 0.5),  # the router's SLO; the header is ignored without the file's leave
    (None, True, 3600.0, 0.5),  # allowed, it cannot loosen the router's
    (None, True, 0.1, 0.1),  # ... but it can tighten it
    (2.0, True, 3600.0, 2.0),  # nor the tenant's
    (2.0, True, 1.0, 1.0),
    (2.0, False, 1.0, 2.0),
    (2.0, True, None, 2.0),
])
def test_a_request_may_tighten_its_slo_never_loosen_it(tenant_slo, allow, asked, expected):
    spec = TenantSpec(name="a", slo_ttft_s=tenant_slo, allow_request_slo=allow)
    assert spec.slo_for(asked, 0.5) == expected
    assert TenantSpec(name="a", allow_request_slo=True).slo_for(0.2, None) == 0.2  # no SLO at all: it may set one
    assert TenantSpec(name="a").slo_for(0.2, None) is None


async def test_the_slo_header_cannot_switch_admission_off(start_engine, start_router, http, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"default": {"slo_ttft_s": 0.0001, "allow_request_slo": True}}}))
    url, _, _ = await cluster(start_engine, start_router, n=1, tenants=str(tenants))
    statuses = []
    for i in range(4):
        async with http.post(url + "/v1/completions", json={"prompt": prompt(i), "max_tokens": 2},
                             headers={"x-kvroute-slo-ttft-s": "3600"}) as r:
            statuses.append(r.status)
    assert statuses[0] == 200 and statuses[1:] == [503] * 3  # a probe, then refused as the tenant's SLO says


@pytest.mark.parametrize("keys, header, trusted, error", [
    ((("A", "ka"),), "x-tenant", False, "--trust-tenant-header"),
    ((), "x-tenant", False, None),  # no keys: the header names the tenant
    ((("A", "ka"),), "x-tenant", True, None),
    ((("A", "ka"),), None, False, None),
])
def test_a_tenant_header_beside_keys_needs_a_trusted_gateway(tmp_path, keys, header, trusted, error):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": {"A": {"rate": 5}, "B": {}}}))
    if error:
        with pytest.raises(ValueError, match=error):
            TenantBook(str(path), keys, header, trusted)
        return
    book = TenantBook(str(path), keys, header, trusted)
    assert book.tenant_of({}, "A" if keys else None) == ("A" if keys else "default")
    if header:
        assert book.tenant_of({header: "B"}, None) == "B"  # a tenant of the file
        assert {book.tenant_of({header: f"new-{i}"}, None) for i in range(50)} == {"default"}  # one bucket
    with pytest.raises(ValueError, match="--tenants"):
        TenantBook(None, (), "x-tenant")


def test_a_reload_that_adds_keys_beside_an_untrusted_header_is_refused(tmp_path):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": {"A": {}}}))
    book = TenantBook(str(path), (), "x-tenant")
    path.write_text(json.dumps({"tenants": {"A": {"keys": ["ka"]}}}))
    with pytest.raises(ValueError, match="--trust-tenant-header"):
        book.reload()
    assert not book.has_keys and book.tenant_of({"x-tenant": "A"}, None) == "A"


def test_the_cli_refuses_a_tenant_header_beside_keys_in_one_line(tmp_path, capsys):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": {"A": {"keys": ["ka"]}}}))
    assert router_main(["--engine", "http://127.0.0.1:9", "--tenants", str(path), "--tenant-header", "x-t"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvroute router: ") and "--trust-tenant-header" in err
    assert router_main(["--engine", "http://127.0.0.1:9", "--api-key", "A=ka", "--tenant-header", "x-t"]) == 2
    assert "--tenants" in capsys.readouterr().err


async def _hold(counts: dict, release: asyncio.Event):
    async def handler(request):
        await request.read()
        counts["now"] += 1
        counts["most"] = max(counts["most"], counts["now"])
        try:
            await release.wait()
        finally:
            counts["now"] -= 1
        return web.json_response({"choices": [{"index": 0, "text": "ok"}]})
    return handler


@pytest.mark.parametrize("limits", [{"max_concurrency": 2}, {"rate": 0.01, "burst": 2}])
async def test_a_tenants_limits_hold_whatever_the_prompts_length(start_router, http, tmp_path, limits):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"A": {**limits, "keys": ["ka"]}}}))
    counts, release = {"now": 0, "most": 0}, asyncio.Event()
    url, server, stubs = await stub_router(start_router, await _hold(counts, release), tenants=str(tenants),
                                           tokenize_idle_inline_chars=0, tokenize_workers=1)

    async def send(i):
        text = f"{i} " + "lorem ipsum dolor sit amet " * (LONG // 27)
        async with http.post(url + "/v1/completions", json={"prompt": text, "max_tokens": 1},
                             headers={"Authorization": "Bearer ka"}) as r:
            return r.status, (await r.json()).get("error", {}).get("code")

    try:
        tasks = [asyncio.ensure_future(send(i)) for i in range(40)]
        await wait_for(lambda: sum(t.done() for t in tasks) >= 38, timeout=20)  # the rest refused
        release.set()
        results = await asyncio.gather(*tasks)
    finally:
        release.set()
        await close_all(stubs)
    assert counts["most"] <= 2
    assert sorted(s for s, _ in results).count(200) == 2, results
    assert {code for s, code in results if s != 200} == {"concurrency" if "max_concurrency" in limits
                                                          else "rate_limit"}
    assert server.app[GATE].limits.inflight == {}


@pytest.mark.parametrize("limits, reason", [({"max_concurrency": 2}, "concurrency"),
                                            ({"rate": 0.01, "burst": 2}, "rate_limit")])
async def test_every_arrival_is_counted_where_it_is_checked_before_any_is_admitted(limits, reason):
    """40 arrivals, each checked before any of them is tokenized and admitted (the interleaving a long
    prompt makes): 2 hold a place, 38 are refused; a place given back on refusal lets the next in."""
    gate = AdmissionGate(AdmissionConfig(), TenantBook(None), AdmissionMetrics(CollectorRegistry()))
    gate.book.tenants = {"a": TenantSpec(name="a", **limits)}
    tickets, refused = [gate.ticket("a", 0, None) for _ in range(40)], []
    for ticket in tickets:
        try:
            gate.reserve(ticket)
        except Overloaded as e:
            refused.append(e.code)
    assert refused == [reason] * 38
    held = [t for t in tickets if t.held]
    await gate.enter(held[0], no_prediction)
    gate.release(held[0], None)  # admitted, then ended: its place is free, its rate token spent
    gate.release(held[1], None)  # failed before admission: its place and its rate token come back
    assert gate.limits.inflight == {}
    late = gate.ticket("a", 0, None)
    gate.reserve(late)
    assert late.held


async def test_explain_names_the_key_bound_tenant(start_engine, start_router, http, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"A": {"keys": ["ka"], "slo_ttft_s": 2.0}}}))
    url, _, _ = await cluster(start_engine, start_router, n=1, tenants=str(tenants))
    async with http.post(url + "/router/explain", json={"prompt": prompt(1), "max_tokens": 2},
                         headers={"Authorization": "Bearer ka"}) as r:
        assert r.status == 200
        admission = orjson.loads(await r.read())["admission"]
    assert admission["tenant"] == "A" and admission["slo_ttft_s"] == 2.0


async def test_one_tenants_flood_neither_fills_nor_holds_up_another_tenants_tokenizing():
    pool = TokenizePool(workers=1, max_queued=4, inline_chars=10, idle_inline_chars=0)
    gate, order = threading.Event(), []

    def job(name):
        gate.wait(5)
        order.append(name)
        return name

    try:
        flood = [asyncio.ensure_future(pool.run(job, f"a{i}", chars=30_000, tenant="a")) for i in range(5)]
        await asyncio.sleep(0.05)  # one running, four waiting: a's queue is full
        with pytest.raises(Overloaded):
            await pool.run(job, "a5", chars=30_000, tenant="a")
        quiet = asyncio.ensure_future(pool.run(job, "b0", chars=6_000, tenant="b"))  # not refused for a's flood
        await asyncio.sleep(0.05)
        gate.set()
        assert await quiet == "b0" and order.index("b0") == 1  # next after the one running
        assert [await t for t in flood] == [f"a{i}" for i in range(5)]
        assert pool.pending == 0 and pool.running == 0
    finally:
        gate.set()
        pool.close()


async def test_a_cancelled_waiting_job_never_runs_and_frees_its_place():
    pool = TokenizePool(workers=1, max_queued=1, inline_chars=10, idle_inline_chars=0)
    gate, ran = threading.Event(), []
    try:
        busy = asyncio.ensure_future(pool.run(gate.wait, 5, chars=50, tenant="a"))
        waiting = asyncio.ensure_future(pool.run(ran.append, "never", chars=50, tenant="a"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert pool.waiting("a") == 0 and pool.pending == 1
        again = asyncio.ensure_future(pool.run(ran.append, "later", chars=50, tenant="a"))
        gate.set()
        await busy
        await again
        assert ran == ["later"] and pool.pending == 0 and pool.running == 0
    finally:
        gate.set()
        pool.close()
