"""Every charge has one owner that releases it (router/service/charges.py): a failure planted at each
step after a request is charged, colocated and disaggregated, streamed and whole, leaves no instance
in-flight count, no queued prefill, no tenant slot and no admission queue entry behind; and a body
the router could not write again is a 400 before anything is charged."""

import asyncio
import itertools
import json
from types import SimpleNamespace

import aiohttp
import pytest

from kvroute.router.decision.route import RouteDecision
from kvroute.router.service import disagg, proxy, routing
from kvroute.router.service.admission_gate import AdmissionGate
from kvroute.router.service.app import CLUSTER, ROUTER
from kvroute.router.service.app_keys import GATE
from kvroute.router.service.charges import Charges, Dispatch
from kvroute.router.service.request_trace import RequestTrace
from tests.support.router_cluster import FAST, cluster
from tests.support.waiting import wait_for

SENT = itertools.count()


def fresh_prompt() -> str:
    """A prompt no engine has cached (so a disaggregated fleet always prefills it first)."""
    n = next(SENT)
    return f"request {n}: " + " ".join(f"word{n}x{i}" for i in range(60))


class Planted(Exception):
    """The failure a case plants."""


def _raise(*_, **__):
    raise Planted("planted failure")


async def _araise(*_, **__):
    raise Planted("planted failure")


# (case, where the failure is planted, attribute, async?, for streamed and/or whole requests): each after
# the request is charged; the first ones fail before an instance is (the tenant's slot is taken), the
# later ones after.
BOTH, STREAM, WHOLE = (True, False), (True,), (False,)
COLOCATED = [
    ("tokenizing", routing.Router, "prepare", True, BOTH),
    ("admission", AdmissionGate, "enter", True, BOTH),
    ("body rewrite", proxy, "with_token_ids", False, BOTH),
    ("sending", proxy.Proxy, "_post", True, BOTH),
    ("policy record", RouteDecision, "routed", False, BOTH),
    ("first byte", Dispatch, "first_byte", False, BOTH),
    ("trace of the first byte", RequestTrace, "first", False, STREAM),
    ("trace of a whole answer", RequestTrace, "body", False, WHOLE),
    ("relay", proxy.Proxy, "pump", True, STREAM),
]
DISAGGREGATED = COLOCATED[:2] + [
    ("grant", disagg, "make_grant", False, BOTH),
    ("prefill choice metrics", routing.Router, "observe_choice", False, BOTH),
    ("prefill answer", disagg, "parse_prefilled", False, BOTH),
    ("decode choice", disagg, "pick_decode", False, BOTH),
    ("handle check", disagg, "valid_handle", False, WHOLE),
    ("first token to the client", disagg, "first_chunk", False, STREAM),
    ("decode stream", disagg.Disaggregation, "_decode_stream", True, STREAM),
    ("whole decode attempt", proxy.Proxy, "_fetch_whole", True, WHOLE),
    ("relay", proxy.Proxy, "pump", True, STREAM),
]


async def _fleet(start_engine, start_router, tmp_path, disaggregated: bool):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"default": {"max_concurrency": 1, "rate": 1000}}}))
    if not disaggregated:
        return await cluster(start_engine, start_router, n=2, tenants=str(tenants), max_retries=1)
    engines = [await start_engine(time_scale=FAST, role=role, instance_id=name, kv_secret="charges")
               for role, name in (("prefill", "p0"), ("decode", "d0"), ("decode", "d1"))]
    url, server = await start_router([e[0] for e in engines], tenants=str(tenants), kv_secret="charges",
                                     pd_min_uncached=16, max_retries=1)
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    return url, server, engines


async def _send(http, url, stream: bool) -> bool:
    """True when the request was served whole: a 200 and, streamed, no error event."""
    try:
        body = {"prompt": fresh_prompt(), "max_tokens": 3, "stream": stream}
        async with http.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=20)) as r:
            return r.status == 200 and b'"error"' not in await r.read()
    except aiohttp.ClientError:
        return False  # a stream cut after its head


