-- REPLAY_DEAD: put dead letters back into the frontier of one partition.
-- KEYS[1] dead (list)  KEYS[2] payloads (hash)  KEYS[3] seq  KEYS[4] delayed (zset)
-- ARGV: n x (dead record as stored, payload to queue, priority, politeness key:
--       computed by the caller from the payload's URL with the nodes' function,
--       never taken from the record, which anyone who can write to Redis wrote)
-- Each record is removed from the dead list first: a record another replay
-- already took (or that an operator deleted) is skipped, so two replays
-- running at once never queue the same dead letter twice. Records are taken
-- from the tail (oldest first), so LREM scans from the tail (count -1): from
-- the head it would walk the whole list for each record (seconds for a full
-- list, Redis blocked). Callers send small batches (Frontier.replay_dead):
-- the time of one call is bounded by its batch. Entries go to the
-- delayed set, already due: the next node call moves them to their key's
-- queue with the key's politeness applied.
-- Returns the number replayed, or an error reply 'BADKEY <key> ...' (nothing
-- changed) when a key written after a record's LREM holds what it cannot: a
-- script is not rolled back on error, so a late failure would lose the record.
local bad = bad_key(KEYS[2], 'hash') or bad_key(KEYS[3], 'counter') or bad_key(KEYS[4], 'zset')
if bad then return redis.error_reply('BADKEY ' .. bad .. ': no dead letter replayed') end
local replayed = 0
for i = 1, #ARGV, 4 do
  if redis.call('LREM', KEYS[1], -1, ARGV[i]) == 1 then
    local prio = math.max(-4095, math.min(4095, math.floor(tonumber(ARGV[i + 2]) or 0)))
    local member = tostring(prio) .. ':' .. fmt(redis.call('INCR', KEYS[3])) .. '@' .. ARGV[i + 3]
    redis.call('HSET', KEYS[2], member, ARGV[i + 1])
    redis.call('ZADD', KEYS[4], 0, member)
    replayed = replayed + 1
  end
end
return replayed
