-- sync/context.lua: helpers every part of SYNC uses, on the call context C
-- (one table per call, made by sync_args: its settings, its counters and what
-- each part leaves for the next; passing it keeps every function far from
-- Lua's limits of 200 locals and 60 upvalues).
-- Reads KEYS[2] payloads, KEYS[3] inflight, KEYS[8] seq, KEYS[14]:<node> held sets.
-- Writes KEYS[6] dead, KEYS[7] invalid (capped lists), KEYS[8] seq, KEYS[10] stats.
-- Counters of C it moves: junk, trimmed, missing; C.now_cache (the call's time).
local byte, sub, find = string.byte, string.sub, string.find
local function Q(k) return KEYS[13] .. ':' .. k end       -- the queue of key K
local function HELD(n) return KEYS[14] .. ':' .. n end    -- the leases of node N
local function now(c)
  if c.now_cache == nil then c.now_cache = server_now(ARGV[1]) end
  return c.now_cache
end
-- A lease's value is its node id, with '|f' once its download ended (then its
-- key's in-flight slot is already free) or '|r' while it waits in the node's
-- reserve (it holds no slot yet). The second value is that flag, or false.
local function lease(v)
  -- (by bytes, not a pattern: this runs for every member an ack, a take or a
  -- reclaim touches; 124 = '|', 102 = 'f', 114 = 'r')
  if not v then return false, false end
  if byte(v, -2) == 124 then
    local f = byte(v, -1)
    if f == 102 then return sub(v, 1, -3), 'f' end
    if f == 114 then return sub(v, 1, -3), 'r' end
  end
  return v, false
end
local function leases_of(c, nd)
  -- The members of ND's held set that ND still holds, and their lease flags
  -- (read chunked: a held set may be large).
  local members = redis.pcall('SMEMBERS', HELD(nd))
  if members.err then
    -- not a set (someone else wrote it): stops no call; the entries it should
    -- list come back by the sweep (their owner is gone) and reclaim deletes it
    c.junk = c.junk + 1
    members = {}
  end
  local held, flags = {}, {}
  for i = 1, #members, 500 do
    local last = math.min(i + 499, #members)
    local values = redis.call('HMGET', KEYS[3], unpack(members, i, last))
    for j = i, last do
      local owner, flag = lease(values[j - i + 1])
      if owner == nd then held[#held + 1] = members[j]; flags[#held] = flag end
    end
  end
  return held, flags
end
local function stat(name, n)
  -- A counter of the partition: junk in its field (or a stats key of another
  -- type) must not stop the call (a script is not rolled back): the field
  -- starts again from N.
  local r = redis.pcall('HINCRBY', KEYS[10], name, n)
  if type(r) == 'table' and r.err then redis.pcall('HSET', KEYS[10], name, n) end
end
local function count_of(v, hi)
  -- V (a field read from Redis) as a whole number 0..HI, or nil when it is
  -- not one: digits only, as this script writes them.
  if type(v) ~= 'string' or #v > 17 or not string.match(v, '^%d+$') then return nil end
  local x = tonumber(v)
  if x > hi then return nil end
  return x
end
local function fields_of(s, most)
  -- S split at '|' (at most MOST + 1 fields: more is junk anyway)
  local out = {}
  for f in string.gmatch(s .. '|', '([^|]*)|') do
    out[#out + 1] = f
    if #out > most then break end
  end
  return out
end
local function keep_record(c, kind, record)
  -- Dead letters and invalid payloads are kept for operators, the newest
  -- first, up to a cap; what falls off the end is counted.
  local key, cap = KEYS[6], c.dead_max
  if kind == 'invalid' then key, cap = KEYS[7], c.invalid_max end
  local len = redis.call('LPUSH', key, record)
  if len > cap then
    redis.call('LTRIM', key, 0, cap - 1)
    stat(kind .. '_trimmed', len - cap)
    c.trimmed = c.trimmed + len - cap
  end
end
local function next_seq(n)
  -- The first of N new sequence numbers. The fingerprints of these entries are
  -- already in the Bloom filter, so a counter that is not a count (written by
  -- someone else) must not fail the call: numbering goes on above every
  -- member there is (each queued, delayed or leased entry has a payload; this
  -- O(entries) recount runs only after junk was written there).
  local seq = redis.pcall('INCRBY', KEYS[8], n)
  if type(seq) == 'number' then return seq - n end
  local top = 0
  for _, m in ipairs(redis.call('HKEYS', KEYS[2])) do
    local s = tonumber(string.match(m, '^%-?%d+:(%d+)'))
    if s and s > top then top = s end
  end
  redis.call('SET', KEYS[8], fmt(top + n))  -- whatever type the key had
  stat('seq_recounted', 1)
  return top
end
local function member_key(member)
  -- the politeness key of "<priority>:<seq>@<key>" (nil if it has none)
  local at = find(member, '@', 1, true)
  return at and sub(member, at + 1) or nil
end
local function well_formed(member, k)
  -- Whether MEMBER is one this script writes, "<priority>:<seq>@<key>" (of key
  -- K when given). A queue, the delayed set or the in-flight hash may hold
  -- anything someone else wrote there: such a member is never leased (its
  -- key, its score and its ack would fail the calls of every node).
  local p, sq, key = string.match(member, '^(%-?%d+):(%d+)@(.*)$')
  return p ~= nil and #p <= 5 and #sq <= 15 and math.abs(tonumber(p)) <= 4095
         and (k == nil or key == k)
end
local function set_aside(c, members, why)
  -- MEMBERS (already out of their queue, the delayed set or the in-flight
  -- hash) go to the invalid list with their payloads, and are counted with
  -- the entries that had no payload.
  if #members == 0 then return end
  for i = 1, #members, 500 do
    local last = math.min(i + 499, #members)
    local values = redis.call('HMGET', KEYS[2], unpack(members, i, last))
    for j = i, last do
      keep_record(c, 'invalid', cjson.encode({member = members[j], payload = values[j - i + 1] or nil,
                                              reason = why, node = c.node, at = now(c) / 1000}))
    end
  end
  call_chunked('HDEL', KEYS[2], members, 1)
  c.missing = c.missing + #members
end
