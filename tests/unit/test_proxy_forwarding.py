"""What the proxy sends and tells (router/service/proxy.py `forward`, `Dispatch`), on loopback stubs:
the router's token ids go only to engines that tokenize as it does, whole requests go to "both"
engines when there are any, a retry with no instance left reports the last failure, the policy
hears each attempt's instance, first token and end, and the outcome metrics carry their labels."""

import orjson
from aiohttp import web

from kvroute.router.contract.openai_request import FORWARDED_IDS
from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.app import CLUSTER, ROUTER
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import answer_ok, close_all, stub_engine, stub_router
from tests.support.waiting import wait_for

PROMPT = "the quick brown fox jumps over the lazy dog"


class Recorder:
    """A completions handler that keeps each request's JSON body and answers like an engine."""

    def __init__(self, status=200):
        self.bodies, self.status = [], status

    async def __call__(self, request):
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return web.Response(status=self.status, text="engine failed")
        return await answer_ok(request)


class RecordingPolicy:
    """The router's policy, with the proxy's calls to it written down (instance and arguments)."""

    def __init__(self, policy):
        self.policy, self.calls = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def on_first_token(self, request, instance, ttft_s, uncached_tokens):
        self.calls.append(("first_token", request.request_id, instance, ttft_s, uncached_tokens))
        self.policy.on_first_token(request, instance, ttft_s, uncached_tokens)

    def on_finished(self, request, instance):
        self.calls.append(("finished", request.request_id, instance))
        self.policy.on_finished(request, instance)

    def on_failed(self, request, instance):
        self.calls.append(("failed", request.request_id, instance))
        self.policy.on_failed(request, instance)


async def complete(http, url, **body):
    async with http.post(url + "/v1/completions", json={"max_tokens": 1, **body}) as r:
        return r.status, r.headers.get("x-kvroute-instance"), await r.read()


async def metric_lines(http, url, name):
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")}


async def test_an_engine_that_tokenizes_like_the_router_gets_the_routers_token_ids(start_router, http):
    engine = Recorder()
    app = stub_engine("s0", engine)
    app.router.add_post("/v1/chat/completions", engine)
    stubs = [await LoopbackServer(app).start()]
    url, server = await start_router([stubs[0].url])
    assert await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
    ids = load_tokenizer().encode(PROMPT)
    try:
        for stream in (False, True):
            assert (await complete(http, url, prompt=PROMPT, stream=stream))[0] == 200
        assert [b["prompt"] for b in engine.bodies] == [ids, ids]
        assert [b["stream"] for b in engine.bodies] == [False, True]
        async with http.post(url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}) as r:
            assert r.status == 200, await r.text()
        chat = engine.bodies[-1]
        assert chat["messages"] == [{"role": "user", "content": PROMPT}]
        assert chat[FORWARDED_IDS] == load_tokenizer().encode_chat(chat["messages"])
    finally:
        await close_all(stubs)


async def test_prompt_ids_and_engines_that_tokenize_otherwise_get_the_body_as_sent(start_router, http):
    same, other = Recorder(), Recorder()
    stubs = [await LoopbackServer(stub_engine("same", same)).start(),
             await LoopbackServer(stub_engine("other", other, tokenizer="another-tokenizer")).start()]
    try:
        url, server = await start_router([s.url for s in stubs], policy="round_robin")
        assert await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
        served = {(await complete(http, url, prompt=PROMPT))[1] for _ in range(2)}
        assert served == {"same", "other"}
        assert other.bodies[0]["prompt"] == PROMPT
        assert same.bodies[0]["prompt"] == load_tokenizer().encode(PROMPT)
        ids = [5, 6, 7, 8]
        for _ in range(2):
            assert (await complete(http, url, prompt=ids))[0] == 200
        assert same.bodies[-1]["prompt"] == ids and other.bodies[-1]["prompt"] == ids
    finally:
        await close_all(stubs)


async def test_whole_requests_go_only_to_both_role_engines_when_there_are_any(start_router, http):
    prefill, both = Recorder(), Recorder()
    stubs = [await LoopbackServer(stub_engine("p0", prefill, role="prefill")).start(),
             await LoopbackServer(stub_engine("b0", both)).start()]
    try:
        url, server = await start_router([s.url for s in stubs], policy="round_robin")
        assert await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
        for stream in (False, True, False, True):
            status, served_by, body = await complete(http, url, prompt=PROMPT, stream=stream)
            assert status == 200 and served_by == "b0", body
        assert len(both.bodies) == 4 and not prefill.bodies
    finally:
        await close_all(stubs)


