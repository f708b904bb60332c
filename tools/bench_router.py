"""Router benchmarks: decision time, and added latency / throughput over loopback.

    python tools/bench_router.py decision --out decision.json
    python tools/bench_router.py latency --out latency.json [--requests 2000] [--concurrency 16]

decision: tokenize + hash + index lookup + kv_aware scoring, in process, for ~1k and
~8k-token text prompts with 4 and 64 instances that each hold part of the prompt's
prefix, memory and Redis index (a real redis-server is started).
latency: 4 sim engines (near-zero model time) behind a router process; the same closed
loop of short non-streamed completions sent to the router and straight to an engine;
router added latency = the difference of the medians (and p99s); with and without uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, ".")

import aiohttp  # noqa: E402

from tests.redis_server import RedisServer, free_port  # noqa: E402
from tools.procs import spawn, wait_ready, write_json  # noqa: E402

WORDS = "the router hashes blocks of tokens and sends each request where its prefix is cached".split()


def text_of(tokens_wanted: int, tokenizer) -> str:
    words, text = [], ""
    i = 0
    while True:
        words.append(WORDS[i % len(WORDS)] + str(i % 97))
        i += 1
        if i % 64 == 0:
            text = " ".join(words)
            if len(tokenizer.encode(text)) >= tokens_wanted:
                return text


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def decision(args) -> dict:
    from router.cluster import Cluster
    from router.config import RouterConfig
    from router.index import make_index
    from router.instance import EngineInfo
    from router.metrics import RouterMetrics
    from router.policies import make_policy
    from router.protocol import block_hashes, hash_seed
    from router.routing import Router
    from router.tokenizer import load_tokenizer

    tok = load_tokenizer()
    model = "kvroute-tiny"
    redis = RedisServer()
    rows = []
    try:
        for index_name in ("memory", "redis"):
            for n_inst in (4, 64):
                for n_tokens in (1024, 8192):
                    index = make_index(index_name, url=redis.url)
                    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(n_inst))
                    config = RouterConfig(engines=urls)
                    cluster = Cluster(config, index, tok.fingerprint, RouterMetrics())
                    for i, inst in enumerate(cluster.instances):
                        inst.info = EngineInfo(f"e{i}", model, 16, hash_seed(model), tok.fingerprint)
                        inst.healthy = inst.reachable = True
                    cluster.check_compatibility()
                    text = text_of(n_tokens, tok)
                    hashes = block_hashes(tok.encode(text), 16, hash_seed(model))
                    for i in range(n_inst):  # instance i holds a prefix of (i+1)/n of the prompt
                        await index.add(f"e{i}", "device", hashes[: len(hashes) * (i + 1) // n_inst])
                    router = Router(cluster, make_policy("kv_aware"), tok, RouterMetrics(), "kv_aware")
                    times = []
                    for _ in range(args.reps):
                        t0 = time.perf_counter()
                        prepared = await router.prepare({"prompt": text, "max_tokens": 1}, "completion")
                        choice = await router.decide(prepared, record=False)
                        times.append(time.perf_counter() - t0)
                    assert choice.instance.id == f"e{n_inst - 1}"
                    rows.append({"index": index_name, "instances": n_inst, "prompt_tokens": prepared.num_tokens,
                                 "blocks": len(hashes), "median_ms": statistics.median(times) * 1e3,
                                 "p99_ms": pct(times, 0.99) * 1e3})
                    print(f"{index_name:<7} {n_inst:>3} instances {prepared.num_tokens:>5} tokens: "
                          f"median {rows[-1]['median_ms']:.2f} ms  p99 {rows[-1]['p99_ms']:.2f} ms", flush=True)
                    for i in range(n_inst):
                        await index.clear(f"e{i}")
                    await index.close()
    finally:
        redis.stop()
    return {"decision": rows}


async def closed_loop(session, url, requests, concurrency) -> tuple[list[float], float]:
    lat: list[float] = []
    counter = iter(range(requests))

    async def worker(w):
        for i in counter:
            body = {"prompt": f"request {i} from worker {w}: say something short", "max_tokens": 1}
            t0 = time.perf_counter()
            async with session.post(url + "/v1/completions", json=body) as r:
                await r.read()
                assert r.status == 200, r.status
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return lat, requests / (time.perf_counter() - t0)


async def latency(args) -> dict:
    ports = [free_port() for _ in range(4)]
    engines = [spawn(["engine", "--backend", "sim", "--port", str(p), "--instance-id", f"e{i}", "--time-scale",
                      "0.001", "--log-level", "WARNING"]) for i, p in enumerate(ports)]
    results = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for p in ports:
                await wait_ready(session, f"http://127.0.0.1:{p}")
            for uv in ("1", "0"):
                rport = free_port()
                env = dict(os.environ, KVROUTE_NO_UVLOOP="0" if uv == "1" else "1")
                router = spawn(["router", "--port", str(rport), "--log-level", "WARNING",
                                *[a for p in ports for a in ("--engine", f"http://127.0.0.1:{p}")]], env=env)
                try:
                    rurl = f"http://127.0.0.1:{rport}"
                    await wait_ready(session, rurl)
                    await closed_loop(session, rurl, 200, args.concurrency)  # warm-up
                    via, via_rps = await closed_loop(session, rurl, args.requests, args.concurrency)
                    direct, direct_rps = await closed_loop(session, f"http://127.0.0.1:{ports[0]}", args.requests,
                                                           args.concurrency)
                finally:
                    router.terminate()
                    router.wait()
                name = "uvloop" if uv == "1" else "asyncio"
                results[name] = {
                    "router_p50_ms": statistics.median(via) * 1e3, "router_p99_ms": pct(via, 0.99) * 1e3,
                    "direct_p50_ms": statistics.median(direct) * 1e3, "direct_p99_ms": pct(direct, 0.99) * 1e3,
                    "added_p50_ms": (statistics.median(via) - statistics.median(direct)) * 1e3,
                    "added_p99_ms": (pct(via, 0.99) - pct(direct, 0.99)) * 1e3,
                    "router_rps": via_rps, "direct_rps": direct_rps,
                }
                r = results[name]
                print(f"{name:<8} router p50 {r['router_p50_ms']:.2f} ms p99 {r['router_p99_ms']:.2f} ms "
                      f"{r['router_rps']:.0f} req/s | engine direct p50 {r['direct_p50_ms']:.2f} ms "
                      f"p99 {r['direct_p99_ms']:.2f} ms {r['direct_rps']:.0f} req/s | added p50 "
                      f"{r['added_p50_ms']:.2f} ms p99 {r['added_p99_ms']:.2f} ms", flush=True)
    finally:
        for e in engines:
            e.terminate()
            e.wait()
    return {"latency": results, "concurrency": args.concurrency, "requests": args.requests}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("decision", "latency"))
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = asyncio.run(decision(args) if args.what == "decision" else latency(args))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
