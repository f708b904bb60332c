"""Router faults against engines that misbehave on purpose (stub engines on loopback)."""

import asyncio
import subprocess
import sys

from aiohttp import web

from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.router_cluster import FAST, prompt
from tests.support.stub_engine import stub_engine
from tests.support.waiting import wait_for


async def breaks_mid_stream(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices": [{"index": 0, "text": "partial"}]}\n\n')
    await asyncio.sleep(0.05)
    request.transport.close()  # the engine dies mid-stream
    return resp


async def test_mid_stream_failure_ends_with_sse_error(start_router, http):
    server = await LoopbackServer(stub_engine("flaky", breaks_mid_stream)).start()
    try:
        url, _ = await start_router([server.url])
        await asyncio.sleep(0.3)
        body = {"prompt": "hello", "max_tokens": 5, "stream": True}
        async with http.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200
            text = (await r.read()).decode()
        assert "partial" in text
        assert '"error"' in text and "mid-stream" in text
        assert text.rstrip().endswith("data: [DONE]")
    finally:
        await server.close()


async def test_5xx_before_first_byte_is_retried_elsewhere(start_engine, start_router, http):
    async def fails(_):
        return web.json_response({"error": {"message": "boom"}}, status=500)

    bad = await LoopbackServer(stub_engine("bad", fails)).start()
    try:
        good_url, _ = await start_engine(time_scale=FAST)
        url, server = await start_router([bad.url, good_url], policy="round_robin")
        await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
        for _ in range(4):
            async with http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
                assert r.status == 200 and r.headers["x-kvroute-instance"] == "e0"
        async with http.get(url + "/metrics") as r:
            retries = [line for line in (await r.text()).splitlines()
                       if line.startswith("kvroute_router_retries_total")]
        assert float(retries[0].split()[-1]) >= 2  # round robin sent at least two of them to "bad" first
    finally:
        await bad.close()


async def test_client_disconnect_cancels_upstream(start_engine, start_router, http):
    from kvroute.engine.service.server import ENGINE

    engine_url, engine_server = await start_engine(time_scale=20.0)
    url, server = await start_router([engine_url])
    await wait_for(lambda: server.app[CLUSTER].instances[0].routable)
    engine = engine_server.app[ENGINE]
    body = {"prompt": prompt(1), "max_tokens": 500, "stream": True, "ignore_eos": True}
    async with http.post(url + "/v1/completions", json=body) as r:
        await r.content.readline()
        assert engine.scheduler.running
    assert await wait_for(lambda: not engine.scheduler.running and engine.block_manager.num_used == 0)
    assert await wait_for(lambda: server.app[CLUSTER].instances[0].inflight == 0)


def test_router_never_imports_torch():
    code = ("import sys, kvroute.router.service.app, kvroute.router.service.cli, kvroute.router.contract.protocol, "
            "kvroute.router.contract.tokenizer, kvroute.router.index.redis; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_protocol_imports_neither_torch_nor_aiohttp():
    code = "import sys, router.contract.protocol; assert 'torch' not in sys.modules and 'aiohttp' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


async def test_router_forwards_its_token_ids_to_engines_that_tokenize_alike(start_router, http):
    seen = []

    async def record(request):
        seen.append(await request.json())
        return web.json_response({"choices": [{"index": 0, "text": "ok"}], "usage": None})

    app = stub_engine("same-tok", record)
    app.router.add_post("/v1/chat/completions", record)
    server = await LoopbackServer(app).start()
    try:
        url, cluster_server = await start_router([server.url])
        await wait_for(lambda: cluster_server.app[CLUSTER].instances[0].routable)
        tok = load_tokenizer()
        messages = [{"role": "user", "content": "hello there"}]
        async with http.post(url + "/v1/chat/completions", json={"messages": messages,
                                                                "kvroute_prompt_token_ids": [9, 9]}) as r:
            assert r.status == 200
        async with http.post(url + "/v1/completions", json={"prompt": "hello there"}) as r:
            assert r.status == 200
        chat, completion = seen
        assert chat["kvroute_prompt_token_ids"] == tok.encode_chat(messages)  # the router's, not the client's
        assert chat["messages"] == messages
        assert completion["prompt"] == tok.encode("hello there")
    finally:
        await server.close()
