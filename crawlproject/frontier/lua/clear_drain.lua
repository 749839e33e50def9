-- CLEAR_DRAIN: a drain set with `crawlctl drain --then-clear` is complete: the
-- state goes back to run. Only the very drain the caller read: a newer state
-- (another drain, a stop, a resume) or a key that is not a hash is left alone.
-- KEYS[1] the control hash ({spider}:control)
-- ARGV[1] the drain's `since` as the caller read it ('' when it had none)
-- ARGV[2] now (unix ms: the `since` of the new state)  ARGV[3] by (who ends it)
-- Returns 1 when the state was set to run, else 0.
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local f = redis.call('HMGET', KEYS[1], 'state', 'since', 'then_clear')
if f[1] ~= 'drain' or (f[2] or '') ~= ARGV[1] or f[3] ~= '1' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'run', 'since', ARGV[2], 'by', ARGV[3])
redis.call('HDEL', KEYS[1], 'then_clear')
return 1
