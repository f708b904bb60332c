"""KV-event feeds under hostile input: a router that follows one engine over ZeroMQ, fed by a
publisher this scenario controls (the engine itself answers requests and load as usual).

kv-feed-poison  deep nesting (RecursionError in the decoder), an oversized frame (ZMQ_MAXMSGSIZE),
                garbage payloads and frames: after each, a valid event must reach the index within
                POISON_APPLY_S (the feed never dies silently)
kv-feed-flood   BlockStored for far more blocks than the engine advertises: the instance's entries
                stay within the cap and the router's RSS grows by less than FLOOD_RSS_MB
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import zmq

from kvroute.loadgen.chaos.fleet import instances
from kvroute.loadgen.chaos.rows import Row
from kvroute.loadgen.chaos.rss import MB, read_memory
from kvroute.loadgen.chaos.scenario_base import Context, Outcome
from kvroute.loadgen.processes import free_port
from kvroute.router.contract.kv_encode import BatchEncoder
from kvroute.router.contract.kv_wire import MAX_MESSAGE_BYTES

POISON_APPLY_S = 1.0
FLOOD_RSS_MB = 50.0
FLOOD_CHUNK = 25  # flood batches sent before waiting for the router to take them in
FLOOD_PAUSE_S = 0.25
BS = 16


class _Publisher:
    """A ZeroMQ PUB socket speaking vLLM's format, numbering its batches."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.port = free_port()
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.seq = 0
        self.encoder = BatchEncoder("map")
        self.rng = random.Random(7)

    def send(self, payload: bytes, frames: list[bytes] | None = None) -> None:
        self.sock.send_multipart(frames or [b"kv", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def stored(self, blocks: int) -> tuple[bytes, list[int]]:
        """A batch of one BlockStored chain of fresh blocks (engine hashes random), and its tokens."""
        tokens = [self.rng.randrange(5, 8000) for _ in range(blocks * BS)]
        hashes = [self.rng.getrandbits(63) for _ in range(blocks)]
        return self.encoder.encode(time.time(), [self.encoder.stored(hashes, None, tokens, BS)]), tokens

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def deep_nesting_payload(depth: int = 100_000) -> bytes:
    """A batch whose one BlockStored event has `extra_keys` nested `depth` arrays deep (~100 KB): a
    decoder that recurses raises RecursionError on it."""
    head = b"\x93\xcb" + b"\x00" * 8 + b"\x91"  # [ts=0.0, [event], ...] as msgpack, then the event
    event = b"\x99\xabBlockStored\x91\x01\xc0\x90\x10\xc0\xa3GPU\xc0"  # 8 of its 9 fields
    return head + event + b"\x91" * depth + b"\x90" + b"\x00"  # extra_keys nested `depth` deep, dp rank 0


async def _feed_router(ctx: Context, name: str, pub: _Publisher):
    engine = ctx.fleet.engines[0]
    source = f"{engine.url}=tcp://127.0.0.1:{pub.port}"
    proc = ctx.fleet.spawn(name, ["router", "--engine", engine.url, "--kv-event-source", source,
                                  "--log-level", "WARNING"])
    deadline = time.monotonic() + ctx.config.wait_s
    while True:
        rows = await instances(ctx.session, proc.url)
        if rows and all(r["routable"] and (r["kv_events"] or {}).get("state") == "live" for r in rows.values()):
            return proc, engine.name
        if time.monotonic() > deadline or not proc.alive:
            raise RuntimeError(f"{name} did not come up with a live ZeroMQ feed; see {proc.log_path}")
        await asyncio.sleep(0.1)


async def _drained(ctx: Context, proc, engine: str, batches: int, limit_s: float = 30.0) -> None:
    """Wait (at most limit_s) until the router's feed has taken in `batches` batches."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        rows = await instances(ctx.session, proc.url) or {}
        sources = ((rows.get(engine) or {}).get("kv_events") or {}).get("sources") or [{}]
        if (sources[0].get("next_seq") or 0) >= batches:
            return
        await asyncio.sleep(0.05)


async def _cached(ctx: Context, proc, engine: str, tokens: list[int]) -> int:
    """The tokens of `tokens` the router's index credits `engine` with (POST /router/explain)."""
    try:
        async with ctx.session.post(proc.url + "/router/explain", json={"prompt": tokens, "max_tokens": 1},
                                    timeout=aiohttp.ClientTimeout(total=2)) as r:
            rows = (await r.json()).get("instances", []) if r.status == 200 else []
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return 0
    return next((row["cached_tokens"] for row in rows if row["instance"] == engine), 0)


async def _applied_within(ctx: Context, proc, engine: str, pub: _Publisher, limit_s: float) -> float | None:
    """Publish valid 2-block batches (again every 0.25 s: a reconnecting SUB misses some); seconds until
    the router's index credits the first one's blocks, None past limit_s."""
    t0 = time.monotonic()
    payload, tokens = pub.stored(2)
    resent = t0 - 1.0
    while time.monotonic() - t0 < limit_s:
        if await _cached(ctx, proc, engine, tokens) >= len(tokens):
            return time.monotonic() - t0
        if time.monotonic() - resent > 0.25:
            pub.send(payload)
            resent = time.monotonic()
        await asyncio.sleep(0.01)
    return None


class FeedPoison:
    name = "kv-feed-poison"
    summary = "poison a router's ZeroMQ KV feed (deep nesting, oversized frame, garbage); valid events still apply"

    async def run(self, ctx: Context) -> Outcome:
        out, pub = Outcome(), _Publisher()
        proc, engine = await _feed_router(ctx, "router-zmq-poison", pub)
        poisons = {"deep nesting": lambda: pub.send(deep_nesting_payload()),
                   "oversized frame": lambda: pub.send(b"\x00" * (MAX_MESSAGE_BYTES + 1)),
                   "garbage payload": lambda: pub.send(b"\xc1\xff not msgpack"),
                   "two frames": lambda: pub.send(b"", frames=[b"kv", b"\x00" * 8])}
        latencies: list[float] = []
        apply_s: dict[str, float] = {}
        try:
            for what, poison in poisons.items():
                poison()
                limit = POISON_APPLY_S
                took = await _applied_within(ctx, proc, engine, pub, limit)
                out.require(took is not None, "feed-survives", self.name,
                            f"no valid event applied within {limit:g}s after {what}")
                if took is not None:
                    latencies.append(took)
                    apply_s[what] = round(took, 3)
            rows = await instances(ctx.session, proc.url) or {}
            feed = rows.get(engine, {}).get("kv_events") or {}
        finally:
            proc.terminate(grace_s=5.0)
            pub.close()
        ms = sorted(1000 * t for t in latencies) or [0.0]
        out.rows.append(Row(scenario=self.name, traffic="poison -> router-zmq",
                            sent=len(poisons), ok=len(latencies), p50_ms=ms[len(ms) // 2],
                            p99_ms=ms[-1], detail={"apply_s": apply_s, "restarts": feed.get("restarts"),
                                                   "sources": feed.get("sources")}))
        return out


class FeedFlood:
    name = "kv-feed-flood"
    summary = "flood a router's ZeroMQ KV feed with far more blocks than the engine advertises; entries stay capped"

    async def run(self, ctx: Context) -> Outcome:
        out, pub = Outcome(), _Publisher()
        proc, engine = await _feed_router(ctx, "router-zmq-flood", pub)
        total = 100_000 if ctx.config.quick else 1_000_000
        per_batch = 1000
        try:
            rss_before = (read_memory(proc.pid) or (0, 0))[0]
            for sent in range(1, total // per_batch + 1):
                pub.send(pub.stored(per_batch)[0])
                if sent % FLOOD_CHUNK == 0:  # at the router's pace, leaving the fleet a share of the CPU
                    await _drained(ctx, proc, engine, sent)
                    await asyncio.sleep(FLOOD_PAUSE_S)
            await _drained(ctx, proc, engine, total // per_batch)
            took = await _applied_within(ctx, proc, engine, pub, POISON_APPLY_S)
            rss_after = (read_memory(proc.pid) or (0, 0))[0]
            rows = await instances(ctx.session, proc.url) or {}
        finally:
            proc.terminate(grace_s=5.0)
            pub.close()
        row = rows.get(engine, {})
        indexed, load = row.get("blocks_indexed", -1), row.get("load") or {}
        cap = 4 * int(load.get("kv_total_blocks") or 0)
        growth = (rss_after - rss_before) / MB
        out.require(took is not None, "feed-survives", self.name,
                    f"no valid event applied within {POISON_APPLY_S:g}s after the flood")
        out.require(0 <= indexed <= cap, "index-bounded", self.name, f"{indexed} blocks indexed, cap {cap}")
        out.require(growth < FLOOD_RSS_MB, "flood-memory", self.name, f"router RSS grew {growth:.0f} MB")
        out.rows.append(Row(scenario=self.name, traffic=f"{total:,} stored blocks -> router-zmq",
                            sent=total, ok=max(indexed, 0),
                            detail={"blocks_indexed": indexed, "cap": cap, "rss_growth_mb": round(growth, 1)}))
        return out
