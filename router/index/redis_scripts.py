"""The Lua scripts behind router/index/redis.py (key layout in that module's docstring).

Every write is one script, so a block's field, the instance's block set and its
watermark change together or not at all. Scripts return small integers:
APPLY 1 applied, 0 duplicate (at or below the watermark: already applied by this or
another replica), -1 gap (the writer must resync), -2 no generation yet (resync).
"""

# The position (epoch, seq, part) of a write against the instance's watermark.
# Sets `verdict` to 1 (next in order), 0 (already applied) or -1 (something is missing).
_ORDER = """
local function order(st, epoch, seq, part)
  local we, ws, wp, wd = tonumber(st[2]), tonumber(st[3]), tonumber(st[4]), st[5] == '1'
  if epoch < we then return 0 end
  if epoch > we then return -1 end
  if seq < ws or (seq == ws and (wd or part <= wp)) then return 0 end
  if wd then
    if seq == ws + 1 and part == 0 then return 1 end
  elseif seq == ws and part == wp + 1 then return 1 end
  return -1
end
"""

# Block hashes travel as one argument: 8 bytes each, big-endian (`pack` in redis.py). A
# block's entry is written twice: in the block's hash (who holds it) and in the generation's
# hash (what it holds), with the same tier bitmask. The generation's hash also holds one
# field '~' with a 72-byte value: longer than hash-max-ziplist-value (64 by default), it keeps
# the hash in hashtable encoding at any size, so LOOKUP's HMGET costs O(1) per block (a small
# ziplist hash would cost a scan per field).
_WRITE = """
local function write_blocks(p, field, kind, tb, blob)
  local mine = p .. 'i:' .. field
  if kind == 'stored' and #blob > 0 then redis.call('HSETNX', mine, '~', string.rep('.', 72)) end
  for a = 1, #blob, 8 do
    local h = string.sub(blob, a, a + 7)
    local key = p .. 'b:' .. h
    local m = redis.call('HGET', key, field)
    if kind == 'stored' then
      if not m then
        redis.call('HSET', key, field, tb)
        redis.call('HSET', mine, h, tb)
      elseif bit.band(tonumber(m), tb) == 0 then
        local v = bit.bor(tonumber(m), tb)
        redis.call('HSET', key, field, v)
        redis.call('HSET', mine, h, v)
      end
    elseif m and bit.band(tonumber(m), tb) ~= 0 then
      local rest = bit.band(tonumber(m), bit.bnot(tb))
      if rest == 0 then
        redis.call('HDEL', key, field)
        redis.call('HDEL', mine, h)
      else
        redis.call('HSET', key, field, rest)
        redis.call('HSET', mine, h, rest)
      end
    end
  end
end
"""

# ARGV: prefix, instance, epoch, seq, part, last (0/1), ordered (0/1), kind, tier bit, now, packed hashes
APPLY = _ORDER + _WRITE + """
local p, inst = ARGV[1], ARGV[2]
local epoch, seq, part, last = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local kind, tb = ARGV[8], tonumber(ARGV[9])
local gk = p .. 'g:' .. inst
local st = redis.call('HMGET', gk, 'gen', 'epoch', 'seq', 'part', 'done')
if ARGV[7] == '1' then
  if not st[1] then return -2 end
  local verdict = order(st, epoch, seq, part)
  if verdict ~= 1 then return verdict end
  redis.call('HSET', gk, 'epoch', epoch, 'seq', seq, 'part', part, 'done', last)
elseif not st[1] then
  st[1] = redis.call('INCR', p .. 'gen')
  redis.call('HSET', gk, 'gen', st[1], 'epoch', 0, 'seq', 0, 'part', 0, 'done', 1)
end
redis.call('ZADD', p .. 'live', ARGV[10], inst)
local field = inst .. '@' .. st[1]
if kind == 'cleared' then
  local g = redis.call('INCR', p .. 'gen')
  redis.call('HSET', gk, 'gen', g)
  redis.call('SADD', p .. 'dead', field)
else
  write_blocks(p, field, kind, tb, ARGV[11])
end
return 1
"""

# ARGV: prefix, instance, epoch, seq, now. A fresh generation to stage a snapshot in, or 0 when
# the index already holds this position or a later one (nothing to replace).
STAGE_BEGIN = """
local p, inst, epoch, seq = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local st = redis.call('HMGET', p .. 'g:' .. inst, 'gen', 'epoch', 'seq', 'part', 'done')
if st[1] then
  local we, ws = tonumber(st[2]), tonumber(st[3])
  if epoch < we or (epoch == we and (seq < ws or (seq == ws and st[5] == '1'))) then return 0 end
end
local g = redis.call('INCR', p .. 'gen')
redis.call('ZADD', p .. 'staging', ARGV[5], inst .. '@' .. g)
return g
"""

# ARGV: prefix, instance, gen, tier bit, packed hashes
STAGE_ADD = _WRITE + """
write_blocks(ARGV[1], ARGV[2] .. '@' .. ARGV[3], 'stored', tonumber(ARGV[4]), ARGV[5])
return 1
"""

