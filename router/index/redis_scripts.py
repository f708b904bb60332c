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

# ARGV: prefix, instance, gen field, tier bit, hashes...  (from index 5); returns nothing.
_WRITE = """
local function write_blocks(p, field, kind, tb, first)
  local set = p .. 'i:' .. field
  for i = first, #ARGV do
    local key = p .. 'b:' .. ARGV[i]
    local m = redis.call('HGET', key, field)
    if kind == 'stored' then
      if not m then
        redis.call('HSET', key, field, tb)
        redis.call('SADD', set, ARGV[i])
      elseif bit.band(tonumber(m), tb) == 0 then
        redis.call('HSET', key, field, bit.bor(tonumber(m), tb))
      end
    elseif m and bit.band(tonumber(m), tb) ~= 0 then
      local rest = bit.band(tonumber(m), bit.bnot(tb))
      if rest == 0 then
        redis.call('HDEL', key, field)
        redis.call('SREM', set, ARGV[i])
      else
        redis.call('HSET', key, field, rest)
      end
    end
  end
end
"""

# ARGV: prefix, instance, epoch, seq, part, last (0/1), ordered (0/1), kind, tier bit, now, hashes...
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
  write_blocks(p, field, kind, tb, 11)
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

# ARGV: prefix, instance, gen, tier bit, hashes...
STAGE_ADD = _WRITE + """
write_blocks(ARGV[1], ARGV[2] .. '@' .. ARGV[3], 'stored', tonumber(ARGV[4]), 5)
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
local set = p .. 'i:' .. field
local popped = redis.call('SPOP', set, tonumber(ARGV[2]))
for _, h in ipairs(popped) do redis.call('HDEL', p .. 'b:' .. h, field) end
if redis.call('SCARD', set) == 0 then redis.call('SREM', p .. 'dead', field) end
return #popped + 1
"""

# ARGV: prefix. Entries of every live instance's current generation.
SIZE = """
local p, total = ARGV[1], 0
for _, inst in ipairs(redis.call('ZRANGE', p .. 'live', 0, -1)) do
  local gen = redis.call('HGET', p .. 'g:' .. inst, 'gen')
  if gen then total = total + redis.call('SCARD', p .. 'i:' .. inst .. '@' .. gen) end
end
return total
"""

# ARGV: prefix, hashes... Returns a flat array: instance, blocks in TIERS[0], TIERS[1], TIERS[2], ...
# Fields of the first block are checked against their instance's current generation once; later
# blocks look surviving fields up by name, so the walk costs one HGETALL per block.
LOOKUP = """
local call, p = redis.call, ARGV[1]
local best = {['1'] = 1, ['2'] = 2, ['3'] = 1, ['4'] = 3, ['5'] = 1, ['6'] = 2, ['7'] = 1}
local first = call('HGETALL', p .. 'b:' .. ARGV[2])
if #first == 0 then return {} end
local names, alive, counts, mark, nalive = {}, {}, {}, {}, 0
for i = 1, #first, 2 do
  local inst, gen = string.match(first[i], '^(.*)@(%d+)$')
  if inst and call('HGET', p .. 'g:' .. inst, 'gen') == gen then
    nalive = nalive + 1
    names[nalive], alive[first[i]], mark[nalive] = inst, nalive, 2
    local base = (nalive - 1) * 3
    counts[base + 1], counts[base + 2], counts[base + 3] = 0, 0, 0
    local k = base + best[first[i + 1]]
    counts[k] = 1
  end
end
if nalive == 0 then return {} end
local total = nalive
for a = 3, #ARGV do
  local flat = call('HGETALL', p .. 'b:' .. ARGV[a])
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
for j = 1, total do
  local base = (j - 1) * 3
  out[#out + 1] = names[j]
  out[#out + 1] = counts[base + 1]
  out[#out + 1] = counts[base + 2]
  out[#out + 1] = counts[base + 3]
end
return out
"""
