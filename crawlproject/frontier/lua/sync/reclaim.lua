-- sync/reclaim.lua: leases of nodes that are gone go back to their queues,
-- and the window of kstate that the sweep and the tidy read.
-- requeue(c, members, done) reads KEYS[11] (load), writes KEYS[3] (HDEL),
-- the queues KEYS[13]:<key>; sets malformed members aside (KEYS[7]).
-- reclaim(c, nd) reads KEYS[14]:<nd> and KEYS[3], deletes KEYS[14]:<nd>,
-- removes nd from KEYS[4]. kstate_window reads KEYS[11] (HSCAN) and writes
-- its '||cursor'. Moves C.ST[k].n, C.dirty, C.touched, C.qdelta, C.reclaimed.
local function requeue(c, members, done)
  -- Put MEMBERS (whose owner is gone) back in their queues; DONE[i] true when
  -- member i's download had ended (its key's slot is already free).
  local ST = c.ST
  local ks = {}
  for _, member in ipairs(members) do ks[#ks + 1] = member_key(member) end
  load(c, ks)
  local back, bad = {}, {}
  for i, member in ipairs(members) do
    if well_formed(member) then
      local k = member_key(member)
      local q = back[k]
      if not q then q = {}; back[k] = q end
      q[#q + 1] = score(member); q[#q + 1] = member
      if not done[i] then ST[k].n = math.max(0, ST[k].n - 1) end
      c.dirty[k] = true; c.touched[k] = true
    else
      bad[#bad + 1] = member
    end
  end
  call_chunked('HDEL', KEYS[3], members, 1)
  for k, q in pairs(back) do call_chunked('ZADD', Q(k), q, 2) end
  set_aside(c, bad, 'malformed member')
  c.qdelta = c.qdelta + #members - #bad
  c.reclaimed = c.reclaimed + #members - #bad
end
local function reclaim(c, nd)
  -- Node ND is gone: its leases back to their queues. Only its own set is
  -- read, not every lease of the partition.
  local mine, done = leases_of(c, nd)
  if #mine > 0 then requeue(c, mine, done) end
  redis.call('DEL', HELD(nd))
  redis.call('ZREM', KEYS[4], nd)
end
-- A window of the per-key state, from a cursor kept in the hash itself (field
-- '||cursor' -> "cursor|ms of the last window": no key starts with '|', so no
-- override field is '||...'): a call reads a bounded part of it however many
-- keys the partition has seen, and successive calls go round all of it (HSCAN:
-- keys there throughout are seen). The tidy windows are paced per partition,
-- not per node, so a hundred idle nodes cost what one does.
local SWEEP_WINDOW, TIDY_WINDOW, TIDY_EVERY_MS = 1000, 100, 100
local IDLE_MS = 259200000  -- 3 days: above twice the longest interval a limit may set
local function kstate_window(c, count, paced)
  -- Returns {field, value, ...} (overrides and the cursor left out), or nil
  -- when a paced window is not due yet.
  local raw = redis.call('HGET', KEYS[11], '||cursor') or ''
  local cursor, at = string.match(raw, '^(%d+)|(%d+)$')
  cursor, at = cursor or '0', tonumber(at) or 0
  if paced and at <= now(c) and now(c) - at < TIDY_EVERY_MS then return nil end
  -- A cursor written by someone else may be one HSCAN refuses: start over.
  local scan = redis.pcall('HSCAN', KEYS[11], cursor, 'COUNT', count)
  if scan.err then scan = redis.call('HSCAN', KEYS[11], '0', 'COUNT', count) end
  redis.call('HSET', KEYS[11], '||cursor', scan[1] .. '|' .. fmt(now(c)))
  local out = {}
  for i = 1, #scan[2], 2 do
    if sub(scan[2][i], 1, 1) ~= '|' then
      out[#out + 1] = scan[2][i]; out[#out + 1] = scan[2][i + 1]
    end
  end
  return out
end
