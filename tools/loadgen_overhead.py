"""How much the load generator itself costs: drive an instant stub server and report client-side figures.

    python tools/loadgen_overhead.py [--rates 50,100,200,400] [--seconds 4] [--output-tokens 32]
                                     [--input-tokens 1088] [--concurrency 64] [--json FILE]

The stub (an aiohttp app on 127.0.0.1, in this process and event loop) streams
`--output-tokens` chunks with no delay, so every millisecond of TTFT and E2E
measured here is load generator + HTTP + stub overhead: an upper bound on what
loadgen adds to a real server's figures. Each rate runs open loop (Poisson) for
`--seconds`; a closed-loop run at `--concurrency` gives the most requests/s
this process can drive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvroute.loadgen.arrivals import ArrivalConfig  # noqa: E402
from kvroute.loadgen.runner import LoadConfig, run_load  # noqa: E402
from kvroute.loadgen.workloads import make_workload  # noqa: E402


def stub_app() -> web.Application:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        n = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt") or []
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-kvroute-instance": "stub"})
        await resp.prepare(request)
        chunk = b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
        for _ in range(n - 1):
            await resp.write(chunk)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "prompt_tokens_details": {"cached_tokens": 0}}
        last = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


async def measure(url: str, arrival: ArrivalConfig, n: int, args: argparse.Namespace) -> dict:
    workload = make_workload("random", seed=0, num_requests=n, input_tokens=args.input_tokens,
                             output_tokens=args.output_tokens)
    cpu0 = time.process_time()
    result = await run_load(LoadConfig(target=url, arrival=arrival), workload)
    cpu = time.process_time() - cpu0
    s = result.summary()
    return {"mode": arrival.describe(), "requests": s["requests"], "errors": s["errors"],
            "achieved_rps": s["throughput_rps"], "ttft_p50_ms": s["ttft_p50_s"] * 1e3,
            "ttft_p99_ms": s["ttft_p99_s"] * 1e3, "e2e_p50_ms": s["e2e_p50_s"] * 1e3,
            "send_lag_p99_ms": (s["send_lag_p99_s"] or 0.0) * 1e3, "cpu_ms_per_request": cpu / max(1, n) * 1e3}


async def main_async(args: argparse.Namespace) -> list[dict]:
    runner = web.AppRunner(stub_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    rows = []
    try:
        for rate in args.rates:
            rows.append(await measure(url, ArrivalConfig(rate=rate), max(20, int(rate * args.seconds)), args))
        n = max(200, args.concurrency * 20)
        rows.append(await measure(url, ArrivalConfig(concurrency=args.concurrency), n, args))
    finally:
        await runner.cleanup()
    return rows


def print_table(rows: list[dict]) -> None:
    cols = ["mode", "requests", "errors", "achieved_rps", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms",
            "send_lag_p99_ms", "cpu_ms_per_request"]
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in cols))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="50,100,200,400", help="comma-separated requests/s")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--input-tokens", type=int, default=1088)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    args.rates = [float(r) for r in args.rates.split(",") if r]
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        rows = runner.run(main_async(args))
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
