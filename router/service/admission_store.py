"""The fleet's admission ledger in Redis: router/decision/fleet_ledger.py's `FleetLedger`, one script.

A replica's sync is one EVALSHA of `SYNC` (its request as JSON), atomic like the memory
ledger's `sync`, on Redis's clock (TIME), so the replicas' clocks never meet. Keys, under the
prefix (default `kvroute:adm:`):

    replicas        ZSET  replica -> its last sync (Redis time, seconds)
    ttl             HASH  replica -> seconds without a sync after which it is gone
    rep:{replica}   HASH  s:{tenant} -> slots held, h:{band} -> queue head tag, l:{instance} -> "queued inflight"
    rate            HASH  tenant -> "count as-of": admitted lately, decaying with the half-life
    demand          HASH  tenant -> "count as-of": arrived lately (admitted or refused), the same
    bucket          HASH  tenant -> "tokens as-of": the tenant's fleet token bucket
    tag             HASH  "{band}:{tenant}" -> the tenant's last fair-queue tag
    vtime           HASH  band -> the highest tag served

`tests/unit/test_fleet_ledger.py` runs the same syncs through both ledgers and requires the same
answers. Any Redis error, timeout or malformed reply is `LedgerUnavailable`. Like the Redis
index, the script builds its key names from the prefix: a standalone Redis >= 6.2, not Cluster.
"""

from __future__ import annotations

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kvroute.router.contract.cancellation import raise_if_cancelled
from kvroute.router.decision.fleet_ledger import SyncReply, SyncRequest
from kvroute.router.decision.shares import FORGET

