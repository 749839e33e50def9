-- sync/tidy.lua: what the maintenance also tidies, paced per partition (at
-- most every TIDY_EVERY_MS, reclaim.lua), in a window of kstate.
-- Reads KEYS[11] (the window, the sweep's if it read one), KEYS[4] nodes
-- (deadlines beyond the longest lease: those nodes are reclaimed) and KEYS[1]
-- ready (ready times beyond any state: brought back to now); deletes from
-- KEYS[11] the state of keys idle for days (KEYS[10] 'keys_pruned').
-- Counts C.junk.
local function sync_tidy(c)
  if not (c.maintenance or c.ttl == 0) then return end
  -- Tidy: the state of a key idle for longer than any interval it could have
  -- is the same as no state, so it is dropped (a crawl of millions of hosts
  -- seen once would otherwise keep a field for each of them for ever).
  local window = c.window or kstate_window(c, TIDY_WINDOW, true)
  if window then
    -- (paced with the tidy windows: at most every TIDY_EVERY_MS per partition)
    -- A deadline further away than the longest lease never comes (written by
    -- someone else): such a node is expired too, or its leases would never
    -- come back and it would count as a live node for ever.
    local forged = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. fmt(now(c) + LEASE_HARD_MS),
                              '+inf', 'LIMIT', 0, 100)
    for _, nd in ipairs(forged) do reclaim(c, nd) end
    c.junk = c.junk + #forged
    -- Likewise a ready time further away than any state can put it (a block or
    -- an interval of at most a day, jittered): the key is looked at now (a
    -- take checks its state before it leases).
    local far = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now(c) + IDLE_MS), '+inf',
                           'LIMIT', 0, 100)
    if #far > 0 then
      local at = {}
      for _, k in ipairs(far) do at[#at + 1] = fmt(now(c)); at[#at + 1] = k end
      redis.call('ZADD', KEYS[1], unpack(at))
      c.junk = c.junk + #far
    end
  end
  -- Only a state "0|last|block|0|0|error rate" can go (its error rate is
  -- forgotten with it): the others are not parsed.
  local idle, dirty = {}, c.dirty
  for i = 1, window and #window or 0, 2 do
    local k, v = window[i], window[i + 1]
    if not dirty[k] and sub(v, 1, 2) == '0|' then
      local la, bl = string.match(v, '^0|(%d+)|(%d+)|0|0|?[%d|]*$')   -- (a pace or not)
      if la and now(c) - tonumber(la) > IDLE_MS and tonumber(bl) <= now(c) then
        idle[#idle + 1] = k
      end
    end
  end
  if #idle == 0 then return end
  load(c, idle)  -- this call's view (the state may have changed above) and limits
  local gone, ST, LIM = {}, c.ST, c.LIM
  for _, k in ipairs(idle) do
    local s = ST[k]
    if not dirty[k] and s.n == 0 and s.bo == 0 and s.cd == 0 and s.block <= now(c)
        and now(c) - s.last > math.max(IDLE_MS, 2 * (LIM[k].delay + pad(c, LIM[k].delay))) then
      gone[#gone + 1] = k
    end
  end
  if #gone > 0 then
    call_chunked('HDEL', KEYS[11], gone, 1)
    stat('keys_pruned', #gone)
  end
end
