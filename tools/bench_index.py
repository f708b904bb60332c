"""Lookup latency of the block index backends: memory vs Redis (a real redis-server).

    python tools/bench_index.py --out bench_index.json

For each chain length (64 and 512 blocks: 1k and 8k tokens at block size 16) and each
instance count (4 and 64), every instance holds a prefix of the chain:

    nested   instance k holds the first ceil(n * (k+1) / I) blocks, its first half on
             device, the rest on host: holder maps change only where a prefix ends
    striped  every instance holds the whole chain, device and host alternating per block
             (offset by k): every block's holder map differs (worst case for the memory
             backend's run skipping)

and, to size the index like a busy cluster, --background unrelated blocks per instance.
Times one `await index.lookup(chain)` --repeats times after a warm-up; Redis is started
with tests.redis_server.RedisServer unless --redis URL is given (that db's keys under
the bench prefix are overwritten).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # for tests.redis_server

from kvroute.router.contract.protocol import TIERS
from kvroute.router.index import make_index


def layout_holdings(layout: str, n: int, num_instances: int):
    """Yields (instance, tier, blocks as chain positions) to add."""
    for k in range(num_instances):
        inst = f"e{k}"
        if layout == "nested":
            held = -(-n * (k + 1) // num_instances)
            yield inst, "device", range(held // 2)
            yield inst, "host", range(held // 2, held)
        else:
            yield inst, "device", range(k % 2, n, 2)
            yield inst, "host", range(1 - k % 2, n, 2)


async def fill(index, layout: str, chain: list[int], num_instances: int, background: int, rng) -> None:
    for inst, tier, positions in layout_holdings(layout, len(chain), num_instances):
        await index.add(inst, tier, [chain[i] for i in positions])
    for k in range(num_instances):
        await index.add(f"e{k}", rng.choice(TIERS), [rng.getrandbits(64) for _ in range(background)])


async def time_lookups(index, chain: list[int], repeats: int) -> list[float]:
    for _ in range(min(50, repeats)):
        await index.lookup(chain)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        await index.lookup(chain)
        samples.append(time.perf_counter() - start)
    return samples


async def bench_case(backend: str, options: dict, layout: str, n: int, num_instances: int, args) -> dict:
    rng = random.Random(n * 1000 + num_instances)
    chain = [rng.getrandbits(64) for _ in range(n)]
    index = make_index(backend, **options)
    try:
        for k in range(num_instances):
            await index.clear(f"e{k}")
        await fill(index, layout, chain, num_instances, args.background, rng)
        result = await index.lookup(chain)
        matched = sum(m.blocks for m in result.values())
        samples = sorted(await time_lookups(index, chain, args.repeats))
        for k in range(num_instances):
            await index.clear(f"e{k}")
    finally:
        await index.close()
    return {
        "backend": backend,
        "layout": layout,
        "blocks": n,
        "instances": num_instances,
        "matched_blocks": matched,
        "repeats": len(samples),
        "median_us": statistics.median(samples) * 1e6,
        "p99_us": samples[min(len(samples) - 1, int(0.99 * len(samples)))] * 1e6,
    }


async def run(args, redis_url: str) -> list[dict]:
    backends = {"memory": {}, "redis": {"url": redis_url, "prefix": "kvroute:bench:"}}
    rows = []
    for layout in args.layouts:
        for n in args.blocks:
            for num_instances in args.instances:
                for backend in args.backends:
                    rows.append(await bench_case(backend, backends[backend], layout, n, num_instances, args))
                    print_row(rows[-1])
    return rows


HEADER = f"{'backend':8} {'layout':8} {'blocks':>6} {'inst':>5} {'matched':>8} {'median_us':>10} {'p99_us':>10}"


def print_row(r: dict) -> None:
    print(
        f"{r['backend']:8} {r['layout']:8} {r['blocks']:6d} {r['instances']:5d} {r['matched_blocks']:8d} "
        f"{r['median_us']:10.1f} {r['p99_us']:10.1f}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench_index.json", help="where to write the JSON results")
    p.add_argument("--blocks", type=int, nargs="+", default=[64, 512])
    p.add_argument("--instances", type=int, nargs="+", default=[4, 64])
    p.add_argument("--layouts", nargs="+", choices=["nested", "striped"], default=["nested", "striped"])
    p.add_argument("--backends", nargs="+", choices=["memory", "redis"], default=["memory", "redis"])
    p.add_argument("--repeats", type=int, default=1000)
    p.add_argument("--background", type=int, default=1000, help="unrelated blocks per instance")
    p.add_argument("--redis", default=None, help="use this Redis instead of starting a redis-server")
    args = p.parse_args()

    server = None
    if args.redis is None and "redis" in args.backends:
        from kvroute.loadgen.redis_server import RedisServer

        server = RedisServer()
    try:
        print(HEADER)
        rows = asyncio.run(run(args, args.redis or (server.url if server else "")))
    finally:
        if server is not None:
            server.stop()
    meta = {"python": platform.python_version(), "machine": platform.machine(), "args": vars(args)}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