SYNC = r"""
redis.replicate_commands()
local p = ARGV[1]
local req = cjson.decode(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local me, hl = req.replica, req.halflife_s
local function pair(v) local a, b = string.match(v, '^(%S+) (%S+)$'); return tonumber(a), tonumber(b) end
local function count(key, name, n)
  if not n or n == 0 then return end
  local v, since = 0, now
  local old = redis.call('HGET', key, name)
  if old then v, since = pair(old) end
  v = v * 0.5 ^ (math.max(0, now - since) / hl) + n
  redis.call('HSET', key, name, string.format('%.17g %.17g', v, now))
end
local function counts(key)
  local out = {}
  local rs = redis.call('HGETALL', key)
  for i = 1, #rs, 2 do
    local v, since = pair(rs[i + 1])
    v = v * 0.5 ^ (math.max(0, now - since) / hl)
    if v < FORGET then redis.call('HDEL', key, rs[i]) else out[rs[i]] = v end
  end
  return out
end

local alive = {}
local reps = redis.call('ZRANGE', p .. 'replicas', 0, -1, 'WITHSCORES')
for i = 1, #reps, 2 do
  local r, last = reps[i], tonumber(reps[i + 1])
  if now - last > tonumber(redis.call('HGET', p .. 'ttl', r) or '0') then
    redis.call('ZREM', p .. 'replicas', r); redis.call('HDEL', p .. 'ttl', r); redis.call('DEL', p .. 'rep:' .. r)
  elseif r ~= me then table.insert(alive, r) end
end
redis.call('ZADD', p .. 'replicas', now, me)
redis.call('HSET', p .. 'ttl', me, req.ttl_s)
local mine = p .. 'rep:' .. me

local tokens, left, held, free = {}, {}, {}, {}
for name, t in pairs(req.tenants or {}) do
  count(p .. 'rate', name, t.admitted)
  count(p .. 'demand', name, t.arrived)
  if t.rate then
    local burst = t.burst or math.max(1, t.rate)
    local k, since = burst, now
    local old = redis.call('HGET', p .. 'bucket', name)
    if old then k, since = pair(old) end
    k = math.min(burst, k + math.max(0, now - since) * t.rate + (t.give or 0))
    local granted = math.max(t.owe or 0, math.min(t.take or 0, math.max(k, 0)))
    redis.call('HSET', p .. 'bucket', name, string.format('%.17g %.17g', k - granted, now))
    tokens[name] = granted
    left[name] = k - granted
  end
  if t.slots_max then
    local taken = 0
    for _, r in ipairs(alive) do taken = taken + tonumber(redis.call('HGET', p .. 'rep:' .. r, 's:' .. name) or '0') end
    local h = math.max(t.slots_min or 0, math.min(t.slots_want or 0, t.slots_max - taken))
    redis.call('HSET', mine, 's:' .. name, h)
    held[name] = h
    free[name] = math.max(0, t.slots_max - taken - h)
  else
    redis.call('HDEL', mine, 's:' .. name)
  end
end

for key, cost in pairs(req.tags or {}) do
  local band = string.match(key, '^([^:]*):')
  local f = tonumber(redis.call('HGET', p .. 'tag', key) or '0')
  local v = tonumber(redis.call('HGET', p .. 'vtime', band) or '0')
  redis.call('HSET', p .. 'tag', key, string.format('%.17g', math.max(f, v) + cost))
end
for band, tag in pairs(req.served or {}) do
  local v = tonumber(redis.call('HGET', p .. 'vtime', band) or '0')
  if tag > v then redis.call('HSET', p .. 'vtime', band, string.format('%.17g', tag)) end
end

local fields = redis.call('HKEYS', mine)
for _, f in ipairs(fields) do
  local kind = string.sub(f, 1, 2)
  if kind == 'h:' or kind == 'l:' then redis.call('HDEL', mine, f) end
end
for band, tag in pairs(req.heads or {}) do redis.call('HSET', mine, 'h:' .. band, string.format('%.17g', tag)) end
for inst, ql in pairs(req.load or {}) do redis.call('HSET', mine, 'l:' .. inst, ql.queued .. ' ' .. ql.inflight) end

local busy, heads, load = {}, {}, {}
for band, _ in pairs(req.heads or {}) do busy[band] = true end
for _, r in ipairs(alive) do
  local h = redis.call('HGETALL', p .. 'rep:' .. r)
  for i = 1, #h, 2 do
    local f, v = h[i], h[i + 1]
    local kind, rest = string.sub(f, 1, 2), string.sub(f, 3)
    if kind == 'h:' then
      busy[rest] = true
      local tag = tonumber(v)
      if heads[rest] == nil or tag < heads[rest] then heads[rest] = tag end
    elseif kind == 'l:' then
      local q, n = pair(v)
      local old = load[rest] or {queued = 0, inflight = 0}
      load[rest] = {queued = old.queued + q, inflight = old.inflight + n}
    end
  end
end
local tags = {}
local all = redis.call('HGETALL', p .. 'tag')
for i = 1, #all, 2 do
  local band = string.match(all[i], '^([^:]*):')
  if busy[band] then tags[all[i]] = tonumber(all[i + 1]) else redis.call('HDEL', p .. 'tag', all[i]) end
end
local rates, demand = counts(p .. 'rate'), counts(p .. 'demand')
local vtime = {}
local vs = redis.call('HGETALL', p .. 'vtime')
for i = 1, #vs, 2 do vtime[vs[i]] = tonumber(vs[i + 1]) end
return cjson.encode({replicas = #alive + 1, rates = rates, demand = demand, tokens = tokens, left = left,
                     slots = held, free = free, tags = tags, vtime = vtime, heads = heads, load = load})
""".replace("FORGET", repr(FORGET))  # the memory ledger's threshold (fleet_ledger.py), declared once


class LedgerUnavailable(Exception):
    """The ledger could not be synced with (Redis down, slow, or a reply that does not decode)."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(SyncReply).decode


class RedisLedger:
    def __init__(self, url: str, prefix: str = "kvroute:adm:", timeout_s: float = 0.25) -> None:
        if not url:
            raise ValueError("shared admission needs a Redis URL (--redis redis://host:port/db)")
        self.prefix = prefix
        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                              retry_on_timeout=False)
        self._sync = self._redis.register_script(SYNC)

    async def sync(self, request: SyncRequest) -> SyncReply:
        try:
            raw = await self._sync(args=[self.prefix, _encode(request)])
        except (RedisError, OSError, TimeoutError) as e:
            raise_if_cancelled()
            raise LedgerUnavailable(f"{type(e).__name__}: {e}") from None
        raise_if_cancelled()
        try:
            return _decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise LedgerUnavailable(f"the ledger's reply does not decode: {e}") from None

    async def close(self) -> None:
        await self._redis.aclose()
