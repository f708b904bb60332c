"""kvroute as Envoy's endpoint picker (router/service/ext_proc/), spoken to over real gRPC as Envoy
speaks: the request's headers held until its body has come, the choice in the headers answer
(header and envoy.lb metadata alike) before the body echoed in streamed chunks, trailers, a
duplicate end of stream ignored, the buffered modes, the subset hint, refusals as immediate
responses, the response's phase ending the charge, a fallback that served taking it, and gRPC health."""

import json
import subprocess
import sys

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvroute.router.service.app import CLUSTER
from tests.support.ext_proc_client import (
    ExtProcStream,
    Mode,
    destination_of,
    echoed_body,
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
)
from tests.support.picker_fleet import BODY, charged, endpoint, explained, finished
from tests.support.waiting import wait_for


async def test_full_duplex_holds_the_headers_until_the_body_then_answers_them_first(picker, http):
    url, server, channel = await picker()
    want = server.app[CLUSTER].by_id(await explained(http, url, BODY))
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    await stream.call.write(request_body(BODY[:100], end=False))
    answers = await stream.send(request_body(BODY[100:], end=True), answers=2)
    assert answers[0].HasField("request_headers")  # the headers' answer first, carrying the choice
    assert destination_of(answers[0]) == (endpoint(want), endpoint(want))
    assert echoed_body(answers) == (BODY, [True])
    assert want.inflight == 1 and want.queued_prefill_tokens > 0  # charged as sent
    heads = await stream.send(response_headers(200), answers=1)
    assert heads[0].HasField("response_headers")
    assert want.queued_prefill_tokens == 0  # no response body will come: the head is the first byte
    assert await stream.end() == []
    assert await wait_for(lambda: not charged(server)), charged(server)
    assert await wait_for(lambda: finished(server)["requests"] == 1)


async def test_trailers_end_the_body_and_a_duplicate_end_of_stream_is_ignored(picker):
    url, server, channel = await picker()
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    await stream.call.write(request_body(BODY, end=False))
    answers = await stream.send(request_trailers(), answers=3)
    assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body", "request_trailers"]
    assert echoed_body(answers) == (BODY, [False])  # the trailers end the request, not the body
    busy = charged(server)
    assert sum(v for k, v in busy.items() if k.endswith("in flight")) == 1
    await stream.call.write(request_body(b"", end=True))  # a duplicate end of stream: no second decision
    assert (await stream.send(response_headers(200), answers=1))[0].HasField("response_headers")
    assert sum(v for k, v in charged(server).items() if k.endswith("in flight")) == 1
    await stream.end()
    assert await wait_for(lambda: not charged(server)), charged(server)


@pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.BUFFERED_PARTIAL])
async def test_buffered_modes_answer_the_headers_at_once_and_route_on_the_body(picker, http, mode):
    url, server, channel = await picker()
    want = await explained(http, url, BODY)
    stream = ExtProcStream(channel)
    first = await stream.send(request_headers(body_mode=mode), answers=1)
    assert first[0].HasField("request_headers") and destination_of(first[0]) == (None, None)
    answer = (await stream.send(request_body(BODY, end=True), answers=1))[0]
    assert answer.HasField("request_body")
    assert destination_of(answer) == (endpoint(server.app[CLUSTER].by_id(want)),) * 2
    await stream.end()
    assert await wait_for(lambda: not charged(server)), charged(server)


async def test_the_subset_hint_limits_the_choice_or_is_a_503(picker):
    url, server, channel = await picker(engines=3)
    for allowed in server.app[CLUSTER].instances:
        hint = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": [endpoint(allowed)]}}
        stream = ExtProcStream(channel)
        await stream.call.write(request_headers(metadata=hint))
        answers = await stream.send(request_body(BODY, end=True), answers=2)
        assert destination_of(answers[0])[0] == endpoint(allowed)
        await stream.end()
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers(metadata={"envoy.lb.subset_hint": {
        "x-gateway-destination-endpoint-subset": "10.9.9.9:80, 10.9.9.8:80"}}))
    refused = (await stream.send(request_body(BODY, end=True), answers=1))[0].immediate_response
    assert refused.status.code == 503
    assert "none of the endpoints" in json.loads(refused.body)["error"]["message"]
    await stream.end()
    assert await wait_for(lambda: not charged(server)), charged(server)


