-- sync/writeback.lua: the touched keys' state written back, the queue length
-- kept, the keys taken from placed in the ready set, and the reply.
-- Writes KEYS[11] kstate (each dirty key's state and '||qlen', one HSET),
-- KEYS[1] ready (ZADD XX of re-read keys, ZREM, ZADD), KEYS[16] wanting (this
-- node's mark when its take went unmet while entries were queued), KEYS[10]
-- ('qlen_recounted', 'state_junk'). Reads KEYS[11] '||qlen' (and '||backlog')
-- when no part read it, and only for a missing or junk count KEYS[2], KEYS[3],
-- KEYS[5] (HLEN, ZCARD: the recount); with maintenance, the sizes of KEYS[5]
-- and KEYS[3].
-- sync_writeback sets C.qlen; sync_reply returns the reply (main.lua).
local function sync_writeback(c)
  local ST, LIM = c.ST, c.LIM
  -- write back the touched keys' state; the keys taken from get their next
  -- start (or leave the ready set at their concurrency or found empty)
  local states, rem, set = {}, {}, {}
  for k, _ in pairs(c.dirty) do
    local s = ST[k]
    states[#states + 1] = k
    if s.pc == nil then
      states[#states + 1] = s.n .. '|' .. s.last .. '|' .. s.block .. '|' .. s.bo .. '|' .. s.cd
                            .. '|' .. s.er
    else   -- with the pace (pace.lua; integers, as the others), in one concatenation
      states[#states + 1] = s.n .. '|' .. s.last .. '|' .. s.block .. '|' .. s.bo .. '|' .. s.cd
                            .. '|' .. s.er .. '|' .. s.pc .. '|' .. s.ph
    end
  end
  -- The queue length: as read plus this call's changes. A partition without
  -- the field is new; a value that is not a count (written by someone else)
  -- is recounted from the entries, each of which has a payload while it is
  -- queued, delayed or in flight.
  if not c.qlen_read then
    local got = redis.call('HMGET', KEYS[11], '||qlen', '||backlog')
    c.qlen_raw, c.qlen_read, c.backlog_raw = got[1], true, got[2]
  end
  -- (A count is never negative: a node that read one would think nothing is
  -- queued and close.)
  local qlen_raw = c.qlen_raw
  local qlen = qlen_raw and string.match(qlen_raw, '^%d+$') and tonumber(qlen_raw)
  if qlen then
    qlen = qlen + c.qdelta
  else
    qlen = math.max(0, redis.call('HLEN', KEYS[2]) - redis.call('HLEN', KEYS[3])
                       - redis.call('ZCARD', KEYS[5]))
    if qlen_raw ~= false then stat('qlen_recounted', 1) end
  end
  c.qlen = qlen
  if qlen_raw ~= fmt(qlen) then
    states[#states + 1] = '||qlen'; states[#states + 1] = fmt(qlen)
  end
  for k, _ in pairs(c.unready) do rem[#rem + 1] = k end
  for k, _ in pairs(c.took) do
    if ST[k].n >= LIM[k].conc then rem[#rem + 1] = k
    elseif not c.unready[k] then set[#set + 1] = fmt(next_start(c, k)); set[#set + 1] = k end
  end
  for i = 1, #c.later do set[#set + 1] = c.later[i] end
  if #states > 0 then call_chunked('HSET', KEYS[11], states, 2) end
  -- keys whose state was read as junk: their ready time as their mended state
  -- says (a block or last start far ahead had put it far ahead too)
  for k, _ in pairs(c.reready) do
    if ST[k] then redis.call('ZADD', KEYS[1], 'XX', fmt(math.max(now(c), next_start(c, k))), k) end
  end
  if #rem > 0 then call_chunked('ZREM', KEYS[1], rem, 1) end
  if #set > 0 then call_chunked('ZADD', KEYS[1], set, 2) end
end

local function sync_reply(c)
  local delayed_len, inflight_len, next_ready = -1, -1, -1
  local take_n, taken = c.take_n, c.taken
  if c.maintenance then
    delayed_len = redis.call('ZCARD', KEYS[5])
    inflight_len = redis.call('HLEN', KEYS[3])
  end
  if (take_n > 0 and #taken / 2 + c.missing < take_n) or c.maintenance then
    -- (a key passed over for the others is not this node's to wait for)
    local first = redis.call('ZRANGE', KEYS[1], 0, c.n_passed, 'WITHSCORES')
    for i = 1, #first, 2 do
      if not c.passed[first[i]] then next_ready = first[i + 1]; break end
    end
  elseif take_n > 0 then
    next_ready = -2  -- the take got all it asked for: more may be ready now
  end
  if take_n > 0 and c.ttl > 0 then
    if #taken / 2 + c.missing < take_n and c.qlen > 0 then
      redis.call('ZADD', KEYS[16], fmt(now(c)), c.node)   -- wanting: see contract.lua
    end
  end
  if c.junk > 0 then stat('state_junk', c.junk) end
  local b = c.bounds_stored
  return {taken, c.added, c.dups, c.qlen, delayed_len, inflight_len, c.reclaimed,
          c.now_cache and fmt(c.now_cache) or -1, c.stale, c.missing, c.trimmed, next_ready,
          c.capped, c.reserved, c.status, c.capped_keys, c.polite_keys, c.budget_refused,
          c.junk, c.budget_skipped, c.sent_refused, b and {b[1], b[2]} or {}, c.backlog_n,
          c.moves_waiting}
end
