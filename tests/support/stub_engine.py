"""Engines that speak kvroute's control API and answer completions however a test says, and a
router in front of them."""

import asyncio
import contextlib

from aiohttp import web

from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.service.app import CLUSTER
from tests.support.loopback import LoopbackServer
from tests.support.waiting import wait_for


def stub_engine(instance_id: str, completions, health=None, on_load=None, **info_fields) -> web.Application:
    """An engine that speaks the kvroute control API and answers completions with `completions`
    (and GET /health with `health`, GET /load with `on_load(default handler, request)`, if given);
    `info_fields` replace fields of its /kv/info (e.g. role="prefill", tokenizer="another")."""
    info = {"instance_id": instance_id, "model": "kvroute-tiny", "block_size": 16,
            "hash_seed": hash_seed("kvroute-tiny"), "tokenizer": load_tokenizer().fingerprint, "role": "both",
            **info_fields}
    load = {"instance": instance_id, "running": 0, "waiting": 0, "kv_used_blocks": 0, "kv_total_blocks": 64,
            "queued_prefill_tokens": 0}

    async def kv_info(_):
        return web.json_response(info)

    async def healthy(_):
        return web.json_response({"status": "ok"})

    async def get_load(_):
        return web.json_response(load)

    async def snapshot(_):
        return web.json_response({"instance": instance_id, "epoch": 1, "seq": 0, "tiers": {"device": []}})

    closing = asyncio.Event()  # set on shutdown: a pending long poll answers at once, so close is quick

    async def events(_):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), 0.2)
        return web.json_response({"instance": instance_id, "epoch": 1, "seq": 0, "resync": False, "events": []})

    async def load_via(request):
        return await on_load(get_load, request)

    async def on_shutdown(_):
        closing.set()

    app = web.Application()
    app.on_shutdown.append(on_shutdown)
    app.router.add_get("/kv/info", kv_info)
    app.router.add_get("/health", health or healthy)
    app.router.add_get("/load", get_load if on_load is None else load_via)
    app.router.add_get("/kv/snapshot", snapshot)
    app.router.add_get("/kv/events", events)
    app.router.add_post("/v1/completions", completions)
    return app


async def stub_router(start_router, *handlers, **router_kw):
    stubs = [await LoopbackServer(stub_engine(f"s{i}", h)).start() for i, h in enumerate(handlers)]
    url, server = await start_router([s.url for s in stubs], **router_kw)
    await wait_for(lambda: all(i.routable for i in server.app[CLUSTER].instances))
    return url, server, stubs


OK_CHUNK = b'data: {"choices": [{"index": 0, "text": "ok"}]}\n\n'


async def answer_ok(request: web.Request) -> web.StreamResponse:
    """A completions handler that answers "ok": one SSE chunk and [DONE] when asked to stream."""
    if (await request.json()).get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(OK_CHUNK + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    return web.json_response({"choices": [{"index": 0, "text": "ok"}]})


async def close_all(stubs) -> None:
    for s in stubs:
        await s.close()
