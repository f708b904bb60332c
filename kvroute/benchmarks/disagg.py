"""What the disaggregated path costs a short request, to choose --pd-min-uncached.

    python -m kvroute.benchmarks.disagg --out bench_disagg.json [--reps 5]

One prefill and one decode torch engine (1 thread each) behind two routers: one that
disaggregates every request (--pd-min-uncached 0) and one that never does (a huge
threshold: the decode engine prefills in place). Sends the same streamed requests, one
at a time on an idle cluster, for several prompt lengths, and reports median TTFT and
E2E of both paths plus the decode engine's pull time per request.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time

import aiohttp

from kvroute.benchmarks.results import reps_parser, write_json
from kvroute.loadgen.processes import Processes

LENGTHS = (64, 128, 256, 512, 1024)


async def timed(session, url, prompt, max_tokens) -> tuple[float, float]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    ttft = None
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {"):
                ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError(f"{url} answered HTTP {r.status} with no token")
    return ttft, time.perf_counter() - t0


async def pull_stats(session, url) -> tuple[float, float]:
    vals = {}
    async with session.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            for name in ("kvroute_engine_kv_pull_seconds_sum", "kvroute_engine_kv_pull_seconds_count"):
                if line.startswith(name):
                    vals[name] = float(line.rsplit(" ", 1)[1])
    return vals.get("kvroute_engine_kv_pull_seconds_sum", 0.0), vals.get("kvroute_engine_kv_pull_seconds_count", 0.0)


async def measure(reps: int) -> list[dict]:
    rows = []
    with Processes() as procs:
        threads = ("--num-threads", "1")
        prefill = procs.server("prefill", "engine", "--instance-id", "p", "--role", "prefill", *threads)
        decode = procs.server("decode", "engine", "--instance-id", "d", "--role", "decode", *threads)
        for url in (prefill, decode):
            await procs.wait_ready(url)
        engines = ("--engine", prefill, "--engine", decode)
        routers = {"pd": procs.server("router-pd", "router", "--pd-min-uncached", "0", *engines),
                   "local": procs.server("router-local", "router", "--pd-min-uncached", "1000000", *engines)}
        for url in routers.values():
            await procs.wait_ready(url)
        await asyncio.sleep(1.0)  # routers see both engines
        rng = random.Random(0)
        async with aiohttp.ClientSession() as session:
            for n in LENGTHS:
                rows.append(await length_row(session, routers, decode, n, reps, rng))
    return rows


async def length_row(session, routers: dict[str, str], decode: str, n: int, reps: int, rng) -> dict:
    """Median TTFT and E2E of `n`-token prompts through each router, and the decode engine's pull time."""
    res: dict[str, list] = {"pd": [], "local": [], "pull": []}
    for _ in range(reps):
        for name, url in routers.items():
            prompt = [rng.randrange(5, 8192) for _ in range(n)]  # fresh: nothing cached
            before = await pull_stats(session, decode)
            res[name].append(await timed(session, url, prompt, 8))
            after = await pull_stats(session, decode)
            if name == "pd" and after[1] > before[1]:
                res["pull"].append(after[0] - before[0])
    row = {"prompt_tokens": n,
           "pd_ttft_ms": statistics.median(t for t, _ in res["pd"]) * 1e3,
           "local_ttft_ms": statistics.median(t for t, _ in res["local"]) * 1e3,
           "pd_e2e_ms": statistics.median(e for _, e in res["pd"]) * 1e3,
           "local_e2e_ms": statistics.median(e for _, e in res["local"]) * 1e3,
           "pull_ms": statistics.median(res["pull"]) * 1e3 if res["pull"] else None}
    print(f"{n:>5} tokens: TTFT pd {row['pd_ttft_ms']:.1f} ms local {row['local_ttft_ms']:.1f} ms | "
          f"E2E pd {row['pd_e2e_ms']:.1f} ms local {row['local_e2e_ms']:.1f} ms | "
          f"pull {row['pull_ms'] or 0:.1f} ms", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    args = reps_parser(__doc__).parse_args(argv)
    write_json(args.out, asyncio.run(measure(args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
