-- SET_LIMITS: override (or clear) the politeness limits of keys, in force at once.
-- KEYS[1] limits (hash key -> "delay ms|concurrency|source", or with a budget
--         "delay ms|concurrency|budget|source")  KEYS[2] ready (zset)
-- KEYS[3] kstate (hash key -> "n|last|block|backoff|crawl delay|error rate[|pace]"; the override
--         is mirrored there as field '|key', which SYNC reads with the state,
--         and their number as field '||limits')
-- KEYS[4] queue prefix: the queue of key K is KEYS[4]:K (derived)
-- ARGV[1] source: 'c' (command line), 's' (settings: never replaces a 'c') or
--         'f' (settings, filling in: writes only keys with no override at all;
--         stored as 's')
-- ARGV[2..] n x (key, "delay ms|concurrency|source", or '' to clear; an empty
--         delay or concurrency is not overridden: each node's setting applies).
--         A clear from the command line ('c') clears everything about the key
--         but its in-flight count: its override, and in its state (KEYS[3])
--         its block, backoff, crawl delay and error rate, and a last start
--         after now (whoever wrote them: a site, a node, anyone who can write
--         to Redis); a key with queued entries is ready at once (a take
--         checks its limits before it leases).
-- A key waiting in the ready set is rescheduled for its last start plus the
-- new delay (not before a block), so a shorter delay applies now, not after
-- the old one ran out; a key out of it because it had its concurrency in
-- flight, with entries queued, goes back into it when the new concurrency is
-- higher (not only at its next download end). Returns how many keys changed.
local changed = 0
for i = 2, #ARGV, 2 do
  local key, value = ARGV[i], ARGV[i + 1]
  local old = redis.call('HGET', KEYS[1], key)
  if not (ARGV[1] == 's' and old and string.sub(old, -2) == '|c')
      and not (ARGV[1] == 'f' and (old or value == '')) and old ~= value then
    if value == '' then
      redis.call('HDEL', KEYS[1], key); redis.call('HDEL', KEYS[3], '|' .. key)
      local state = ARGV[1] == 'c' and redis.call('HGET', KEYS[3], key)
      if state then
        -- field by field (junk there is what this clear is for)
        local n = string.match(state, '^(%d+)|') or '0'
        local last = tonumber(string.match(state, '^[^|]*|(%d+)|') or '0') or 0
        local now = server_now('')
        if #n > 10 then n = '0' end
        redis.call('HSET', KEYS[3], key, n .. '|' .. string.format('%.0f', math.min(last, now))
                                         .. '|0|0|0|0')
        if redis.call('ZCARD', KEYS[4] .. ':' .. key) > 0 then
          redis.call('ZADD', KEYS[2], string.format('%.0f', now), key)
        end
      end
    else
      redis.call('HSET', KEYS[1], key, value); redis.call('HSET', KEYS[3], '|' .. key, value)
    end
    changed = changed + 1
    local ready = redis.call('ZSCORE', KEYS[2], key)
    local state = redis.call('HGET', KEYS[3], key)
    local n, last, block, bo, cd = string.match(state or '',
                                                '^(%-?%d+)|(%d+)|(%d+)|(%d+)|(%d+)|?[%d|]*$')
    -- (a field left to the nodes' setting is unknown here: the ready set is a
    -- hint, a take checks the key's limits before it leases, so the key goes
    -- back in, no later than a zero delay would put it)
    local delay, conc = string.match(value, '^(%d*)|(%d*)|')
    delay, conc = tonumber(delay), tonumber(conc)
    if conc and conc <= 0 then conc = 1000000000 end
    if not ready and last and (conc == nil or tonumber(n) < conc)
        and redis.call('ZCARD', KEYS[4] .. ':' .. key) > 0 then
      ready = true  -- room again: back among the keys a take looks at
    end
    if ready and last then  -- a malformed state is not rescheduled
      local at = math.max(tonumber(last) + math.max(delay or 0, tonumber(bo), tonumber(cd)),
                          tonumber(block))
      redis.call('ZADD', KEYS[2], string.format('%.0f', at), key)
    end
  end
end
-- SYNC reads the overrides only while this count is above 0, and checks
-- budgets only while a setting or an override gives one ('||budgets').
redis.call('HSET', KEYS[3], '||limits', redis.call('HLEN', KEYS[1]))
local budgets = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  if string.match(v, '^%d*|%d*|%d+|[^|]*$') then budgets = budgets + 1 end
end
redis.call('HSET', KEYS[3], '||budgets', budgets)
return changed
