-- REFILL_DONE: a refill's step 4, once the MongoDB copies of its members are
-- tombstoned (fenced: move/common.lua): they leave KEYS[5]:<key>. Also ends a
-- lease with nothing to commit (no members, release '1').
-- KEYS: FrontierKeys.move_keys(); uses KEYS[1] mover, KEYS[5]:<key> refilled.
-- ARGV: [1] now ms ('' : Redis time), [2] node, [3] key, [4] epoch,
--       [5] '1': the lease ends with this call, [6..] the members tombstoned.
-- Returns {'ok', cleared} or {'fenced', why} (nothing changed).
local now_ms = server_now(ARGV[1])
local why = fence(now_ms)
if why then return {'fenced', why} end
local k = ARGV[3]
local bad = check_types({REFILLED(k), 'set'})
if bad then return redis.error_reply('BADKEY ' .. bad) end
local cleared = 0
if #ARGV >= 6 then
  local members = {unpack(ARGV, 6, #ARGV)}
  for _, n in ipairs(call_chunked('SREM', REFILLED(k), members, 1, true)) do
    cleared = cleared + n
  end
end
if ARGV[5] == '1' then redis.call('HDEL', KEYS[1], k) end
return {'ok', cleared}
