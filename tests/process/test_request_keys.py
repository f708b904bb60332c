"""Adapters, images and salts end to end: events from a vLLM publisher credited to the requests
that carry the same keys (POST /router/explain shows the cached tokens).

The publisher is tests/support/vllm_publisher.py (written from vLLM's wire format) and, where the
vLLM package imports, vLLM's own ZmqEventPublisher (tests/support/vllm_package_publisher.py; run
this file with the interpreter of kvroute/scripts/vllm_key_fixtures.py's venv)."""

import asyncio
import time

import pytest

from kvroute.router.contract.block_keys import ImageKey, RequestKeys, vllm_extra_keys
from kvroute.router.contract.image_keys import image_hash
from kvroute.router.contract.tokenizer import load_tokenizer
from tests.support.foreign_stubs import StubEngine
from tests.support.loopback import LoopbackServer
from tests.support.vision_tokenizer import vision_tokenizer_dir
from tests.support.vllm_keys import CASES
from tests.support.vllm_package_publisher import VllmPackagePublisher
from tests.support.vllm_publisher import VllmPublisher, engine_hashes, stored

PROMPT = "Describe the picture, then list every planet of the solar system in order of size. " * 3
IMAGE = CASES["one_image"]["images"][0]["data_uri"]
RUN = 20  # placeholder tokens per image


def chat(model, url=IMAGE, **extra):
    return {"model": model, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPT}]}], **extra}


def vllm_blocks(tok, model_id):
    """The prompt's ids as vLLM's processor makes them and the keys vLLM gives its blocks."""
    ids = tok.encode_chat([{"role": "user", "content": "<image>\n" + PROMPT}])
    at = ids.index(tok.vision.token_id)
    ids = ids[:at] + [tok.vision.token_id] * RUN + ids[at + 1:]
    return ids, RequestKeys(adapter="my-lora", images=(ImageKey(hash=image_hash(IMAGE, model_id), offset=at,
                                                                 length=RUN),))


class WirePublisher(VllmPublisher):
    def publish_stored(self, hashes, parent, token_ids, **keys):
        self.publish([stored(hashes, parent, token_ids, **keys)])


def _publisher(kind):
    if kind == "wire":
        return WirePublisher(events="map", batch="map")
    pytest.importorskip("vllm.distributed.kv_events", reason="the vLLM package does not import here")
    return VllmPackagePublisher()


@pytest.fixture(params=["wire", "vllm-package"])
async def vllm_engine(tmp_path, request):
    """A vLLM-shaped engine (tests/support/foreign_stubs.py, serving adapter `my-lora`) with the
    vision tokenizer, its publisher, and the tokenizer directory."""
    tok_dir = vision_tokenizer_dir(tmp_path, RUN)
    tok = load_tokenizer(tok_dir)
    pub = _publisher(request.param)
    stub = StubEngine("vllm", tok)
    server = await LoopbackServer(stub.app()).start()
    yield stub, server.url, pub, tok_dir
    pub.close()
    await server.close()


async def engine_blocks(http, router, url, want):
    deadline = time.monotonic() + 5
    while True:
        async with http.get(router + "/router/instances") as r:
            got = {i["url"]: i for i in (await r.json())["instances"]}[url]["kv_events"]["engine_blocks"]
        if got == want:
            return
        assert time.monotonic() < deadline, f"{got} engine blocks indexed, not {want}"
        await asyncio.sleep(0.02)


async def explain(http, router, body):
    async with http.post(router + "/router/explain", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_lora_and_image_blocks_are_credited_to_that_adapter_and_image(vllm_engine, start_router, http):
    stub, url, pub, tok_dir = vllm_engine
    tok = load_tokenizer(tok_dir)
    router, _ = await start_router([url], engine_kinds=("vllm",), tokenizer=str(tok_dir),
                                   kv_event_sources=(f"{url}={pub.endpoint}",),
                                   kv_event_replay_sources=(f"{url}={pub.replay_endpoint}",))
    ids, keys = vllm_blocks(tok, stub.model)
    full = len(ids) // 16
    extras = [list(e) if e else None for e in vllm_extra_keys(keys, 16, full)]
    pub.publish_stored(engine_hashes(ids, 16), None, ids[:full * 16], lora_id=1, lora_name="my-lora",
                       extra_keys=extras)

    await engine_blocks(http, router, url, full)
    found = await explain(http, router, chat("my-lora"))
    assert found["predicted_cached_tokens"] == full * 16
    assert found["keys"]["adapter"] == "my-lora" and found["keys"]["images"] == 1
    assert found["instances"][0]["match"].startswith(f"{full * 16} tokens cached")
    assert (await explain(http, router, chat(stub.model)))["predicted_cached_tokens"] == 0  # the base model
    other = CASES["two_images"]["images"][1]["data_uri"]
    assert (await explain(http, router, chat("my-lora", url=other)))["predicted_cached_tokens"] == 0
    salted = await explain(http, router, chat("my-lora", cache_salt="tenant-a"))
    assert salted["predicted_cached_tokens"] == 0 and salted["keys"]["salt"] is True


async def test_a_remote_image_is_routed_on_its_text_prefix_and_counted(vllm_engine, start_router, http):
    stub, url, _, tok_dir = vllm_engine
    router, _ = await start_router([url], engine_kinds=("vllm",), tokenizer=str(tok_dir))
    body = chat(stub.model, url="https://images.example/cat.png")
    found = await explain(http, router, body)
    assert found["keys"]["unhashed_from_token"] is not None and "before it" in found["keys"]["note"]
    assert found["blocks"] == found["keys"]["unhashed_from_token"] // 16
    async with http.post(router + "/v1/chat/completions", json={**body, "max_tokens": 2}) as r:
        assert r.headers.get("x-kvroute-instance"), await r.text()  # forwarded, not failed (the stub has no chat)
    async with http.get(router + "/metrics") as r:
        text = await r.text()
    assert 'kvroute_router_request_keys_total{key="image_unhashed_remote_url"}' in text
