-- REFRESH: one node's flush of proxy health and bans, and the pool's state read back.
-- KEYS[1] pool (set or hash of entries; only read)
-- KEYS[2] health (hash "<id>|ok|fail|ban|consec|lat|seen")
-- KEYS[3] bans (hash "<id>|<domain>" -> "until_ms|strikes")
-- KEYS[4] retired (hash id -> JSON {reason, at})
-- KEYS[5] ban log (zset "<id>|<domain>" -> version of its last change)
-- KEYS[6] ban expiry (zset "<id>|<domain>" -> ms after which it is forgotten)
-- KEYS[7] state (hash: ban_version; "empty:<node>" -> "since_ms|reported_ms")
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] updates (JSON, see HealthBatch.payload),
-- ARGV[3] consecutive connection failures that retire a proxy (0 = never),
-- ARGV[4] latency EWMA weight of a new sample (0-1), ARGV[5] ms after which an
-- expired ban is forgotten (its strikes with it), ARGV[6] the ban version the caller
-- has (0: none, send from the start), ARGV[7] most ban changes returned,
-- ARGV[8] node id ('' = not a node), ARGV[9] ms since when that node has had no
-- usable proxy ('' = it has one), ARGV[10] '1' to read the health hash back ('0': an
-- empty list in its place; nodes read it every few calls, it is O(pool))
-- Returns {now_ms, pool type, {pool entries}, {health flat}, {ban changes flat:
-- field, "until|strikes" or "" when deleted}, {retired flat}, ban version reached,
-- 1 if the changes start from nothing (drop the bans you had) else 0}
-- or, when a key the script writes has another type, {"wrongtype", key, type, expected}.
-- Cost: O(pool entries + retired + health when asked + proxies in the batch + changes
-- since ARGV[6] (at most ARGV[7]) + bans forgotten (at most 100)), never O(all bans).
local H, B, R, LOG, EXP, S = KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local expected = {[H] = 'hash', [B] = 'hash', [R] = 'hash', [LOG] = 'zset', [EXP] = 'zset',
                  [S] = 'hash'}
for i = 2, 7 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= expected[KEYS[i]] then
    return {'wrongtype', KEYS[i], t, expected[KEYS[i]]}
  end
end
local function server_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- HINCRBY that overwrites a value that is not a counter (untrusted) instead of failing
local function incr(key, field, n)
  local r = redis.pcall('HINCRBY', key, field, n)
  if type(r) == 'table' or r < 0 then redis.call('HSET', key, field, n); return n end
  return r
end
-- a latency the nodes accept (store._metric): finite, 0..1e7 ms
local function finite(x) return x and x == x and x >= 0 and x <= 1e7 end
local now = server_now(ARGV[1])
local u = cjson.decode(ARGV[2])
local retire_after, alpha, forget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function changed(f)
  redis.call('ZADD', LOG, incr(S, 'ban_version', 1), f)
end
for id, h in pairs(u.h) do
  redis.call('HSET', H, id .. '|seen', string.format('%.0f', now))
  if h[1] + h[2] + h[3] + h[5] + h[6] + h[7] > 0 then  -- not only "still in the pool"
  incr(H, id .. '|ok', h[1])
  incr(H, id .. '|fail', h[2])
  incr(H, id .. '|ban', h[3])
  if h[5] > 0 then
    local sample = h[4] / h[5]
    local old = tonumber(redis.call('HGET', H, id .. '|lat'))
    if not finite(old) then old = nil end  -- inf, nan, garbage: start again
    local lat = old and (alpha * sample + (1 - alpha) * old) or sample
    redis.call('HSET', H, id .. '|lat', string.format('%.1f', lat))
  end
  local consec
  if h[7] == 1 then  -- a success in this batch: the run restarts from it
    consec = h[6]
    redis.call('HSET', H, id .. '|consec', consec)
  else
    consec = incr(H, id .. '|consec', h[6])
  end
  if retire_after > 0 and consec >= retire_after and h[6] > 0
     and redis.call('HEXISTS', R, id) == 0 then
    local reason = string.format('%d connection failures in a row (last: %s)', consec, h[8])
    redis.call('HSET', R, id, cjson.encode({reason = reason, at = now}))
  end
  end
end
for _, b in ipairs(u.b) do
  local f = b[1] .. '|' .. b[2]
  local until_ms, strikes = now + b[3], b[4]
  local old = redis.call('HGET', B, f)
  if old then
    local ou, os = string.match(old, '^(%d+)|(%d+)$')
    if ou then
      until_ms = math.max(until_ms, tonumber(ou)); strikes = math.max(strikes, tonumber(os))
    end
  end
  redis.call('HSET', B, f, string.format('%.0f|%d', until_ms, strikes))
  redis.call('ZADD', EXP, until_ms + forget, f)
  changed(f)
end
for _, c in ipairs(u.c) do
  local f = c[1] .. '|' .. c[2]
  local old = redis.call('HGET', B, f)
  local ou = old and tonumber(string.match(old, '^(%d+)|')) or nil
  if ou and ou <= now then
    redis.call('HDEL', B, f)
    changed(f)  -- a deletion: stays in the log until forgotten (EXP)
  end
end
-- forget a bounded number of long-expired bans per call (nodes forget them alike)
local gone = redis.call('ZRANGEBYSCORE', EXP, '-inf', now, 'LIMIT', 0, 100)
for _, f in ipairs(gone) do
  redis.call('HDEL', B, f); redis.call('ZREM', LOG, f); redis.call('ZREM', EXP, f)
end
if ARGV[8] ~= '' then
  if ARGV[9] ~= '' then
    redis.call('HSET', S, 'empty:' .. ARGV[8], ARGV[9] .. '|' .. string.format('%.0f', now))
  else
    redis.call('HDEL', S, 'empty:' .. ARGV[8])
  end
end
local version = tonumber(redis.call('HGET', S, 'ban_version')) or 0
local since, limit = tonumber(ARGV[6]) or 0, tonumber(ARGV[7])
local full = 0
if since <= 0 or since > version then full = 1; since = 0 end  -- new node, or state reset
local log = redis.call('ZRANGEBYSCORE', LOG, '(' .. string.format('%.0f', since), '+inf',
                       'WITHSCORES', 'LIMIT', 0, limit)
local bans, reached = {}, version
for i = 1, #log, 2 do
  bans[#bans + 1] = log[i]; bans[#bans + 1] = redis.call('HGET', B, log[i]) or ''
end
if #log >= 2 * limit then reached = tonumber(log[#log]) end  -- more next call
local kind = redis.call('TYPE', KEYS[1])['ok']
local pool = {}
if kind == 'set' then pool = redis.call('SMEMBERS', KEYS[1])
elseif kind == 'hash' then pool = redis.call('HVALS', KEYS[1]) end
local health = {}
if ARGV[10] == '1' then health = redis.call('HGETALL', H) end
return {string.format('%.0f', now), kind, pool, health, bans,
        redis.call('HGETALL', R), string.format('%.0f', reached), full}
