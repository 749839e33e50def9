-- sync/settle.lua: the node's word on its leases: downloads that ended
-- (fetched), slots handed to a reserved entry (handoff), acks, fails and
-- nacks; only the holder's word changes an entry (contract.lua, Ownership).
-- Reads/writes KEYS[3] inflight; KEYS[2] payloads (HDEL of acked and failed
-- entries); the queues KEYS[13]:<key> (a late finisher's copy removed, nacks
-- put back); KEYS[14]:<node> (SREM of what this node no longer holds);
-- KEYS[6]/KEYS[7] (a fail's record, keep_record).
-- Moves C.ST[k].n (the key's in-flight count), .last and the pace (handoff), .bo and .er
-- (a success relaxes a backoff), C.dirty, C.touched, C.stale, C.qdelta.
local function settle(c, members, unheld, on_done)
  -- Ownership, in batches: the members this node holds are settled at once;
  -- a late finisher's member (nobody holds it, it is back in its queue) is
  -- taken out of the queue; anything else is stale. A key's in-flight count
  -- goes down when its download ended ('fetched', reported earlier) or now.
  if #members == 0 then return end
  local ST, node = c.ST, c.node
  local values = {}
  for i = 1, #members, 500 do
    local last = math.min(i + 499, #members)
    local got = redis.call('HMGET', KEYS[3], unpack(members, i, last))
    for j = i, last do values[j] = got[j - i + 1] end
  end
  local mine = {}
  for i, member in ipairs(members) do
    local owner, fetched_ = lease(values[i])
    if owner == node then
      mine[#mine + 1] = member
      if not fetched_ then
        local k = member_key(member)
        ST[k].n = math.max(0, ST[k].n - 1); c.dirty[k] = true; c.touched[k] = true
      end
      on_done(i, member)
    elseif not owner and redis.call('ZREM', Q(member_key(member)), member) == 1 then
      c.qdelta = c.qdelta - 1
      on_done(i, member)
    elseif not owner and redis.call('HEXISTS', KEYS[2], member) == 0 then
      -- already settled: the same ack/fail again after a call whose reply was
      -- lost (Redis stopped between running it and answering); nothing to do
    else
      c.stale = c.stale + 1
    end
  end
  if #mine == 0 then return end
  call_chunked('HDEL', KEYS[3], mine, 1)
  for _, member in ipairs(mine) do unheld[#unheld + 1] = member end
end

local function sync_fetched(c)
  -- fetched: downloads that ended: their key's slot is free for the next request
  local fetched, ST, node = c.fetched, c.ST, c.node
  if #fetched == 0 then return end
  local values = redis.call('HMGET', KEYS[3], unpack(fetched))
  local marks = {}
  for i, member in ipairs(fetched) do
    local owner, done = lease(values[i])
    if owner == node and not done then
      marks[#marks + 1] = member; marks[#marks + 1] = node .. '|f'
      local k = member_key(member)
      ST[k].n = math.max(0, ST[k].n - 1); c.dirty[k] = true; c.touched[k] = true
    end
  end
  if #marks > 0 then call_chunked('HSET', KEYS[3], marks, 2) end
end

local function sync_handoff(c)
  -- handoff: a download ended and the node started a reserved entry of the same
  -- key in its place: the ended one no longer holds a slot, the started one does
  local handoffs, ST, node = c.handoffs, c.ST, c.node
  if #handoffs == 0 then return end
  local flat = {}
  for _, h in ipairs(handoffs) do flat[#flat + 1] = h[1]; flat[#flat + 1] = h[2] end
  local values = redis.call('HMGET', KEYS[3], unpack(flat))
  local marks = {}
  for i, h in ipairs(handoffs) do
    -- Both are of the same key; the ready set changes only if its count does.
    local k, delta = member_key(h[2]), 0
    local owner, flag = lease(values[2 * i - 1])
    if owner == node and not flag then
      marks[#marks + 1] = h[1]; marks[#marks + 1] = node .. '|f'
      delta = delta - 1
    end
    owner, flag = lease(values[2 * i])
    if owner == node and flag == 'r' then
      marks[#marks + 1] = h[2]; marks[#marks + 1] = node
      delta = delta + 1
    else
      c.stale = c.stale + 1    -- reclaimed meanwhile: it runs without a lease
    end
    -- (a start either way: pace.lua counts it)
    ST[k].n = math.max(0, ST[k].n + delta); moved_last(c, ST[k], now(c), 1); c.dirty[k] = true
    if delta ~= 0 then c.touched[k] = true end
  end
  if #marks > 0 then call_chunked('HSET', KEYS[3], marks, 2) end
end

local function sync_settle(c)
  -- ack, fail, nack
  local ST, LIM, acks, fails, node = c.ST, c.LIM, c.acks, c.fails, c.node
  local unheld, gone = {}, {}
  local ack_members = {}
  for i, a in ipairs(acks) do ack_members[i] = a[1] end
  settle(c, ack_members, unheld, function(i, member)
    gone[#gone + 1] = member
    local k = member_key(member)
    local s = ST[k]
    if acks[i][2] == '1' and (s.bo > 0 or s.er > 0) then
      -- a success lowers the key's error rate and relaxes its backoff (halved;
      -- gone below its interval): a site that recovered is back at full speed
      -- after a few answers
      s.er = math.floor(s.er * (1000000 - err_weight_of(c, k)) / 1000000)
      s.bo = math.floor(s.bo / 2)
      if s.bo <= LIM[k].delay then s.bo = 0 end
      c.dirty[k] = true
    end
  end)

  local fail_members = {}
  for i, f in ipairs(fails) do fail_members[i] = f[1] end
  settle(c, fail_members, unheld, function(i, member)
    gone[#gone + 1] = member
    keep_record(c, fails[i][2], fails[i][3])
  end)
  if #gone > 0 then call_chunked('HDEL', KEYS[2], gone, 1) end

  -- nack: not started, back to its queue (only the holder's)
  local nacked = {}
  -- (their leases read in batches: a returned reserve gives back dozens at once)
  for i = 1, #c.nacks, 500 do
    local last = math.min(i + 499, #c.nacks)
    local owners = redis.call('HMGET', KEYS[3], unpack(c.nacks, i, last))
    for j = i, last do
      if lease(owners[j - i + 1]) == node then nacked[#nacked + 1] = c.nacks[j]
      else c.stale = c.stale + 1 end
    end
  end
  if #nacked > 0 then
    local back = {}
    for _, member in ipairs(nacked) do
      local k = member_key(member)
      local q = back[k]
      if not q then q = {}; back[k] = q end
      q[#q + 1] = score(member); q[#q + 1] = member
    end
    settle(c, nacked, unheld, function() end)
    for k, q in pairs(back) do call_chunked('ZADD', Q(k), q, 2) end
    c.qdelta = c.qdelta + #nacked
  end
  if #unheld > 0 then call_chunked('SREM', HELD(node), unheld, 1) end
end