async def test_a_refused_request_is_an_immediate_429_with_retry_after_and_nothing_stays_charged(picker, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"default": {"rate": 1, "burst": 1}}}))
    url, server, channel = await picker(tenants=str(tenants))
    codes = []
    for _ in range(2):
        stream = ExtProcStream(channel)
        await stream.call.write(request_headers())
        answer = (await stream.send(request_body(BODY, end=True), answers=1))[0]
        if answer.HasField("immediate_response"):
            refused = answer.immediate_response
            codes.append(refused.status.code)
            headers = {h.header.key: h.header.raw_value.decode() for h in refused.headers.set_headers}
            assert int(headers["retry-after"]) >= 1 and headers["content-type"] == "application/json"
            assert json.loads(refused.body)["error"]["code"] == "rate_limit"
        else:
            codes.append(200)
        await stream.end()
    assert codes == [200, 429]
    assert await wait_for(lambda: not charged(server)), charged(server)


async def test_a_bad_body_is_a_400_and_a_body_over_the_limit_a_413(picker):
    url, server, channel = await picker(max_body_bytes=4096)
    for chunks, status in (([b"{not json"], 400), ([b"x" * 3000, b"y" * 3000], 413)):
        stream = ExtProcStream(channel)
        await stream.call.write(request_headers())
        for chunk in chunks[:-1]:
            await stream.call.write(request_body(chunk, end=False))
        answer = (await stream.send(request_body(chunks[-1], end=True), answers=1))[0]
        assert answer.immediate_response.status.code == status
        await stream.end()
    assert not charged(server)


async def test_the_response_body_gives_first_token_usage_and_finish(picker):
    url, server, channel = await picker()
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers(response_mode=Mode.FULL_DUPLEX_STREAMED))
    answers = await stream.send(request_body(BODY, end=True), answers=2)
    chosen = server.app[CLUSTER].by_id(next(h.header.raw_value.decode() for h in
                                            answers[0].request_headers.response.header_mutation.set_headers
                                            if h.header.key == "x-kvroute-instance"))
    await stream.send(response_headers(200), answers=1)
    assert chosen.queued_prefill_tokens > 0  # a body will come: its first chunk is the first byte
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 300, "completion_tokens": 4}}\n\n'
    echoed = await stream.send(response_body(b'data: {"choices": [{"text": "ok"}]}\n\n', end=False), answers=1)
    assert echoed[0].response_body.response.body_mutation.streamed_response.body.startswith(b"data: ")
    assert chosen.queued_prefill_tokens == 0 and chosen.inflight == 1
    last = await stream.send(response_body(usage + b"data: [DONE]\n\n", end=True), answers=1)
    assert last[0].response_body.response.body_mutation.streamed_response.end_of_stream
    assert await wait_for(lambda: not charged(server)), charged(server)  # finished at the body's end
    await stream.end()
    assert await wait_for(lambda: finished(server)["requests"] == 1)
    assert finished(server)["output_tokens_per_s"] * 60.0 == pytest.approx(4)  # the usage the stream carried


async def test_the_fallback_that_served_takes_the_charge(picker):
    url, server, channel = await picker(engines=3, ext_proc_fallbacks=1)
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    answers = await stream.send(request_body(BODY, end=True), answers=2)
    header, metadata = destination_of(answers[0])
    first, fallback = header.split(",")
    assert header == metadata
    by_endpoint = {endpoint(i): i for i in server.app[CLUSTER].instances}
    assert by_endpoint[first].inflight == 1
    await stream.send(response_headers(200, served=fallback), answers=1)
    assert by_endpoint[first].inflight == 0 and by_endpoint[fallback].inflight == 1
    await stream.end()
    assert await wait_for(lambda: not charged(server)), charged(server)


KEY = "s3cret"
# (method, path, headers, body or None for a bodiless request): what the proxy answers each, the picker must
AS_THE_PROXY = [
    ("GET", "/v1/models", {}, None),
    ("GET", "/v1/models/kvroute-tiny", {}, None),
    ("GET", "/v1/models/no-such-model", {}, None),
    ("GET", "/v1/completions", {}, None),
    ("DELETE", "/v1/chat/completions", {}, None),
    ("POST", "/v1/completions", {}, None),
    ("POST", "/v1/completions", {"content-length": "9999999"}, None),
    ("GET", "/load", {}, None),  # an engine's own paths: the proxy sends none of them to an engine
    ("POST", "/kv/pull", {}, b"{}"),
    ("GET", "/v1/models", {"authorization": "Bearer wrong"}, None),
    ("POST", "/v1/completions", {"authorization": ""}, BODY),
]


