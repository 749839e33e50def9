-- sync/maintenance.lua: heartbeat, reclaim and sweep (flags 'm' and 's', or a
-- node leaving: ttl 0).
-- Writes KEYS[4] nodes (this node's deadline, or its removal when it leaves),
-- KEYS[16] wanting (this node's mark when it leaves; marks of nodes gone a
-- minute, and with 's' marks dated in the future); reclaims the leases of
-- expired nodes (reclaim.lua). With 's': reads all of KEYS[3] inflight
-- (HGETALL), requeues entries of unregistered owners, and recounts the
-- in-flight count of every key with a lease and of a window of KEYS[11].
-- Sets C.reclaimed, C.window (the kstate window read, for tidy.lua).
local function sync_maintenance(c)
  c.reclaimed = 0
  if not (c.maintenance or c.ttl == 0) then return end
  local node, ST = c.node, c.ST
  if c.ttl > 0 then
    redis.call('ZADD', KEYS[4], fmt(now(c) + c.ttl), node)
  else
    redis.call('ZREM', KEYS[4], node)
    redis.call('ZREM', KEYS[16], node)
  end
  -- wanting marks of nodes long gone (a node id per process start)
  redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', fmt(now(c) - 60000))
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', fmt(now(c)), 'LIMIT', 0, 100)
  for _, nd in ipairs(expired) do reclaim(c, nd) end
  if not c.sweep then return end
  -- wanting marks dated in the future (not written by this script)
  redis.call('ZREMRANGEBYSCORE', KEYS[16], '(' .. fmt(now(c) + 60000), '+inf')
  -- Entries of owners that are not registered nodes; and each key's
  -- in-flight count recomputed from the leases themselves (self-healing).
  local flat = redis.call('HGETALL', KEYS[3])
  local alive, orphans, done, count = {}, {}, {}, {}
  for i = 1, #flat, 2 do
    local owner, fetched_ = lease(flat[i + 1])
    if alive[owner] == nil then alive[owner] = redis.call('ZSCORE', KEYS[4], owner) ~= false end
    if alive[owner] then
      local k = member_key(flat[i])
      if k and not fetched_ then count[k] = (count[k] or 0) + 1 end
    else
      orphans[#orphans + 1] = flat[i]; done[#orphans] = fetched_
      redis.call('SREM', HELD(owner), flat[i])
    end
  end
  if #orphans > 0 then requeue(c, orphans, done) end
  -- Recounted: every key with a live lease, and the window of the state
  -- read below (all keys are recounted over successive sweeps).
  local all, seen = {}, {}
  for k, _ in pairs(count) do all[#all + 1] = k; seen[k] = true end
  local window = kstate_window(c, SWEEP_WINDOW, false)
  c.window = window
  for i = 1, #window, 2 do
    if not seen[window[i]] then all[#all + 1] = window[i] end
  end
  load(c, all)
  for _, k in ipairs(all) do
    if ST[k].n ~= (count[k] or 0) then
      ST[k].n = count[k] or 0; c.dirty[k] = true; c.touched[k] = true
    end
  end
end
