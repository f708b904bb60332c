"""The Redis block index: plain data types, shared by every router pointed at one Redis.

Keys (a block hash is its 8 bytes, big-endian, in key names and fields; `inst@gen` names one
generation of an instance's entries):
    {prefix}b:{hash}          HASH  inst@gen -> tier bitmask (decimal; bit i set: held in TIERS[i])
    {prefix}i:{inst}@{gen}    HASH  hash -> the same bitmask: what that generation holds (lookups
                                    walk it; clear and GC cost its own blocks)
    {prefix}g:{inst}          HASH  gen (the current generation), epoch, seq, part, done: the watermark
    {prefix}gen               STRING  generation counter (generations are never reused)
    {prefix}live              ZSET  inst -> last time a router saw it alive
    {prefix}staging           ZSET  inst@gen being filled by a resync -> when it began
    {prefix}dead              SET   inst@gen generations left for garbage collection

Ordering. Several routers write the same events. Each write carries the event's
(epoch, seq) and, for a long block list split into chunks, its part; the script applies
it only if it is the next one after the instance's watermark, drops it as a duplicate
if at or below, and answers "gap" otherwise (that writer resyncs). So a lagging
replica's `stored` can never land after another's `removed`.

Resync is a generation swap: the snapshot is written into a fresh generation, which
lookups ignore, then one script makes it current, unless the watermark has moved past
the snapshot meanwhile (another replica kept the index current: the staged copy is
dropped). Lookups only count fields of current generations; old ones are deleted in
the background, a bounded chunk at a time (`maintain`).

Lifetime. Every router refreshes the last-seen time of the instances it can reach;
an instance that no router has seen for `ttl_s` is forgotten by whichever router
notices first. One replica losing sight of an engine never clears it for the others.

`lookup` of a whole chain is one EVALSHA round trip: the first block's holders, then
each current holder's blocks by HMGET on its generation hash, in growing chunks up to its
first missing block. Block hashes go to Redis packed in one argument, 8 bytes each (no
per-hash encoding in Python). Scripts build key names from the prefix server-side, so
this targets a standalone Redis >= 6.2 (HRANDFIELD) or one shard, not Redis Cluster. Any
`redis.exceptions.RedisError` is raised as `router.index.base.IndexUnavailable`; the client reconnects on the
next call.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Mapping, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

import kvroute.router.index.redis_scripts as lua
from kvroute.router.contract.cancellation import raise_if_cancelled
from kvroute.router.contract.protocol import TIERS, KVEvent
from kvroute.router.index.base import Applied, IndexUnavailable, PrefixMatch, event_owner
from kvroute.router.index.memory import tier_bit, to_match

WRITE_CHUNK = 4096  # blocks per write script: bounds how long one script blocks Redis
GC_CHUNK = 4096
_RESULT = {1: "applied", 0: "duplicate", -1: "gap", -2: "gap"}


def pack(blocks: Sequence[int]) -> bytes:
    """Block hashes as the scripts take them: 8 bytes each, big-endian, in one argument."""
    return struct.pack(f">{len(blocks)}Q", *blocks)


class RedisIndex:
    """A `BlockIndex` in Redis; see the module docstring for the key layout."""

    name = "redis"

    def __init__(self, url: str, prefix: str = "kvroute:idx:", timeout: float = 0.25) -> None:
        if not url:
            raise ValueError("the redis index needs a Redis URL (e.g. --redis redis://127.0.0.1:6379/0)")
        if timeout <= 0:
            raise ValueError(f"the redis index timeout must be positive seconds, got {timeout}")
        self.prefix = prefix
        self._redis = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout,
                                              socket_connect_timeout=timeout, retry_on_timeout=False)
        self._scripts = {name: self._redis.register_script(getattr(lua, name))
                         for name in ("APPLY", "STAGE_BEGIN", "STAGE_ADD", "STAGE_COMMIT", "CLEAR", "KEEPALIVE",
                                      "GC", "SIZE", "LOOKUP")}

    async def _call(self, script: str, *args):
        try:
            result = await self._scripts[script](args=(self.prefix, *args))
        except RedisError as e:
            raise IndexUnavailable(f"redis index unavailable: {type(e).__name__}: {e}") from e
        raise_if_cancelled()  # redis-py on Python 3.11 may have swallowed it (router/contract/cancellation.py)
        return result

    # -- ordered writes (what the router uses) ------------------------------------

    async def apply(self, event: KVEvent) -> Applied:
        bit = tier_bit(event.tier)
        blocks = event.blocks if event.type != "cleared" else ()
        owner = event_owner(event.instance, event.tier, event.store)
        if owner != event.instance:  # the instance's watermark moves; the blocks are the store's
            result = await self._apply_ordered(event, bit, ())
            if result == "applied":
                await self._unordered(owner, event.type, event.tier, blocks)
            return result
        return await self._apply_ordered(event, bit, blocks)

    async def _apply_ordered(self, event: KVEvent, bit: int, blocks: Sequence[int]) -> Applied:
        chunks = [blocks[i : i + WRITE_CHUNK] for i in range(0, len(blocks), WRITE_CHUNK)] or [()]
        results = []
        for part, chunk in enumerate(chunks):
            last = "1" if part == len(chunks) - 1 else "0"
            code = await self._call("APPLY", event.instance, event.epoch, event.seq, part, last, "1", event.type,
                                    bit, time.time(), pack(chunk))
            results.append(_RESULT[int(code)])
            if results[-1] == "gap":
                return "gap"
        return "applied" if "applied" in results else "duplicate"

    async def replace(self, instance: str, epoch: int, seq: int, tiers: Mapping[str, Sequence[int]]) -> bool:
        gen = int(await self._call("STAGE_BEGIN", instance, epoch, seq, time.time()))
        if not gen:
            return False
        for tier, blocks in tiers.items():
            bit = tier_bit(tier)
            for i in range(0, len(blocks), WRITE_CHUNK):
                await self._call("STAGE_ADD", instance, gen, bit, pack(blocks[i : i + WRITE_CHUNK]))
        return bool(int(await self._call("STAGE_COMMIT", instance, gen, epoch, seq, time.time())))

    async def clear(self, instance: str) -> None:
        await self._call("CLEAR", instance)

    async def maintain(self, alive: Iterable[str], ttl_s: float, budget: int = 16) -> None:
        """Refresh `alive`, forget instances nobody saw for `ttl_s`, delete some garbage."""
        now = time.time()
        await self._call("KEEPALIVE", now, now - ttl_s, *alive)
        for _ in range(budget):
            if not int(await self._call("GC", GC_CHUNK)):
                break

    # -- unordered writes (tools and tests that build an index by hand) ------------

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._unordered(instance, "stored", tier, blocks)

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._unordered(instance, "removed", tier, blocks)

    async def _unordered(self, instance: str, kind: str, tier: str, blocks: Sequence[int]) -> None:
        bit = tier_bit(tier)
        for i in range(0, len(blocks), WRITE_CHUNK):
            await self._call("APPLY", instance, 0, 0, 0, "1", "0", kind, bit, time.time(),
                             pack(blocks[i : i + WRITE_CHUNK]))

    # -- reads --------------------------------------------------------------------

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        if not blocks:
            return {}
        flat = await self._call("LOOKUP", pack(blocks))
        width = 1 + len(TIERS)
        return {flat[i]: to_match(flat[i + 1 : i + width]) for i in range(0, len(flat), width)}

    def lookup_now(self, blocks: Sequence[int]) -> None:
        return None  # a round trip to Redis: `lookup`

    async def size(self) -> int:
        return int(await self._call("SIZE"))

    async def close(self) -> None:
        await self._redis.aclose()
