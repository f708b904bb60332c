"""OpenAI API semantics on engine and router: model cards, streaming usage, refused fields."""

import pytest

from tests.support.sse import sse_events

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


async def test_model_card_on_engine_and_router(start_engine, start_router, http):
    url, _ = await start_engine(time_scale=0.01)
    router_url, _ = await start_router([url])
    for base in (url, router_url):
        async with http.get(base + "/v1/models/kvroute-tiny") as r:
            card = await r.json()
            assert r.status == 200 and card["id"] == "kvroute-tiny" and card["object"] == "model"
        async with http.get(base + "/v1/models/gpt-4") as r:
            err = (await r.json())["error"]
            assert r.status == 404 and err["code"] == "model_not_found" and "kvroute-tiny" in err["message"]
    async with http.get(router_url + "/metrics") as r:
        assert "_created" not in await r.text()


async def test_stream_usage_only_when_asked(start_engine, start_router, http):
    url, _ = await start_engine(time_scale=0.01)
    router_url, _ = await start_router([url])
    body = {"prompt": PROMPT, "max_tokens": 4, "stream": True}
    for base in (url, router_url):
        async with http.post(base + "/v1/completions", json=body) as r:
            events = await sse_events(r)
        assert events[-1] == b"[DONE]" and all("usage" not in e for e in events[:-1])
        async with http.post(base + "/v1/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
            events = await sse_events(r)
        *chunks, last, done = events
        assert done == b"[DONE]" and last["choices"] == [] and last["object"] == "text_completion"
        assert last["usage"]["completion_tokens"] == 4 and last["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
        assert chunks[-1]["choices"][0]["finish_reason"] == "length" and all(c["usage"] is None for c in chunks)


async def test_continuous_usage_stats_counts_up(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    body = {"prompt": PROMPT, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    async with http.post(url + "/v1/completions", json=body) as r:
        events = await sse_events(r)
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 4


@pytest.mark.parametrize("field, value", [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "required"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ("response_format", {"type": "json_object"}), ("guided_json", {"type": "object"}), ("echo", True),
    ("best_of", 2), ("suffix", "end"), ("min_tokens", 3),
])
async def test_fields_the_engine_cannot_honour_are_400(start_engine, start_router, http, field, value):
    url, _ = await start_engine(time_scale=0.01)
    router_url, _ = await start_router([url])
    for base in (url, router_url):  # the router relays the engine's refusal unchanged
        async with http.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, field: value}) as r:
            err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == field and err["code"] == "unsupported_parameter", err
            assert "not supported" in err["message"]


async def test_harmless_values_of_those_fields_are_accepted(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "best_of": 1, "user": "someone"}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi", "logprobs": 21}, "logprobs"), ({"prompt": "hi", "logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, "logprobs"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"999999": 1}}, "logit_bias"), ({"prompt": "hi", "top_k": -2}, "top_k"),
])
async def test_bad_sampling_fields_are_400(start_engine, http, body, param):
    url, _ = await start_engine(time_scale=0.01)
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with http.post(url + path, json=body) as r:
        err = (await r.json())["error"]
        assert r.status == 400 and err["param"] == param, err
