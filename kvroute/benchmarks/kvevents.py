"""The router's ZeroMQ KV event path: decoding, subscriber throughput, publish -> index lag.

    python -m kvroute.benchmarks.kvevents decode                 # msgspec (typed) vs msgpack (+ checks)
    python -m kvroute.benchmarks.kvevents throughput [--json F]  # blocks/s into the index, on one core
    python -m kvroute.benchmarks.kvevents lag [--json F]         # publish -> applied, p50 / p99

Throughput and lag run the router's own subscriber, BlockMap and memory index in this
process, pinned to one core, against a publisher process on the other core (vLLM's format,
pre-encoded, so the publisher is never the bottleneck). Blocks are 16 tokens (vLLM) or
single-token pages (SGLang, aggregated 16 to a router block); each batch also removes the
blocks stored a while before, so the maps stay bounded as in a running engine.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import os
import random
import statistics
import sys
import time
import timeit

import msgpack

from kvroute.benchmarks.results import write_json
from kvroute.router.contract.kv_encode import BatchEncoder
from kvroute.router.contract.kv_wire import BatchDecoder
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.fleet.instance import EngineInfo, Instance
from kvroute.router.index.memory import MemoryIndex
from kvroute.router.kvevents.follower import ZmqFollower
from kvroute.router.kvevents.sources import EventSource

SEED = hash_seed("m")


def make_payloads(encoding: str, batches: int, blocks_per_batch: int, page: int, chains: int = 64,
                  remove_after: int = 32) -> list[bytes]:
    """Chained stores across `chains` prompts, each batch removing what was stored `remove_after` batches ago."""
    rng = random.Random(0)
    enc = BatchEncoder(encoding)
    heads: list = [None] * chains
    history: list[list[int]] = []
    next_hash = 1 << 63
    out = []
    for i in range(batches):
        c = i % chains
        n = blocks_per_batch * (16 // page)  # engine blocks for `blocks_per_batch` router blocks
        hashes = list(range(next_hash, next_hash + n))
        next_hash += n
        tokens = [rng.randrange(5, 32000) for _ in range(n * page)]
        events: list = [enc.stored(hashes, heads[c], tokens, page)]
        heads[c] = hashes[-1]
        history.append(hashes)
        if i >= remove_after:
            events.append(enc.removed(history[i - remove_after]))
        out.append(enc.encode(time.time(), events))
    return out


def publisher(endpoint_q, go, payloads: list[bytes], rate: float, core: int) -> None:
    import zmq

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind("tcp://127.0.0.1:*")
    endpoint_q.put(pub.getsockopt_string(zmq.LAST_ENDPOINT))
    pub.recv()  # the subscription
    go.wait()
    start = time.perf_counter()
    for seq, payload in enumerate(payloads):
        if rate:
            delay = start + seq / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            payload = _restamp(payload)
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    time.sleep(1.0)
    pub.close(linger=0)
    ctx.term()


def _restamp(payload: bytes) -> bytes:
    """The batch with `ts` = now (lag is measured from the publish time)."""
    obj = msgpack.unpackb(payload)
    if isinstance(obj, list):  # a positional batch: [ts, events, data_parallel_rank]
        obj[0] = time.time()
    else:
        obj["ts"] = time.time()
    return msgpack.packb(obj)


async def consume(payloads: list[bytes], rate: float = 0.0) -> dict:
    ctx = multiprocessing.get_context("spawn")
    endpoint_q, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=publisher, args=(endpoint_q, go, payloads, rate, 1), daemon=True)
    proc.start()
    endpoint = await asyncio.to_thread(endpoint_q.get, True, 30)
    inst = Instance("http://bench")
    inst.info = EngineInfo("e1", "m", 16, SEED, "fp")
    index = MemoryIndex()
    from prometheus_client import CollectorRegistry

    follower = ZmqFollower([inst], index, {inst.url: (EventSource(endpoint),)}, "", 2.0, CollectorRegistry())
    feed = follower.feeds[0]
    lags: list[float] = []
    on_batch = feed.on_batch

    async def timed(seq, batch):
        await on_batch(seq, batch)
        lags.append(time.time() - batch.ts)

    feed.on_batch = timed  # type: ignore[method-assign]  # the subscriber looks the sink's method up per batch
    task = asyncio.create_task(follower.run())
    stats = feed.subscribers[0].stats
    deadline = time.monotonic() + 30.0  # a publisher that died or never started must not hang the bench
    while stats.state != "live":
        if time.monotonic() > deadline or not proc.is_alive():
            raise SystemExit("kvevents: the subscriber never went live (publisher gone?)")
        await asyncio.sleep(0.01)
    go.set()
    while stats.batches == 0:
        if time.monotonic() > deadline:
            raise SystemExit("kvevents: no batch arrived from the publisher")
        await asyncio.sleep(0)
    t0, c0 = time.perf_counter(), time.process_time()
    while stats.batches < len(payloads) and time.perf_counter() - t0 < 120:
        await asyncio.sleep(0.001)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    follower.close()
    proc.join(5)
    return {"batches": stats.batches, "gaps": stats.gaps, "wall_s": wall, "cpu_s": cpu, "lags": lags,
            "index_entries": index.size_sync(), "engine_blocks_mapped": len(feed.block_map)}


def bench_decode() -> dict:
    """Decode + validate a batch: msgspec's typed decoder vs msgpack.unpackb and the same checks in Python."""
    results = {}
    for encoding in ("array", "map"):
        for blocks in (1, 16):
            payload = make_payloads(encoding, 1, blocks, 16)[0]
            dec = BatchDecoder()
            t_spec = min(timeit.repeat(functools.partial(dec.decode, payload), number=2000, repeat=5)) / 2000
            t_pack = min(timeit.repeat(functools.partial(_msgpack_checked, payload), number=2000, repeat=5)) / 2000
            t_raw = min(timeit.repeat(functools.partial(msgpack.unpackb, payload), number=2000, repeat=5)) / 2000
            key = f"{encoding}, {blocks} blocks"
            results[key] = {"msgspec_typed_us": t_spec * 1e6, "msgpack_checked_us": t_pack * 1e6,
                            "msgpack_unchecked_us": t_raw * 1e6}
            print(f"{key:>18}: msgspec typed {t_spec * 1e6:6.1f} us | msgpack + checks {t_pack * 1e6:6.1f} us "
                  f"| msgpack alone {t_raw * 1e6:6.1f} us")
    return results


