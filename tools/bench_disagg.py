"""What the disaggregated path costs a short request, to choose --pd-min-uncached.

    python tools/bench_disagg.py --out bench_disagg.json [--reps 5]

One prefill and one decode torch engine (1 thread each) behind two routers: one that
disaggregates every request (--pd-min-uncached 0) and one that never does (a huge
threshold: the decode engine prefills in place). Sends the same streamed requests, one
at a time on an idle cluster, for several prompt lengths, and reports median TTFT and
E2E of both paths plus the decode engine's pull time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import aiohttp

sys.path.insert(0, ".")
from kvroute.loadgen.local_cluster import free_port  # noqa: E402
from tools.procs import spawn, wait_ready  # noqa: E402

LENGTHS = (64, 128, 256, 512, 1024)


async def timed(session, url, prompt, max_tokens) -> tuple[float, float]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    ttft = None
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {"):
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0


async def pull_stats(session, url) -> tuple[float, float]:
    vals = {}
    async with session.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            for name in ("kvroute_engine_kv_pull_seconds_sum", "kvroute_engine_kv_pull_seconds_count"):
                if line.startswith(name):
                    vals[name] = float(line.rsplit(" ", 1)[1])
    return vals.get("kvroute_engine_kv_pull_seconds_sum", 0.0), vals.get("kvroute_engine_kv_pull_seconds_count", 0.0)


async def main(args) -> int:
    pp, dp, r_pd, r_local = (free_port() for _ in range(4))
    engines = [spawn(["engine", "--port", str(pp), "--instance-id", "p", "--role", "prefill", "--num-threads", "1"]),
               spawn(["engine", "--port", str(dp), "--instance-id", "d", "--role", "decode", "--num-threads", "1"])]
    urls = ["--engine", f"http://127.0.0.1:{pp}", "--engine", f"http://127.0.0.1:{dp}"]
    procs = engines
    rows = []
    try:
        async with aiohttp.ClientSession() as session:
            for port in (pp, dp):
                await wait_ready(session, f"http://127.0.0.1:{port}")
            procs += [spawn(["router", "--port", str(r_pd), "--pd-min-uncached", "0", *urls]),
                      spawn(["router", "--port", str(r_local), "--pd-min-uncached", "1000000", *urls])]
            for port in (r_pd, r_local):
                await wait_ready(session, f"http://127.0.0.1:{port}")
            await asyncio.sleep(1.0)  # routers see both engines
            rng = random.Random(0)
            d_url = f"http://127.0.0.1:{dp}"
            for n in LENGTHS:
                res = {"pd": [], "local": [], "pull": []}
                for _ in range(args.reps):
                    for name, port in (("pd", r_pd), ("local", r_local)):
                        prompt = [rng.randrange(5, 8192) for _ in range(n)]  # fresh: nothing cached
                        before = await pull_stats(session, d_url)
                        res[name].append(await timed(session, f"http://127.0.0.1:{port}", prompt, 8))
                        after = await pull_stats(session, d_url)
                        if name == "pd" and after[1] > before[1]:
                            res["pull"].append(after[0] - before[0])
                row = {"prompt_tokens": n,
                       "pd_ttft_ms": statistics.median(t for t, _ in res["pd"]) * 1e3,
                       "local_ttft_ms": statistics.median(t for t, _ in res["local"]) * 1e3,
                       "pd_e2e_ms": statistics.median(e for _, e in res["pd"]) * 1e3,
                       "local_e2e_ms": statistics.median(e for _, e in res["local"]) * 1e3,
                       "pull_ms": statistics.median(res["pull"]) * 1e3 if res["pull"] else None}
                rows.append(row)
                print(f"{n:>5} tokens: TTFT pd {row['pd_ttft_ms']:.1f} ms local {row['local_ttft_ms']:.1f} ms | "
                      f"E2E pd {row['pd_e2e_ms']:.1f} ms local {row['local_e2e_ms']:.1f} ms | "
                      f"pull {row['pull_ms'] or 0:.1f} ms", flush=True)
    finally:
        for p in reversed(procs):  # routers first, so they do not log the engines going away
            p.terminate()
            p.wait()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    sys.exit(asyncio.run(main(p.parse_args())))
