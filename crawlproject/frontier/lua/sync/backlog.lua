-- sync/backlog.lua: the MongoDB tier's flags (docs/frontier.md, "A frontier
-- larger than RAM"): for the keys this call touched, whether one wants a move,
-- flagged in KEYS[18] moves for a node's mover (crawlproject/frontier/
-- movertask.py). SYNC itself never moves an entry nor talks to MongoDB.
-- Reads C.qlen (writeback.lua), C.backlog_raw (kstate '||backlog', read along
-- with '||qlen'), C.touched, C.took, C.unready, C.ST and C.LIM (load: the keys'
-- states and limits, for window_of: pace.lua);
-- the queues KEYS[13]:<key> (ZCARD), KEYS[19] backlog (ZSCORE, per key taken
-- from). Writes KEYS[18] (ZADD NX: since when a key wants a move).
-- Sets C.backlog_n (the partition's entries in MongoDB) and C.moves_waiting
-- (ZCARD KEYS[18] when this call looked, else 0).
-- With the tier off (spill above 0), or below spill above and nothing in
-- MongoDB, this part issues no command: the call costs what it did before.
local function sync_backlog(c)
  c.moves_waiting = 0
  c.backlog_n = count_of(c.backlog_raw, 1e15) or 0
  if c.spill_above <= 0 then return end
  local spill = c.qlen > c.spill_above
  if not spill and c.backlog_n == 0 then return end
  local flag, seen = {}, {}
  local function want(k)
    if not seen[k] then seen[k] = true; flag[#flag + 1] = fmt(now(c)); flag[#flag + 1] = k end
  end
  if spill then
    -- keys that grew (or changed): over 1.25 W they spill down to W
    local keys = {}
    for k, _ in pairs(c.touched) do keys[#keys + 1] = k end
    load(c, keys)
    for _, k in ipairs(keys) do
      if redis.call('ZCARD', Q(k)) > 1.25 * window_of(c, k) then want(k) end
    end
  end
  if c.backlog_n > 0 then
    -- keys taken from (or found empty): below W/2 with entries in MongoDB
    -- they are refilled (one ZSCORE per such key: no ZMSCORE, which a node's
    -- ACL user may lack)
    local keys = {}
    for k, _ in pairs(c.took) do keys[#keys + 1] = k end
    for k, _ in pairs(c.unready) do if not c.took[k] then keys[#keys + 1] = k end end
    load(c, keys)
    for _, k in ipairs(keys) do
      if not seen[k] and redis.call('ZCARD', Q(k)) < window_of(c, k) / 2 then
        local n = tonumber(redis.call('ZSCORE', KEYS[19], k))
        if n and n > 0 then want(k) end
      end
    end
  end
  if #flag > 0 then redis.call('ZADD', KEYS[18], 'NX', unpack(flag)) end
  c.moves_waiting = redis.call('ZCARD', KEYS[18])
end