# ARGV: prefix, instance, gen, epoch, seq, now. The swap: 1 when the staged generation became the
# instance's (the old one goes to garbage collection), 0 when the index moved past it meanwhile.
STAGE_COMMIT = """
local p, inst, gen, epoch, seq = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local gk, field = p .. 'g:' .. inst, inst .. '@' .. gen
redis.call('ZREM', p .. 'staging', field)
local st = redis.call('HMGET', gk, 'gen', 'epoch', 'seq', 'part', 'done')
if st[1] then
  local we, ws = tonumber(st[2]), tonumber(st[3])
  if epoch < we or (epoch == we and (seq < ws or (seq == ws and st[5] == '1'))) then
    redis.call('SADD', p .. 'dead', field)
    return 0
  end
  redis.call('SADD', p .. 'dead', inst .. '@' .. st[1])
end
redis.call('HSET', gk, 'gen', gen, 'epoch', epoch, 'seq', seq, 'part', 0, 'done', 1)
redis.call('ZADD', p .. 'live', ARGV[6], inst)
return 1
"""

_FORGET = """
local function forget(p, inst)
  local gen = redis.call('HGET', p .. 'g:' .. inst, 'gen')
  if gen then redis.call('SADD', p .. 'dead', inst .. '@' .. gen) end
  redis.call('DEL', p .. 'g:' .. inst)
  redis.call('ZREM', p .. 'live', inst)
end
"""

# ARGV: prefix, instance.
CLEAR = _FORGET + """
forget(ARGV[1], ARGV[2])
return 1
"""

# ARGV: prefix, now, cutoff, instances... Refreshes the instances' last-seen time, then forgets
# (at most 64 of) those nobody refreshed since `cutoff`, and drops stagings abandoned since then.
KEEPALIVE = _FORGET + """
local p = ARGV[1]
for i = 4, #ARGV do redis.call('ZADD', p .. 'live', ARGV[2], ARGV[i]) end
local gone = redis.call('ZRANGEBYSCORE', p .. 'live', '-inf', '(' .. ARGV[3], 'LIMIT', 0, 64)
for _, inst in ipairs(gone) do forget(p, inst) end
local stale = redis.call('ZRANGEBYSCORE', p .. 'staging', '-inf', '(' .. ARGV[3], 'LIMIT', 0, 64)
for _, field in ipairs(stale) do
  redis.call('SADD', p .. 'dead', field)
  redis.call('ZREM', p .. 'staging', field)
end
return #gone
"""

# ARGV: prefix, count. Deletes up to `count` entries of one dead generation; 0 when none is left.
GC = """
local p = ARGV[1]
local field = redis.call('SRANDMEMBER', p .. 'dead')
if not field then return 0 end
local mine = p .. 'i:' .. field
local some = redis.call('HRANDFIELD', mine, tonumber(ARGV[2]))
for _, h in ipairs(some) do
  if h ~= '~' then redis.call('HDEL', p .. 'b:' .. h, field) end
end
if #some > 0 then redis.call('HDEL', mine, unpack(some)) end
if redis.call('HLEN', mine) == 0 then redis.call('SREM', p .. 'dead', field) end
return #some + 1
"""

# ARGV: prefix. Entries of every live instance's current generation ('~' is not one).
SIZE = """
local p, total = ARGV[1], 0
for _, inst in ipairs(redis.call('ZRANGE', p .. 'live', 0, -1)) do
  local gen = redis.call('HGET', p .. 'g:' .. inst, 'gen')
  if gen then
    local mine = p .. 'i:' .. inst .. '@' .. gen
    total = total + redis.call('HLEN', mine) - redis.call('HEXISTS', mine, '~')
  end
end
return total
"""

# ARGV: prefix, packed hashes. Returns a flat array: instance, blocks in TIERS[0], TIERS[1], TIERS[2], ...
# The first block's hash names the candidates (fields of current generations only); each one's
# chain is then read from its own generation hash with HMGET, in growing chunks, until its first
# missing block: the work is the matched blocks, one command per chunk, not one per block.
LOOKUP = """
local call, p, blob = redis.call, ARGV[1], ARGV[2]
local best = {['1'] = 1, ['2'] = 2, ['3'] = 1, ['4'] = 3, ['5'] = 1, ['6'] = 2, ['7'] = 1}
local first = call('HGETALL', p .. 'b:' .. string.sub(blob, 1, 8))
if #first == 0 then return {} end
local n, ids, split = #blob / 8, {}, 1  -- ids[1..split]: the hashes cut out of the blob so far
local out = {}
for i = 1, #first, 2 do
  local inst, gen = string.match(first[i], '^(.*)@(%d+)$')
  if inst and call('HGET', p .. 'g:' .. inst, 'gen') == gen then
    local c = {0, 0, 0}
    c[best[first[i + 1]]] = 1
    local mine, a, step, open = p .. 'i:' .. first[i], 2, 32, true
    while open and a <= n do
      local last = math.min(n, a + step - 1)
      for k = split + 1, last do ids[k] = string.sub(blob, 8 * k - 7, 8 * k) end
      if last > split then split = last end
      local masks = call('HMGET', mine, unpack(ids, a, last))
      for k = 1, last - a + 1 do
        local t = best[masks[k]]
        if not t then open = false break end
        c[t] = c[t] + 1
      end
      a, step = last + 1, math.min(step * 4, 4096)
    end
    out[#out + 1] = inst
    out[#out + 1] = c[1]
    out[#out + 1] = c[2]
    out[#out + 1] = c[3]
  end
end
return out
"""
