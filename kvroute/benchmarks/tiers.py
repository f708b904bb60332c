"""KV tier figures on this machine: the links, and the TTFT of a returning session by where its K/V is.

    python -m kvroute.benchmarks.tiers links --out tier_links.json   # fit latency + bandwidth of each link
    python -m kvroute.benchmarks.tiers ttft --out tier_ttft.json     # returning 3,072-token session, by tier

`links` moves whole blocks of the built-in model (32 KiB) in batches of 1 to 192:
host-to-device and device-to-host as the torch runner does (one gather/scatter
between two host tensors here: the "device" is CPU memory), and through the
engine's own store path -- the Redis store (a local redis-server: MGET / pipelined
SET) and the file store (one file per block, write + rename), entries encoded and
every read entry checked -- and fits seconds = latency + bytes / bandwidth over
the medians (least squares on relative error, so the small batches that show the
latency count as much as the large ones that show the bandwidth). These are
engine/kv/links.py's cpu-memcpy, cpu-redis and cpu-file (file reads come from the page
cache here: a cold NVMe read would be slower).

`ttft` runs one torch engine per case (tiny model, 1 thread, device pool of 256
blocks = 4,096 tokens) and, per repetition, sends a fresh 3,072-token session,
pushes it out of the device pool with two 2,048-token requests (except "device
hit"), waits 0.3 s (the store writes of those requests finish: they run in the
background and would otherwise share the CPU with the measured request), then
sends its next turn (the session + 64 new tokens) and times the first streamed
token. Cases: device hit, host hit (--host-blocks 1024), Redis-store hit
and file-store hit (no host pool: the store alone), recompute (device pool only).
Medians over --reps; the ratios are to the median recompute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import aiohttp

from kvroute.benchmarks.results import write_json
from kvroute.engine.kv.link_estimate import fit_link
from kvroute.engine.runners.device_costs import median_seconds
from kvroute.loadgen.processes import Processes
from kvroute.loadgen.redis_server import RedisServer

BATCHES = (1, 4, 16, 64, 192)
SESSION, QUESTION, FILLER = 3072, 64, 2048


def fit(points: list[tuple[int, float]]) -> dict:
    link = fit_link(points)  # relative residuals: small batches count too
    return {**link.to_dict(), "points": [{"bytes": int(a), "seconds": b} for a, b in points]}


def memcpy_links(reps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    shape = (2, 2, 16, 2, 64)  # layers, K/V, block size, KV heads, head dim: 32 KiB of float32
    device, host = torch.randn(1024, *shape), torch.zeros(1024, *shape)
    block = device[0].numel() * 4
    out = {}
    for name, src, dst in (("d2h", device, host), ("h2d", host, device)):
        points = []
        for n in BATCHES:
            ids = torch.randperm(1024)[:n]
            slots = torch.randperm(1024)[:n]
            points.append((n * block, median_seconds(copy_blocks(src, dst, ids, slots), reps)))
        out[name] = fit(points)
    return out


def copy_blocks(src, dst, ids, slots):
    """One gather of `ids` out of `src` scattered into `slots` of `dst`, as a call to time."""
    return lambda: dst.index_copy_(0, slots, src.index_select(0, ids))


async def store_links(url: str, reps: int, block: int) -> dict:
    """The engine's own store path: `put_many` of encoded entries; `get_many` plus checking every entry."""
    from kvroute.engine.kv.store import make_store
    from kvroute.engine.kv.store_probe import store_points

    ns = "00000000000000a1"
    store = make_store(url, ns, timeout_s=10.0)
    try:
        points = await store_points(store, ns, block, BATCHES, reps)
    finally:
        await store.close()
    return {k: fit(v) for k, v in points.items()}


async def links(args) -> dict:
    block = 32768
    server, root = RedisServer(), tempfile.mkdtemp(prefix="kvroute-bench-")
    try:
        out = {"cpu-memcpy": memcpy_links(args.reps), "cpu-redis": await store_links(server.url, args.reps, block),
               "cpu-file": await store_links("file://" + root, args.reps, block)}
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    for name, dirs in out.items():
        for d, f in dirs.items():
            print(f"{name:11} {d:12} {f['bandwidth_bps'] / 1e9:6.2f} GB/s  latency {f['latency_s'] * 1e6:7.1f} us")
    return out


# -- TTFT of a returning session ------------------------------------------------------------

CASES = {  # name -> (engine flags, evict between turns)
    "device hit": ((), False),
    "host hit": (("--host-blocks", "1024"), True),
    "redis-store hit": (("--kv-store", "{redis}"), True),
    "file-store hit": (("--kv-store", "{file}"), True),
    "recompute": ((), True),
}


async def first_token(session, url, prompt) -> tuple[float, dict]:
    body = {"prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, usage = None, dict[str, Any]()
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    ttft = time.perf_counter() - t0
                usage = chunk.get("usage") or usage
    if ttft is None:
        raise RuntimeError(f"{url} answered HTTP {r.status} with no token")
    return ttft, usage


async def run_case(session, name, flags, evict, reps, rng) -> dict:
    with Processes() as procs:
        url = procs.server("engine", "engine", "--num-threads", "1", "--num-blocks", "256", "--log-level", "WARNING",
                           *flags)
        await procs.wait_ready(url)
        await first_token(session, url, [rng.randrange(5, 8000) for _ in range(FILLER)])  # warm up
        ttfts, cached = [], []
        for _ in range(reps):
            context = [rng.randrange(5, 8000) for _ in range(SESSION)]
            await first_token(session, url, context)
            await asyncio.sleep(0.3)  # write-through to the store finishes (off the TTFT path)
            if evict:
                for _ in range(2):
                    await first_token(session, url, [rng.randrange(5, 8000) for _ in range(FILLER)])
                await asyncio.sleep(0.3)  # the session comes back after a pause: background writes are done
            ttft, usage = await first_token(session, url, context + [rng.randrange(5, 8000) for _ in range(QUESTION)])
            ttfts.append(ttft)
            cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens_by_tier"))
    print(f"{name:16} TTFT median {statistics.median(ttfts) * 1e3:7.1f} ms  cached {cached[-1]}", flush=True)
    return {"ttft_median_s": statistics.median(ttfts), "ttft_s": ttfts, "cached_tokens_by_tier": cached}


async def ttft(args) -> dict:
    rng = random.Random(args.seed)
    redis, root = RedisServer(), tempfile.mkdtemp(prefix="kvroute-store-")
    out = {}
    try:
        async with aiohttp.ClientSession() as session:
            for name, (flags, evict) in CASES.items():
                flags = tuple(f.format(redis=redis.url, file="file://" + root) for f in flags)
                out[name] = await run_case(session, name, flags, evict, args.reps, rng)
    finally:
        redis.stop()
        shutil.rmtree(root, ignore_errors=True)
    base = out["recompute"]["ttft_median_s"]
    for name, row in out.items():
        row["over_recompute"] = row["ttft_median_s"] / base
        print(f"{name:16} {row['over_recompute']:.3f} x recompute")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("links", "ttft"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    result = asyncio.run(links(args) if args.what == "links" else ttft(args))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
