"""Router benchmarks: decision time, and added latency / throughput over loopback.

    python tools/bench_router.py decision --out decision.json
    python tools/bench_router.py latency --out latency.json [--requests 2000] [--concurrency 16]

decision: the router's own prepare (limits, tokenize, hash) and decide (index lookup, candidates,
kv_aware scoring, on_routed), in process: 8k- and 32k-token chats whose system prompt was seen
before, never-seen 8k-token completions (against the tokenizer alone), memory and Redis index at
64 instances; token-id prompts at 64 and 1,024 instances.
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


def make_router(tok, index, n_inst: int, max_model_len: int = 131072):
    from router.cluster import Cluster
    from router.config import RouterConfig
    from router.instance import EngineInfo
    from router.metrics import RouterMetrics
    from router.policies import make_policy
    from router.protocol import hash_seed
    from router.routing import Router

    model = "kvroute-tiny"
    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(n_inst))
    cluster = Cluster(RouterConfig(engines=urls), index, tok.fingerprint, RouterMetrics())
    for i, inst in enumerate(cluster.instances):
        inst.info = EngineInfo(f"e{i}", model, 16, hash_seed(model), tok.fingerprint, max_model_len=max_model_len,
                               vocab_size=tok.vocab_size)
        inst.healthy = inst.reachable = True
    cluster.check_compatibility()
    return Router(cluster, make_policy("kv_aware"), tok, RouterMetrics(), "kv_aware")


async def hold_prefixes(index, tok, n_inst: int, ids: list[int], holders: int) -> None:
    """`holders` instances hold growing shares of the prompt's prefix; the rest hold nothing."""
    from router.protocol import block_hashes, hash_seed

    hashes = block_hashes(ids, 16, hash_seed("kvroute-tiny"))
    for i in range(holders):
        await index.add(f"e{i}", "device", hashes[: len(hashes) * (i + 1) // holders])


async def time_decisions(router, bodies, kind: str) -> tuple[list[float], list[float]]:
    """Per body: (prepare = limits + tokenize + hash, decide = lookup + candidates + score), seconds."""
    prep, dec = [], []
    for body in bodies:
        t0 = time.perf_counter()
        prepared = await router.prepare(body, kind)
        t1 = time.perf_counter()
        choice = await router.decide(prepared, record=True)
        dec.append(time.perf_counter() - t1)
        prep.append(t1 - t0)
        router.policy.on_finished(prepared.route, choice.instance.id)
    return prep, dec


def scenario(name, index_name, n_inst, tokens, prep, dec, alone=None) -> dict:
    total = [a + b for a, b in zip(prep, dec)]
    row = {"scenario": name, "index": index_name, "instances": n_inst, "prompt_tokens": tokens,
           "median_ms": statistics.median(total) * 1e3, "p99_ms": pct(total, 0.99) * 1e3,
           "prepare_median_ms": statistics.median(prep) * 1e3, "decide_median_ms": statistics.median(dec) * 1e3}
    if alone is not None:
        row["tokenizer_alone_median_ms"] = statistics.median(alone) * 1e3
    print(f"{name:<34} {index_name:<6} {n_inst:>5} inst {tokens:>6} tok: median {row['median_ms']:.3f} ms "
          f"(prepare {row['prepare_median_ms']:.3f} + decide {row['decide_median_ms']:.3f}), "
          f"p99 {row['p99_ms']:.3f}" + (f", tokenizer alone {row['tokenizer_alone_median_ms']:.3f} ms"
                                         if alone else ""), flush=True)
    return row


async def decision(args) -> dict:
    from router.index import make_index
    from router.tokenizer import DATA_DIR, load_tokenizer

    redis = RedisServer()
    rows = []
    try:
        for index_name in ("memory", "redis"):
            for n_tokens in (8192, 32768):  # a chat whose long system prompt was seen before
                tok = load_tokenizer(DATA_DIR)  # fresh cache
                index = make_index(index_name, url=redis.url)
                router = make_router(tok, index, 64)
                system = {"role": "system", "content": text_of(n_tokens, tok)}
                first = [system, {"role": "user", "content": "question 0"}]
                await hold_prefixes(index, tok, 64, tok.encode_chat(first), 8)
                await router.prepare({"messages": first, "max_tokens": 1}, "chat")  # the system prompt is seen
                bodies = [{"messages": [system, {"role": "user", "content": f"question {i} about caches"}],
                           "max_tokens": 1} for i in range(args.reps)]
                prep, dec = await time_decisions(router, bodies, "chat")
                rows.append(scenario("chat, system prompt seen before", index_name, 64,
                                     len(tok.encode_chat(bodies[0]["messages"])), prep, dec))
                await index.close()
            tok = load_tokenizer(DATA_DIR)
            index = make_index(index_name, url=redis.url)
            router = make_router(tok, index, 64)
            texts = [f"fresh prompt {i}: " + text_of(8192, tok) for i in range(args.reps)]
            alone = []
            for t in texts:
                t0 = time.perf_counter()
                tok.backend.encode(t)
                alone.append(time.perf_counter() - t0)
            prep, dec = await time_decisions(router, [{"prompt": t, "max_tokens": 1} for t in texts], "completion")
            rows.append(scenario("completion, never seen", index_name, 64, len(tok.encode(texts[0])), prep, dec,
                                 alone))
            await index.close()
        for n_inst in (64, 1024):  # a 1k-token prompt, holders among many instances (memory index)
            tok = load_tokenizer(DATA_DIR)
            index = make_index("memory")
            router = make_router(tok, index, n_inst)
            base = text_of(1024, tok)
            await hold_prefixes(index, tok, n_inst, tok.encode(base), 8)
            bodies = [{"prompt": [*tok.encode(base), 5 + i % 50, 6, 7], "max_tokens": 1} for i in range(args.reps)]
            prep, dec = await time_decisions(router, bodies, "completion")
            rows.append(scenario("token ids, 8 holders", "memory", n_inst, len(bodies[0]["prompt"]), prep, dec))
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
