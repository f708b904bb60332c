"""OpenAI API semantics on engine and router: model cards, streaming usage, refused fields."""

import orjson
import pytest

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


async def sse_events(resp) -> list:
    out = []
    async for line in resp.content:
        line = line.strip()
        if line.startswith(b"data: "):
            payload = line[6:]
            out.append(payload if payload == b"[DONE]" else orjson.loads(payload))
    return out


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