async def test_a_retry_with_no_instance_left_reports_the_last_failure(start_router, http):
    url, server, stubs = await stub_router(start_router, Recorder(500), Recorder(500), policy="round_robin",
                                           max_retries=5, eject_after=100)
    try:
        status, _, body = await complete(http, url, prompt=PROMPT)
        assert status == 503
        message = orjson.loads(body)["error"]["message"]
        assert message in ("instance s0 answered HTTP 500", "instance s1 answered HTTP 500")
        retries = await metric_lines(http, url, "kvroute_router_retries_total")
        assert list(retries.values()) == [2.0]  # s0, s1, then a third attempt finds none left
        errors = await metric_lines(http, url, "kvroute_router_errors_total")
        assert errors == {'kvroute_router_errors_total{kind="upstream"}': 1.0}
    finally:
        await close_all(stubs)


async def test_the_policy_hears_each_attempts_instance_first_token_and_end(start_router, http, monkeypatch):
    prompt = " ".join(f"word{i}" for i in range(700))  # over the 512 tokens a rate sample needs
    url, server, stubs = await stub_router(start_router, Recorder(500), Recorder(), policy="round_robin",
                                           max_retries=1, eject_after=100)
    policy = RecordingPolicy(server.app[ROUTER].policy)
    monkeypatch.setattr(server.app[ROUTER], "policy", policy)
    tokens = len(load_tokenizer().encode(prompt))
    try:
        for stream in (True, False):
            status, served_by, _ = await complete(http, url, prompt=prompt, stream=stream)
            assert status == 200 and served_by == "s1"
        streamed, whole = policy.calls[0][1], policy.calls[4][1]
        assert streamed != whole
        [(_, _, instance, ttft, uncached)] = [c for c in policy.calls if c[0] == "first_token"]  # the stream's
        assert instance == "s1" and ttft > 0 and uncached == tokens
        assert policy.calls == [("finished", streamed, "s0"), ("failed", streamed, "s0"),
                                ("first_token", streamed, "s1", ttft, tokens), ("finished", streamed, "s1"),
                                ("finished", whole, "s0"), ("failed", whole, "s0"), ("finished", whole, "s1")]
    finally:
        await close_all(stubs)


async def test_requests_are_counted_by_instance_policy_and_outcome(start_router, http):
    url, server, stubs = await stub_router(start_router, Recorder(500), Recorder(), policy="round_robin",
                                           max_retries=1, eject_after=100)
    try:
        for stream in (False, True):
            assert (await complete(http, url, prompt=PROMPT, stream=stream))[0] == 200
        counts = await metric_lines(http, url, "kvroute_router_requests_total")
        assert counts == {
            'kvroute_router_requests_total{instance="s0",policy="round_robin",status="retried"}': 2.0,
            'kvroute_router_requests_total{instance="s1",policy="round_robin",status="200"}': 2.0}
        tokens = len(load_tokenizer().encode(PROMPT))
        assert await metric_lines(http, url, "kvroute_router_prompt_tokens_total") == {
            "kvroute_router_prompt_tokens_total": 4.0 * tokens}  # one per attempt
        ratio = await metric_lines(http, url, "kvroute_router_cached_token_ratio_count")
        assert list(ratio.values()) == [4.0]
    finally:
        await close_all(stubs)


async def test_with_no_instance_to_try_the_client_hears_why(start_router, http):
    async def draining(get_load, request):
        return web.json_response({"instance": "s0", "running": 0, "waiting": 0, "kv_used_blocks": 0,
                                  "kv_total_blocks": 64, "queued_prefill_tokens": 0, "state": "draining"})

    stub = await LoopbackServer(stub_engine("s0", Recorder(), on_load=draining)).start()
    try:
        url, server = await start_router([stub.url])
        assert await wait_for(lambda: server.app[CLUSTER].instances[0].draining)
        status, _, body = await complete(http, url, prompt=PROMPT)
        assert status == 503
        assert orjson.loads(body)["error"]["message"] == "no healthy instance serves 'kvroute-tiny'"
    finally:
        await stub.close()


async def test_the_admission_gate_hears_of_each_first_byte_and_end(start_router, http, monkeypatch):
    url, server, stubs = await stub_router(start_router, Recorder())
    news = []
    monkeypatch.setattr(server.app[ROUTER], "on_progress", lambda: news.append(1))  # the gate's poke
    try:
        for stream in (True, False):
            assert (await complete(http, url, prompt=PROMPT, stream=stream))[0] == 200
        assert len(news) == 4  # per request: its prefill seen done, then its end
    finally:
        await close_all(stubs)


async def test_an_admitted_request_takes_the_decision_admission_predicted_from(start_router, http):
    engine = Recorder()
    url, server, stubs = await stub_router(start_router, engine, engine, slo_ttft_s=5.0)
    try:
        for i in range(3):  # long enough for blocks, so each decision looks the prompt up
            assert (await complete(http, url, prompt=f"{i} " + PROMPT * 4))[0] == 200
        lookups = await metric_lines(http, url, "kvroute_router_index_lookup_seconds_count")
        assert lookups == {"kvroute_router_index_lookup_seconds_count": 3.0}  # the prediction's only
    finally:
        await close_all(stubs)
