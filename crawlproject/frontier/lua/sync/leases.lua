-- sync/leases.lua: leases this node took under a former id of its own
-- (adopt), and which 'sent' feedback may move its key (only the holder's).
-- sync_adopt reads/writes KEYS[3] inflight, moves members between held sets
-- KEYS[14]:<former> -> KEYS[14]:<node>, renews this node in KEYS[4] nodes.
-- sync_sent reads KEYS[3]; marks each refused 'sent' feedback 'refused' and
-- sets C.sent_refused (also counted in KEYS[10] 'sent_refused').
local function sync_adopt(c)
  local node = c.node
  for _, a in ipairs(c.adopt) do
    local owner, fetched_ = lease(redis.call('HGET', KEYS[3], a[1]))
    if owner == a[2] then
      redis.call('HSET', KEYS[3], a[1], fetched_ and node .. '|' .. fetched_ or node)
      redis.call('SMOVE', HELD(a[2]), HELD(node), a[1])
    end
  end
  if #c.adopt > 0 and c.ttl > 0 then redis.call('ZADD', KEYS[4], fmt(now(c) + c.ttl), node) end
end

-- 'sent' feedback moves its key's last start: it is taken only from the node
-- that holds the lease of the member it names (checked here, before this
-- call's acks and fails settle them), so a call from anywhere else cannot
-- hold a key back by repeating it; a refused one is counted (sent_refused),
-- and the node that gets the count in its reply says so.
local function sync_sent(c)
  local feedback, sent_refused = c.feedback, 0
  local members, at = {}, {}
  for i, f in ipairs(feedback) do
    if f[2] == 'sent' then members[#members + 1] = f[4]; at[#at + 1] = i end
  end
  if #members > 0 then
    local owners = redis.call('HMGET', KEYS[3], unpack(members))
    for j, i in ipairs(at) do
      if feedback[i][1] == '' or lease(owners[j]) ~= c.node then
        feedback[i][2] = 'refused'; sent_refused = sent_refused + 1
      end
    end
    if sent_refused > 0 then stat('sent_refused', sent_refused) end
  end
  c.sent_refused = sent_refused
end
