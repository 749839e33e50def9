-- CLEAR_DRAIN: a drain set with `crawlctl drain --then-clear` is complete: the
-- state goes back to run. Only the very drain the caller read: a newer state
-- (another drain, a stop, a resume) or a key that is not a hash is left alone.
-- KEYS[1] the control hash ({spider}:control)
-- ARGV[1] the drain's `since` as the caller read it ('' when it had none, or
--         one that is no time)
-- ARGV[2] now (unix ms: the `since` of the new state)  ARGV[3] by (who ends it)
-- Returns 1 when the state was set to run, else 0.
-- `since` is untrusted (anyone who can write to Redis): a value that is not a
-- plausible time (digits, 1 ms to 9999-12-31; crawlproject.control.since_ms is
-- the same rule) is an unknown time, and the caller that read an unknown time
-- ends a drain of unknown time like any other. (Compared as strings, a junk
-- `since` matched no caller: such a drain never ended.)
local SINCE_MAX_MS = 253402300799000
local function since_of(v)
  if type(v) ~= 'string' or #v > 20 or not string.match(v, '^%d+$') then return nil end
  local ms = tonumber(v)
  if ms < 1 or ms >= SINCE_MAX_MS then return nil end
  return ms
end
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local f = redis.call('HMGET', KEYS[1], 'state', 'since', 'then_clear')
if f[1] ~= 'drain' or since_of(f[2]) ~= since_of(ARGV[1]) or f[3] ~= '1' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'run', 'since', ARGV[2], 'by', ARGV[3])
redis.call('HDEL', KEYS[1], 'then_clear')
return 1