def _charged(server) -> dict:
    """What is still charged anywhere in the router (all zero when nothing is in flight)."""
    gate = server.app[GATE]
    out = {f"{i.id} in flight": i.inflight for i in server.app[CLUSTER].instances}
    out.update({f"{i.id} queued prefill": i.queued_prefill_tokens for i in server.app[CLUSTER].instances})
    out.update(tenants_in_flight=sum(gate.limits.inflight.values()), queued=len(gate.queue),
               tokenizing=server.app[ROUTER].pool.pending)
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("disaggregated", [False, True], ids=["colocated", "disaggregated"])
async def test_a_failure_at_any_step_after_the_charge_leaves_nothing_charged(
        start_engine, start_router, http, tmp_path, monkeypatch, disaggregated):
    url, server, _ = await _fleet(start_engine, start_router, tmp_path, disaggregated)
    for name, where, attribute, is_async, modes in DISAGGREGATED if disaggregated else COLOCATED:
        for stream in modes:
            with monkeypatch.context() as m:
                m.setattr(where, attribute, _araise if is_async else _raise)
                assert not await _send(http, url, stream), (name, stream)  # the failure was met
            assert await wait_for(lambda: not _charged(server)), (name, stream, _charged(server))
            # the tenant's one place is free again: the next request is served
            assert await _send(http, url, stream), (name, stream)


async def test_a_body_the_router_cannot_write_again_is_a_400_before_anything_is_charged(
        start_engine, start_router, http, tmp_path):
    url, server, _ = await _fleet(start_engine, start_router, tmp_path, disaggregated=False)
    for depth in (254, 255, 600, 1023):
        raw = b'{"prompt": "hello", "max_tokens": 1, "x": ' + b"[" * depth + b"]" * depth + b"}"
        async with http.post(url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400, (depth, await r.text())
            assert "nested too deep" in (await r.json())["error"]["message"]
    assert not _charged(server)
    shallow = b'{"prompt": "hello", "max_tokens": 1, "x": ' + b"[" * 250 + b"]" * 250 + b"}"
    async with http.post(url + "/v1/completions", data=shallow, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()


async def test_poisoned_requests_leave_normal_traffic_unaffected(start_engine, start_router, http, tmp_path):
    url, server, _ = await _fleet(start_engine, start_router, tmp_path, disaggregated=False)
    poison = b'{"prompt": "hello", "max_tokens": 1, "x": ' + b"[" * 300 + b"]" * 300 + b"}"

    async def poisoned():
        async with http.post(url + "/v1/completions", data=poison,
                             headers={"Content-Type": "application/json"}) as r:
            return r.status

    assert set(await asyncio.gather(*(poisoned() for _ in range(50)))) == {400}
    assert not _charged(server)
    assert [await _send(http, url, stream) for stream in (True, False)] == [True, True]


class _Instance:
    kind = "vllm"

    def __init__(self, name: str) -> None:
        self.id, self.inflight, self.queued_prefill_tokens = name, 0, 0

    def charge(self, requests: int, tokens: int) -> None:
        self.inflight += requests
        self.queued_prefill_tokens += tokens


class _FailingPolicy:
    """Its record of a finish fails for the first instance it hears of."""

    def __init__(self) -> None:
        self.finished: list[str] = []

    def on_finished(self, route, instance_id: str) -> None:
        self.finished.append(instance_id)
        if len(self.finished) == 1:
            raise Planted("planted failure")


class _Slot:
    def __init__(self) -> None:
        self.held = 0

    def reserve(self, ticket) -> None:
        self.held += 1

    def release(self, ticket, first_token) -> None:
        self.held -= 1


def test_a_dispatch_whose_end_fails_does_not_keep_the_others_charged():
    policy, progress = _FailingPolicy(), []
    router = SimpleNamespace(policy=policy, policy_name="kv_aware", on_progress=lambda: progress.append(1),
                             metrics=SimpleNamespace(count_request=lambda *a: None))
    prepared = SimpleNamespace(route=None, model="m")
    instances = [_Instance("a"), _Instance("b")]
    slot = _Slot()
    charges = Charges(slot, ticket=None)
    charges.reserve()
    for inst in instances:
        charges.dispatch(router, prepared, SimpleNamespace(instance=inst, uncached_tokens=32))
    charges.close("500")
    assert policy.finished == ["a", "b"]  # the second dispatch ended after the first one's failure
    assert [(i.inflight, i.queued_prefill_tokens) for i in instances] == [(0, 0), (0, 0)]
    assert slot.held == 0 and len(progress) == 2  # admission heard of both ends
