-- SPILL_COMMIT: a spill's step 3, once its members are in MongoDB (fenced:
-- move/common.lua). The members written that are still in KEYS[4]:<key> leave
-- Redis: their payloads are deleted, they leave the moving set, the key's
-- KEYS[9] count and KEYS[10] '||backlog' go up by them, '||qlen' down.
-- KEYS: FrontierKeys.move_keys(); uses KEYS[1] mover, KEYS[4]:<key> moving,
--       KEYS[6] payloads, KEYS[7] inflight and KEYS[8] delayed (a junk
--       '||qlen' recount), KEYS[9] backlog, KEYS[10] kstate, KEYS[12] stats.
-- ARGV: [1] now ms ('' : Redis time), [2] node, [3] key, [4] epoch,
--       [5] '1': the lease ends with this commit, [6..] the members written
--       to MongoDB (acknowledged, journaled).
-- Returns {'ok', committed} or {'fenced', why} (nothing changed).
local now_ms = server_now(ARGV[1])
local why = fence(now_ms)
if why then return {'fenced', why} end
local k = ARGV[3]
local bad = check_types({MOVING(k), 'zset', KEYS[6], 'hash', KEYS[9], 'zset',
                         KEYS[10], 'hash'})
if bad then return redis.error_reply('BADKEY ' .. bad) end
local done = {}
for i = 6, #ARGV, 500 do
  local last = math.min(i + 499, #ARGV)
  local chunk = {unpack(ARGV, i, last)}
  local scores = redis.call('ZMSCORE', MOVING(k), unpack(chunk))
  for j, member in ipairs(chunk) do
    if scores[j] then done[#done + 1] = member end
  end
end
if #done > 0 then
  call_chunked('ZREM', MOVING(k), done, 1)
  call_chunked('HDEL', KEYS[6], done, 1)
  backlog_add(k, #done)
  qlen_add(-#done)
end
if ARGV[5] == '1' then redis.call('HDEL', KEYS[1], k) end
return {'ok', #done}
