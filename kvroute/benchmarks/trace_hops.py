"""Count what one chat completion crosses in the router before the engine sees a byte.

    python -m kvroute.benchmarks.trace_hops [--stream] [--out hops.json]

One router (in this process, kv_aware, its load and health polls slowed so none runs during the
trace) over one stub engine (also in this process); after three warm-up requests, a profiler
(sys.setprofile) follows one chat completion from the moment the client sends it until the engine's
handler is called. It records every call of a function in a router module (kvroute.router.*, a
module being one file), a new call or a coroutine resumed, and for each the nearest router
frame below it on the stack:

- modules: the router modules with at least one call;
- hops: calls whose nearest router caller is in another module (A calls into B);
- bounces: hops A -> B where B is already on the stack below A (B called, maybe through others,
  into A, which calls back into B: a callback up the stack, such as an HTTP client telling routing
  that the request is on the wire).

The edges (A -> B, with counts) and the bounces are printed and written to --out, so a change in
the request path shows where it moved. docs/architecture.md#the-request-path gives the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys

import aiohttp
from aiohttp import web

import kvroute.router

ROUTER_DIR = os.path.realpath(os.path.dirname(kvroute.router.__file__)) + os.sep
PROMPT = [{"role": "system", "content": "You are a careful assistant. " * 20},
          {"role": "user", "content": "Which way do the imports of the router point?"}]


def module_of(filename: str) -> str | None:
    path = os.path.realpath(filename)
    if not path.startswith(ROUTER_DIR):
        return None
    return "router." + path[len(ROUTER_DIR):].removesuffix(".py").replace(os.sep, ".")


class HopTrace:
    """The profiler: router-module calls and the hops between modules, until `stop()`."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()  # module -> calls
        # (caller module, callee module) -> hops
        self.edges: collections.Counter[tuple[str, str]] = collections.Counter()
        # (B, ..., A, B): A calls back into B, below it on the stack
        self.bounces: collections.Counter[tuple[str, ...]] = collections.Counter()
        self._modules: dict[str, str | None] = {}

    def _module(self, code) -> str | None:
        name = code.co_filename
        if name not in self._modules:
            self._modules[name] = module_of(name)
        return self._modules[name]

    def _router_callers(self, frame, limit: int = 64) -> list[str]:
        """The router modules below `frame` on its stack, nearest first, repeats collapsed."""
        out: list[str] = []
        frame = frame.f_back
        while frame is not None and len(out) < limit:
            module = self._module(frame.f_code)
            if module is not None and (not out or out[-1] != module):
                out.append(module)
            frame = frame.f_back
        return out

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = self._module(frame.f_code)
        if callee is None:
            return
        self.calls[callee] += 1
        callers = self._router_callers(frame)
        if not callers or callers[0] == callee:
            return
        self.edges[callers[0], callee] += 1
        if callee in callers:
            self.bounces[tuple(reversed(callers[: callers.index(callee) + 1])) + (callee,)] += 1

    def start(self) -> None:
        sys.setprofile(self.profile)

    def stop(self) -> None:
        sys.setprofile(None)

    def summary(self) -> dict:
        return {"modules": len(self.calls), "hops": sum(self.edges.values()), "bounces": sum(self.bounces.values()),
                "calls": sum(self.calls.values()),
                "edges": [f"{a} -> {b}: {n}" for (a, b), n in sorted(self.edges.items())],
                "bounce_edges": [f"{' -> '.join(path)}: {n}" for path, n in sorted(self.bounces.items())],
                "module_calls": dict(sorted(self.calls.items()))}


def stub_engine(trace: dict) -> web.Application:
    """An engine that speaks kvroute's control API; its completions handler ends the trace."""
    from kvroute.router.contract.protocol import hash_seed
    from kvroute.router.contract.tokenizer import load_tokenizer

    info = {"instance_id": "e0", "model": "kvroute-tiny", "block_size": 16, "hash_seed": hash_seed("kvroute-tiny"),
            "tokenizer": load_tokenizer().fingerprint, "role": "both"}
    load = {"instance": "e0", "running": 0, "waiting": 0, "kv_used_blocks": 0, "kv_total_blocks": 64,
            "queued_prefill_tokens": 0}

    async def answer(request: web.Request) -> web.StreamResponse:
        if trace.get("tracer") is not None:
            trace.pop("tracer").stop()
        body = await request.json()
        chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}}]}\n\n'
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(chunk + b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})

    async def events(_):
        await asyncio.sleep(60)  # a long poll that holds: no feed task wakes during the trace
        return web.json_response({"instance": "e0", "epoch": 1, "seq": 0, "resync": False, "events": []})

    app = web.Application()
    def reply(answer: dict):
        async def handler(_: web.Request) -> web.Response:
            return web.json_response(answer)
        return handler

    app.router.add_get("/kv/info", reply(info))
    app.router.add_get("/health", reply({"status": "ok"}))
    app.router.add_get("/load", reply(load))
    app.router.add_get("/kv/snapshot", reply({"instance": "e0", "epoch": 1, "seq": 0, "tiers": {"device": []}}))
    app.router.add_get("/kv/events", events)
    app.router.add_post("/v1/chat/completions", answer)
    return app


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    from kvroute.router.contract.connections import GuardedRunner
    from kvroute.router.contract.serve import bind_socket

    runner = GuardedRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = bind_socket("127.0.0.1", 0)
    await web.SockSite(runner, sock=sock).start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def run(args) -> dict:
    from kvroute.router.service.app import CLUSTER, create_app
    from kvroute.router.service.config import RouterConfig

    trace: dict = {}
    engine, engine_url = await serve(stub_engine(trace))
    config = RouterConfig(engines=(engine_url,), port=0, policy="kv_aware",
                          load_interval_s=30.0, health_interval_s=30.0, seed=0)
    app = create_app(config)
    router, url = await serve(app)
    body = {"model": "kvroute-tiny", "messages": PROMPT, "max_tokens": 4, "stream": args.stream}
    try:
        for _ in range(100):
            if all(i.routable for i in app[CLUSTER].instances):
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                async with http.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
            tracer = trace["tracer"] = HopTrace()
            tracer.start()
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                status = r.status
            tracer.stop()
    finally:
        await router.cleanup()
        await engine.cleanup()
    if status != 200:
        raise SystemExit(f"the traced request failed: HTTP {status}")
    return {"stream": args.stream, **tracer.summary()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stream", action="store_true", help="trace a streamed chat completion (default: whole)")
    p.add_argument("--out", default=None, help="write the result as JSON")
    p.add_argument("--edges", action="store_true", help="print every edge and bounce")
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(f"{result['modules']} router modules, {result['hops']} module-to-module hops, "
          f"{result['bounces']} A->...->A bounces ({result['calls']} calls) before the engine sees a byte")
    if args.edges:
        print("\n".join(result["edges"] + ["bounces:"] + result["bounce_edges"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