def _msgpack_checked(payload: bytes):
    """The validation the typed decoder does, done by hand after an untyped decode."""
    obj = msgpack.unpackb(payload)
    events = obj["events"] if isinstance(obj, dict) else obj[1]
    for ev in events:
        fields = ev if isinstance(ev, dict) else dict(zip(("type", "block_hashes", "parent_block_hash", "token_ids",
                                                           "block_size"), ev))
        hashes = fields["block_hashes"]
        if not isinstance(hashes, list) or not all(isinstance(h, (int, bytes)) for h in hashes):
            raise ValueError("bad hashes")
        tokens = fields.get("token_ids") or []
        if not all(isinstance(t, int) and 0 <= t < 2**32 for t in tokens):
            raise ValueError("bad tokens")
    return obj


def run_throughput(args) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    results = {}
    for label, page, encoding in (("vLLM 16-token blocks, map", 16, "map"),
                                  ("vLLM 16-token blocks, array", 16, "array"),
                                  ("SGLang page size 1, array", 1, "array")):
        runs = []
        for _ in range(args.repeat):
            payloads = make_payloads(encoding, args.batches, args.blocks_per_batch, page)
            r = asyncio.run(consume(payloads))
            blocks = r["batches"] * args.blocks_per_batch
            runs.append({"blocks_per_s_wall": blocks / r["wall_s"], "blocks_per_cpu_s": blocks / r["cpu_s"],
                         "gaps": r["gaps"], "batches": r["batches"]})
        best = {k: statistics.median(x[k] for x in runs) for k in ("blocks_per_s_wall", "blocks_per_cpu_s")}
        results[label] = {"runs": runs, **best}
        print(f"{label:>28}: {best['blocks_per_s_wall']:9,.0f} router blocks/s wall, "
              f"{best['blocks_per_cpu_s']:9,.0f} per CPU-second (median of {args.repeat}; "
              f"{args.batches} batches x {args.blocks_per_batch} blocks; gaps {[x['gaps'] for x in runs]})")
    return results


def run_lag(args) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    payloads = make_payloads("map", args.lag_batches, 4, 16)
    r = asyncio.run(consume(payloads, rate=args.rate))
    lags = sorted(r["lags"])
    q = statistics.quantiles(lags, n=100)
    out = {"batches": len(lags), "rate": args.rate, "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3,
           "max_ms": lags[-1] * 1e3}
    print(f"lag publish -> index at {args.rate:.0f} batches/s (4 blocks each), {len(lags)} batches: "
          f"p50 {out['p50_ms']:.2f} ms, p99 {out['p99_ms']:.2f} ms, max {out['max_ms']:.2f} ms")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("decode", "throughput", "lag", "all"))
    p.add_argument("--batches", type=int, default=20_000)
    p.add_argument("--blocks-per-batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--lag-batches", type=int, default=5_000)
    p.add_argument("--rate", type=float, default=500.0, help="lag: batches per second")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    out = {}
    if args.what in ("decode", "all"):
        out["decode"] = bench_decode()
    if args.what in ("throughput", "all"):
        out["throughput"] = run_throughput(args)
    if args.what in ("lag", "all"):
        out["lag"] = run_lag(args)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
