-- CLAIM_SEEDS: take seeds, keeping each as a claim until the requests made from
-- it are safely in the frontier; expired claims (their node died) go back first.
-- KEYS[1] seed key (list | set | zset)   KEYS[2] claims (hash id -> seed)
-- KEYS[3] claim deadlines (zset id -> ms) KEYS[4] claim counter (string)
-- (KEYS[2..4] are tagged {<seed key>}, so all four share the seed key's slot.)
-- ARGV[1] 'list' | 'set' | 'zset'  ARGV[2] how many  ARGV[3] claim ttl ms
-- ARGV[4] now in ms, or '' for Redis server time
-- Returns {restored count, id1, seed1, id2, seed2, ...}, or an error reply
-- 'BADKEY <key> ...' when a claim key holds what it cannot (no seed taken).
-- A script is not rolled back on error: every key a write after the pop needs is
-- checked first, and the seeds are put back if one is wrong, so junk in a claim
-- key (a counter that is not a number, a hash that is a string) loses no seed.
local now = server_now(ARGV[4])
local kind, count = ARGV[1], tonumber(ARGV[2])
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now), 'LIMIT', 0, 500)
for _, id in ipairs(expired) do
  local seed = redis.call('HGET', KEYS[2], id)
  if seed then
    if kind == 'list' then redis.call('RPUSH', KEYS[1], seed)
    elseif kind == 'set' then redis.call('SADD', KEYS[1], seed)
    else
      local score, raw = string.match(seed, '^([^\n]*)\n(.*)$')
      redis.call('ZADD', KEYS[1], score, raw)
    end
  end
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local got = {}
if kind == 'list' then
  got = redis.call('RPOP', KEYS[1], count) or {}
elseif kind == 'set' then
  got = redis.call('SPOP', KEYS[1], count) or {}
else
  local flat = redis.call('ZPOPMAX', KEYS[1], count)
  for i = 1, #flat, 2 do got[#got + 1] = flat[i + 1] .. '\n' .. flat[i] end
end
local out = {#expired}
if type(got) ~= 'table' or #got == 0 then return out end
local bad = bad_key(KEYS[2], 'hash') or bad_key(KEYS[4], 'counter')
if bad then
  if kind == 'list' then
    for i = #got, 1, -1 do redis.call('RPUSH', KEYS[1], got[i]) end
  elseif kind == 'set' then
    redis.call('SADD', KEYS[1], unpack(got))
  else
    for i = 1, #got do
      local score, raw = string.match(got[i], '^([^\n]*)\n(.*)$')
      redis.call('ZADD', KEYS[1], score, raw)
    end
  end
  return redis.error_reply('BADKEY ' .. bad .. ': no seed taken')
end
local last = redis.call('INCRBY', KEYS[4], #got)
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
local fields, scores = {}, {}
for i, seed in ipairs(got) do
  local id = tostring(last - #got + i)
  fields[#fields + 1] = id; fields[#fields + 1] = seed
  scores[#scores + 1] = deadline; scores[#scores + 1] = id
  out[#out + 1] = id
  out[#out + 1] = seed
end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[3], unpack(scores))
return out