async def picker_answer(channel, method, path, headers, body) -> tuple[int, dict]:
    """The status and JSON body the picker answers at once to a request Envoy shows it."""
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers(path, headers, end=body is None, method=method))
    answer = (await stream.call.read()) if body is None else (await stream.send(request_body(body, True), 1))[0]
    await stream.end()
    assert answer.HasField("immediate_response"), (method, path, answer)
    return answer.immediate_response.status.code, json.loads(answer.immediate_response.body)


async def test_what_the_proxy_refuses_or_answers_itself_the_picker_does_too_and_no_engine_sees_it(picker, http):
    url, server, channel = await picker(api_key=(KEY,), max_body_bytes=65536)
    seen_before = [i.inflight for i in server.app[CLUSTER].instances]
    for method, path, extra, body in AS_THE_PROXY:
        headers = {"authorization": f"Bearer {KEY}", **extra}
        status, answer = await picker_answer(channel, method, path, headers, body)
        async with http.request(method, url + path, headers=headers, data=body) as r:
            assert (status, "error" in answer) == (r.status, r.status >= 400), (method, path, answer)
            if r.status == 200:
                want = await r.json()
                assert [m["id"] for m in answer.get("data", [answer])] == [m["id"] for m in want.get("data", [want])]
    assert [i.inflight for i in server.app[CLUSTER].instances] == seen_before
    assert not charged(server)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models", "/kv/pull"])
async def test_the_api_key_is_checked_at_the_headers_of_every_request(picker, path):
    url, server, channel = await picker(api_key=(KEY,))
    stream = ExtProcStream(channel)
    answer = (await stream.send(request_headers(path, {"authorization": "Bearer nope"}), answers=1))[0]
    assert answer.immediate_response.status.code == 401  # before any body came
    assert json.loads(answer.immediate_response.body)["error"]["code"] == "invalid_api_key"
    await stream.end()
    assert not charged(server)


@pytest.mark.parametrize("mode", [Mode.NONE, Mode.STREAMED])
async def test_a_completion_the_picker_may_not_read_first_is_refused_not_routed_on_load(picker, mode):
    url, server, channel = await picker()
    stream = ExtProcStream(channel)
    answer = (await stream.send(request_headers(body_mode=mode), answers=1))[0]
    assert answer.immediate_response.status.code == 500
    assert "FULL_DUPLEX_STREAMED or BUFFERED" in json.loads(answer.immediate_response.body)["error"]["message"]
    await stream.end()
    assert not charged(server)


async def test_grpc_health_says_serving_for_liveness_readiness_and_the_service(picker):
    url, server, channel = await picker()
    check = health_pb2_grpc.HealthStub(channel).Check
    for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
        answer = await check(health_pb2.HealthCheckRequest(service=name))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, name


def test_the_router_without_the_flag_imports_no_grpc():
    code = ("import sys; from kvroute.router.service.app import create_app; "
            "from kvroute.router.service.config import RouterConfig; "
            "create_app(RouterConfig(engines=('http://127.0.0.1:9',))); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'grpc_health', 'google', 'envoy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_the_echoed_body_carries_the_priority_the_tenant_is_granted(picker, tmp_path):
    """A tenant's requests are no more urgent than its min_priority (0 by default), in the body the
    engine gets through the gateway too: the echoed body and its new content-length say so."""
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"default": {"rate": 100, "burst": 100}}}))
    url, server, channel = await picker(tenants=str(tenants))
    urgent = json.dumps({**json.loads(BODY), "priority": -1000}).encode()
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    answers = await stream.send(request_body(urgent, end=True), answers=2)
    sent, ends = echoed_body(answers)
    assert json.loads(sent)["priority"] == 0 and ends == [True]
    lengths = [h.header.raw_value for h in answers[0].request_headers.response.header_mutation.set_headers
               if h.header.key == "content-length"]
    assert lengths == [str(len(sent)).encode()]
    await stream.send(response_headers(200), answers=1)
    await stream.end()
    assert await wait_for(lambda: not charged(server)), charged(server)
