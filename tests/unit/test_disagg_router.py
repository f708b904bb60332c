"""Prefill/decode disaggregation through the router (torch engines, loopback)."""

import random

import orjson
import torch

from kvroute.router.service.app import CLUSTER
from tests.support.waiting import wait_for

torch.set_num_threads(1)


def ids(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(5, 8192) for _ in range(n)]


SECRET = "router-test-secret"


async def pd_cluster(start_engine, start_router, **router_kw):
    p_url, p = await start_engine(backend="torch", role="prefill", instance_id="p0", kv_secret=SECRET)
    d_url, d = await start_engine(backend="torch", role="decode", instance_id="d0", kv_secret=SECRET)
    url, server = await start_router([p_url, d_url], kv_secret=SECRET, **router_kw)
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    return url, server, (p_url, p), (d_url, d)


async def stream(http, url, body, path="/v1/completions"):
    async with http.post(url + path, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        raw = await r.read()
        chunks = [orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]
        return r.status, r.headers, chunks, raw


async def test_streamed_disaggregated_output_equals_colocated(start_engine, start_router, http):
    url, _, _, _ = await pd_cluster(start_engine, start_router)
    ref_url, _ = await start_engine(backend="torch", role="both", instance_id="ref")
    body = {"prompt": ids(1, 400), "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    async with http.post(ref_url + "/v1/completions", json=body) as r:
        expected = (await r.json())["choices"][0]["text"]
    status, headers, chunks, raw = await stream(http, url, body)
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
    assert headers["x-kvroute-instance"] == "d0" and headers["x-kvroute-prefill-instance"] == "p0"
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected
    assert chunks[-1]["usage"]["completion_tokens"] == 10


async def test_chat_through_disaggregation(start_engine, start_router, http):
    url, _, _, _ = await pd_cluster(start_engine, start_router, pd_min_uncached=16)
    body = {"messages": [{"role": "user", "content": "tell me about caches " * 20}], "max_tokens": 5,
            "ignore_eos": True}
    status, headers, chunks, _ = await stream(http, url, body, "/v1/chat/completions")
    assert status == 200 and headers.get("x-kvroute-prefill-instance") == "p0"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 5


async def test_short_prompt_skips_the_prefill_stage(start_engine, start_router, http):
    url, _, _, _ = await pd_cluster(start_engine, start_router, pd_min_uncached=256)
    async with http.post(url + "/router/explain", json={"prompt": ids(2, 100), "max_tokens": 3}) as r:
        explained = await r.json()
    assert explained["disaggregated"] is False and explained["decode"]["choice"] == "d0"
    async with http.post(url + "/router/explain", json={"prompt": ids(3, 600), "max_tokens": 3}) as r:
        explained = await r.json()
    assert explained["disaggregated"] is True and explained["prefill"]["choice"] == "p0"
    status, headers, _, _ = await stream(http, url, {"prompt": ids(2, 100), "max_tokens": 3})
    assert status == 200 and headers["x-kvroute-instance"] == "d0" and "x-kvroute-prefill-instance" not in headers


async def test_non_streamed_disaggregated_request(start_engine, start_router, http):
    url, _, _, _ = await pd_cluster(start_engine, start_router)
    async with http.post(url + "/v1/completions", json={"prompt": ids(4, 500), "max_tokens": 6,
                                                         "ignore_eos": True}) as r:
        assert r.status == 200 and r.headers["x-kvroute-instance"] == "d0"
        out = await r.json()
    assert out["usage"]["completion_tokens"] == 6 and "kv_transfer_params" not in out


async def test_dead_prefill_loses_no_unstarted_request(start_engine, start_router, http):
    url, server, (_, p), _ = await pd_cluster(start_engine, start_router, max_retries=1)
    await p.close()
    status, headers, chunks, _ = await stream(http, url, {"prompt": ids(5, 500), "max_tokens": 4,
                                                           "ignore_eos": True})
    assert status == 200 and headers["x-kvroute-instance"] == "d0"
    assert chunks[-1]["usage"]["completion_tokens"] == 4
