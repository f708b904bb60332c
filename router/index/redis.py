"""The Redis block index: plain data types, shared by every router pointed at one Redis.

Keys (hashes are decimal strings of the unsigned 64-bit block hash):
    {prefix}b:{hash}      HASH  instance -> tier bitmask (decimal; bit i set: held in TIERS[i])
    {prefix}i:{instance}  SET   the block hashes the instance holds (so `clear` costs its own blocks)
    {prefix}n             STRING  number of (block, instance) entries, for `size`

Every write is one Lua script (atomic: a block's HASH field and the instance's SET never
disagree, and removing one tier keeps the others). `lookup` of a whole chain is one
EVALSHA round trip: the script walks the chain with one HGETALL per block (a linear
read of a small listpack hash, 2-3x faster than HMGET of the surviving instances),
counts each surviving instance's block under its best tier, and stops when none is left.

Scripts build key names from the prefix server-side, so this targets a standalone Redis
(or one shard), not Redis Cluster. Any `redis.exceptions.RedisError` (connection refused,
timeout, server loading, ...) is raised as `router.index.base.IndexUnavailable`; the client
reconnects on the next call, so a router can route on load alone and recover.
"""

from __future__ import annotations

from typing import Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from router.index.base import IndexUnavailable, PrefixMatch
from router.index.memory import tier_bit, to_match
from router.protocol import TIERS

ADD_LUA = """
local prefix, inst, tb = ARGV[1], ARGV[2], tonumber(ARGV[3])
local set, added = prefix .. 'i:' .. inst, 0
for i = 4, #ARGV do
  local key = prefix .. 'b:' .. ARGV[i]
  local m = redis.call('HGET', key, inst)
  if not m then
    redis.call('HSET', key, inst, tb)
    if redis.call('SADD', set, ARGV[i]) == 1 then added = added + 1 end
  elseif bit.band(tonumber(m), tb) == 0 then
    redis.call('HSET', key, inst, bit.bor(tonumber(m), tb))
  end
end
if added > 0 then redis.call('INCRBY', prefix .. 'n', added) end
return added
"""

REMOVE_LUA = """
local prefix, inst, tb = ARGV[1], ARGV[2], tonumber(ARGV[3])
local set, removed = prefix .. 'i:' .. inst, 0
for i = 4, #ARGV do
  local key = prefix .. 'b:' .. ARGV[i]
  local m = redis.call('HGET', key, inst)
  if m and bit.band(tonumber(m), tb) ~= 0 then
    local rest = bit.band(tonumber(m), bit.bnot(tb))
    if rest == 0 then
      redis.call('HDEL', key, inst)
      if redis.call('SREM', set, ARGV[i]) == 1 then removed = removed + 1 end
    else
      redis.call('HSET', key, inst, rest)
    end
  end
end
if removed > 0 then redis.call('DECRBY', prefix .. 'n', removed) end
return removed
"""

# Pops up to ARGV[3] of the instance's blocks; the client repeats until it returns 0 left.
CLEAR_LUA = """
local prefix, inst, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local set = prefix .. 'i:' .. inst
local popped = redis.call('SPOP', set, count)
for _, h in ipairs(popped) do redis.call('HDEL', prefix .. 'b:' .. h, inst) end
if #popped > 0 then redis.call('DECRBY', prefix .. 'n', #popped) end
return redis.call('SCARD', set)
"""

# Returns a flat array: instance, blocks in TIERS[0], TIERS[1], TIERS[2], instance, ...
# (three tiers, masks 1..7, are assumed here and in the write scripts.)
LOOKUP_LUA = """
local call, prefix = redis.call, ARGV[1] .. 'b:'
local best = {['1'] = 1, ['2'] = 2, ['3'] = 1, ['4'] = 3, ['5'] = 1, ['6'] = 2, ['7'] = 1}
local first = call('HGETALL', prefix .. ARGV[2])
if #first == 0 then return {} end
local names, alive, counts, mark, nalive = {}, {}, {}, {}, 0
for i = 1, #first, 2 do
  nalive = nalive + 1
  names[nalive], alive[first[i]], mark[nalive] = first[i], nalive, 2
  local base = (nalive - 1) * 3
  counts[base + 1], counts[base + 2], counts[base + 3] = 0, 0, 0
  local k = base + best[first[i + 1]]
  counts[k] = 1
end
for a = 3, #ARGV do
  local flat = call('HGETALL', prefix .. ARGV[a])
  local seen = 0
  for i = 1, #flat, 2 do
    local j = alive[flat[i]]
    if j then
      local k = (j - 1) * 3 + best[flat[i + 1]]
      counts[k] = counts[k] + 1
      mark[j] = a
      seen = seen + 1
    end
  end
  if seen < nalive then
    if seen == 0 then break end
    for name, j in pairs(alive) do
      if mark[j] ~= a then alive[name] = nil end
    end
    nalive = seen
  end
end
local out = {}
for j = 1, #names do
  local base = (j - 1) * 3
  out[#out + 1] = names[j]
  out[#out + 1] = counts[base + 1]
  out[#out + 1] = counts[base + 2]
  out[#out + 1] = counts[base + 3]
end
return out
"""

WRITE_CHUNK = 4096  # blocks per write script: bounds how long one script blocks Redis


class RedisIndex:
    """A `BlockIndex` in Redis; see the module docstring for the key layout."""

    name = "redis"

    def __init__(self, url: str, prefix: str = "kvroute:idx:", timeout: float = 1.0) -> None:
        if not url:
            raise ValueError("the redis index needs a Redis URL (e.g. --redis redis://127.0.0.1:6379/0)")
        if timeout <= 0:
            raise ValueError(f"the redis index timeout must be positive seconds, got {timeout}")
        self.prefix = prefix
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), retries=1),
        )
        self._add = self._redis.register_script(ADD_LUA)
        self._remove = self._redis.register_script(REMOVE_LUA)
        self._clear = self._redis.register_script(CLEAR_LUA)
        self._lookup = self._redis.register_script(LOOKUP_LUA)

    async def _call(self, script, *args):
        try:
            return await script(args=(self.prefix, *args))
        except RedisError as e:
            raise IndexUnavailable(f"redis index unavailable: {e}") from e

    async def _write(self, script, instance: str, tier: str, blocks: Sequence[int]) -> None:
        bit = tier_bit(tier)
        for i in range(0, len(blocks), WRITE_CHUNK):
            await self._call(script, instance, bit, *blocks[i : i + WRITE_CHUNK])

    async def add(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._write(self._add, instance, tier, blocks)

    async def remove(self, instance: str, tier: str, blocks: Sequence[int]) -> None:
        await self._write(self._remove, instance, tier, blocks)

    async def clear(self, instance: str) -> None:
        while await self._call(self._clear, instance, WRITE_CHUNK):
            pass

    async def lookup(self, blocks: Sequence[int]) -> dict[str, PrefixMatch]:
        if not blocks:
            return {}
        flat = await self._call(self._lookup, *blocks)
        width = 1 + len(TIERS)
        return {flat[i]: to_match(flat[i + 1 : i + width]) for i in range(0, len(flat), width)}

    async def size(self) -> int:
        try:
            return int(await self._redis.get(self.prefix + "n") or 0)
        except RedisError as e:
            raise IndexUnavailable(f"redis index unavailable: {e}") from e

    async def close(self) -> None:
        await self._redis.aclose()
