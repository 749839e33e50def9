-- REFILL_COMMIT: a refill's step 2, with the documents its step 1 read from
-- MongoDB (fenced: move/common.lua). Each member goes back to the key's queue
-- (ZADD at its score, HSET its payload) unless it is already in Redis (it has
-- a payload: queued, delayed, in flight or leaving), and every member read is
-- recorded in KEYS[5]:<key> (its MongoDB copy is tombstoned next, step 3,
-- and never read again). The key's KEYS[9] count and KEYS[10] '||backlog' go
-- down by the documents read, '||qlen' up by those queued; a key that gained
-- entries joins KEYS[11] ready at once unless it is there (ZADD NX, as SYNC
-- marks a key whose state it did not read: a hint the take checks against
-- the key's interval and concurrency).
-- KEYS: FrontierKeys.move_keys(); uses KEYS[1] mover, KEYS[3]:<key> queue,
--       KEYS[5]:<key> refilled, KEYS[6] payloads, KEYS[7] inflight and
--       KEYS[8] delayed (a junk '||qlen' recount), KEYS[9] backlog,
--       KEYS[10] kstate, KEYS[11] ready, KEYS[12] stats.
-- ARGV: [1] now ms ('' : Redis time), [2] node, [3] key, [4] epoch,
--       [5..] member, payload of each document read (in queue order).
-- Returns {'ok', queued, skipped, junk, cleared} or {'fenced', why} (nothing
-- changed); with no document read (none left in MongoDB), the key's count is
-- cleared: cleared is what it said.
-- A member that is not one of this key's (junk in MongoDB) is not queued
-- (counted, 'backlog_junk'), but recorded: its tombstone ends it.
local now_ms = server_now(ARGV[1])
local why = fence(now_ms)
if why then return {'fenced', why} end
local k = ARGV[3]
local bad = check_types({QUEUE(k), 'zset', REFILLED(k), 'set', KEYS[6], 'hash',
                         KEYS[9], 'zset', KEYS[10], 'hash', KEYS[11], 'zset'})
if bad then return redis.error_reply('BADKEY ' .. bad) end
local zargs, pargs, seen, read = {}, {}, {}, 0
local skipped, junk = 0, 0
for i = 5, #ARGV - 1, 2 do
  local member, payload = ARGV[i], ARGV[i + 1]
  read = read + 1
  seen[#seen + 1] = member
  if not mover_member_ok(member, k) then
    junk = junk + 1
  elseif redis.call('HEXISTS', KEYS[6], member) == 1 then
    skipped = skipped + 1
  else
    zargs[#zargs + 1] = score(member); zargs[#zargs + 1] = member
    pargs[#pargs + 1] = member; pargs[#pargs + 1] = payload
  end
end
if read == 0 then
  -- the caller read no live document of K: MongoDB holds none, whatever the
  -- count says (documents deleted outside the crawl): the count goes, or the
  -- key would be refilled, and no node idle, for ever
  local n = tonumber(redis.call('ZSCORE', KEYS[9], k)) or 0
  if n > 0 then backlog_add(k, -n); move_stat('backlog_lost', n) end
  return {'ok', 0, 0, 0, n}
end
call_chunked('SADD', REFILLED(k), seen, 1)
if #zargs > 0 then
  call_chunked('HSET', KEYS[6], pargs, 2)
  call_chunked('ZADD', QUEUE(k), zargs, 2)
  qlen_add(#zargs / 2)
  redis.call('ZADD', KEYS[11], 'NX', fmt(now_ms), k)
end
backlog_add(k, -read)
if junk > 0 then move_stat('backlog_junk', junk) end
return {'ok', #zargs / 2, skipped, junk, 0}
