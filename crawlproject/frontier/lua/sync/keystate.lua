-- sync/keystate.lua: each politeness key's state and override, read once per
-- call for all the keys it touches (load) and written back once at the end
-- (writeback.lua), and what they make of a key's next start.
-- Reads KEYS[11] kstate: field K -> "n|last|block|backoff|crawl delay|error
-- rate[|starts|history]" (the pace: pace.lua), '|K' -> K's override (mirrored from KEYS[12] by SET_LIMITS),
-- '||limits' (how many overrides; counted from KEYS[12] with HLEN and written
-- where missing or junk), '||qlen' and '||backlog' (read along, for
-- writeback.lua and backlog.lua).
-- Sets C.ST[k] {n, last, block, bo, cd, er, pc, ph}, C.LIM[k] {delay, conc, budget}
-- (parsed when first used), C.dirty (states to write back), C.reready (keys
-- whose ready time is computed again: their state was junk), C.qlen_raw/qlen_read;
-- counts junk.
local function sync_keystate(c)
  -- load() keeps each key's fields as read (RAW_ST, RAW_LIM: the string, or
  -- false when absent); they are parsed into ST[k] and LIM[k] when first used: a
  -- take reads a window of ready keys and often uses only the first of them.
  local ST, LIM, RAW_ST, RAW_LIM = {}, {}, {}, {}
  c.ST, c.LIM, c.RAW_ST, c.RAW_LIM, c.dirty, c.reready = ST, LIM, RAW_ST, RAW_LIM, {}, {}
  -- Whether any key has an override: kstate's field '||limits' counts them
  -- (SET_LIMITS keeps it), read with the first states a call loads, so a crawl
  -- without overrides pays neither a command nor a field per key for them.
  c.overrides = nil
  -- The partition's queue length is kstate's field '||qlen', read with the
  -- first states a call loads and written back with them: no command of its
  -- own in a call that reads and writes state anyway. qlen_raw is its value as
  -- read (false when absent), qlen_read whether it was read.
  c.qlen_raw, c.qlen_read, c.backlog_raw = false, false, false
  local def_delay, def_conc, def_budget = c.def_delay, c.def_conc, c.def_budget
  local DEFAULT_LIM = {delay = def_delay, conc = def_conc, budget = def_budget}   -- read only
  -- A state "n|last|block|backoff|crawl delay|error rate" is read field by
  -- field: a field that is not what this script writes (digits; the error
  -- rate may be missing, as older versions wrote it) is junk, read as 0, and
  -- the others are kept: junk in one field never lifts another's block. Values
  -- beyond what this script can have written are brought within it: a last
  -- start after now is now, a block at most BLOCK_HARD_MS from now, a backoff
  -- or crawl delay at most INTERVAL_HARD_MS, an error rate at most 1. Either
  -- way the key's state is written back mended (dirty) and counted (junk).
  setmetatable(ST, {__index = function(t, k)
    local s = RAW_ST[k]
    if s == nil then return nil end   -- not loaded
    local v = {n = 0, last = 0, block = 0, bo = 0, cd = 0, er = 0}
    if s then
      -- (the common case, a state this script wrote, with the pace's two fields
      -- (pace.lua) or without them, without a table or a closure)
      local n, la, bl, bo, cd, er, pc, ph = string.match(s,
        '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)$')
      if not n then n, la, bl, bo, cd, er = string.match(s, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|?(%d*)$') end
      if n and #s < 100 then
        n, la, bl, bo, cd, er = tonumber(n), tonumber(la), tonumber(bl), tonumber(bo),
                                tonumber(cd), tonumber(er) or 0
        pc, ph = tonumber(pc), tonumber(ph)
        if n <= 1000000000 and la <= now(c) and bl <= now(c) + BLOCK_HARD_MS
            and bo <= INTERVAL_HARD_MS and cd <= INTERVAL_HARD_MS and er <= 1000000
            and (pc == nil or (pc <= 1e12 and ph <= PACE_HISTORY_MS)) then
          v.n, v.last, v.block, v.bo, v.cd, v.er, v.pc, v.ph = n, la, bl, bo, cd, er, pc, ph
          rawset(t, k, v)
          return v
        end
      end
      local f, bad = fields_of(s, 8), 0
      if #f < 5 or #f == 7 or #f > 8 then bad = bad + 1 end
      local function field(i, name, hi, clamp)
        local x = count_of(f[i], 1e15)
        if x == nil then
          if f[i] ~= nil and not (i == 6 and f[i] == '') then bad = bad + 1 end
          return
        end
        if x > hi then x = clamp or hi; bad = bad + 1 end
        v[name] = x
      end
      field(1, 'n', 1000000000, 0)
      field(2, 'last', 1e15)
      field(3, 'block', 1e15)
      field(4, 'bo', INTERVAL_HARD_MS)
      field(5, 'cd', INTERVAL_HARD_MS)
      field(6, 'er', 1000000)
      if #f == 8 then   -- the pace: both fields or neither (then it starts again)
        field(7, 'pc', 1e12); field(8, 'ph', PACE_HISTORY_MS)
        if v.pc == nil or v.ph == nil then v.pc, v.ph = nil, nil end
      end
      if v.last > now(c) then v.last = now(c); bad = bad + 1 end
      if v.block > now(c) + BLOCK_HARD_MS then v.block = now(c) + BLOCK_HARD_MS; bad = bad + 1 end
      if bad > 0 then
        c.junk = c.junk + bad
        c.dirty[k] = true; c.reready[k] = true
      end
    end
    rawset(t, k, v)
    return v
  end})
  -- An override "delay ms|concurrency|source" or "delay ms|concurrency|budget|
  -- source" (mirrored in kstate as field '|K'): each field read on its own, an
  -- empty one or junk (not digits, a delay over a day, a budget over 10^15)
  -- leaves this node's setting in force for it, and junk is counted. (Mended by
  -- the next SET_LIMITS of the key, not here: the limits hash is the original.)
  setmetatable(LIM, {__index = function(t, k)
    local l = RAW_LIM[k]
    if l == nil then return nil end   -- not loaded
    local v = DEFAULT_LIM
    if l then
      local d, cc, b = string.match(l, '^(%d*)|(%d*)|[^|]*$')
      if not d then d, cc, b = string.match(l, '^(%d*)|(%d*)|(%d*)|[^|]*$') end
      if d and #l < 100 then
        d, cc, b = tonumber(d) or def_delay, tonumber(cc) or def_conc, tonumber(b) or def_budget
        if cc <= 0 or cc > 1000000000 then cc = 1000000000 end
        if d <= INTERVAL_HARD_MS and b <= 1e15 then
          v = {delay = d, conc = cc, budget = b}
          rawset(t, k, v)
          return v
        end
      end
      local f, bad = fields_of(l, 4), 0
      if #f < 3 or #f > 4 then bad = bad + 1 end
      local function field(i, hi, default)
        if f[i] == nil or f[i] == '' then return default end
        local x = count_of(f[i], hi)
        if x == nil then bad = bad + 1; return default end
        return x
      end
      local d = field(1, INTERVAL_HARD_MS, def_delay)
      local cc = field(2, 1e15, def_conc)
      if cc <= 0 then cc = 1000000000 end
      -- (an older override has no budget: its third field is the source)
      local b = #f == 4 and field(3, 1e15, def_budget) or def_budget
      if bad > 0 then c.junk = c.junk + bad end
      v = {delay = d, conc = math.min(cc, 1000000000), budget = b}
    end
    rawset(t, k, v)
    return v
  end})
end
local function load(c, keys)
  -- State and override of each key come from kstate: the override of key K
  -- is mirrored there as field '|K' (see SET_LIMITS).
  local RAW_ST, RAW_LIM = c.RAW_ST, c.RAW_LIM
  local need, seen = {}, {}
  for _, k in ipairs(keys) do
    if RAW_ST[k] == nil and not seen[k] then need[#need + 1] = k; seen[k] = true end
  end
  for i = 1, #need, 500 do
    local last = math.min(i + 499, #need)
    local fields, per = {}, c.overrides and 2 or 1
    for j = i, last do
      fields[#fields + 1] = need[j]
      if c.overrides then fields[#fields + 1] = '|' .. need[j] end
    end
    local n_own = #fields
    if c.overrides == nil then fields[#fields + 1] = '||limits' end
    local with_qlen = not c.qlen_read
    -- (the MongoDB tier's count rides along with the queue length)
    if with_qlen then fields[#fields + 1] = '||qlen'; fields[#fields + 1] = '||backlog' end
    local got = redis.call('HMGET', KEYS[11], unpack(fields))
    if with_qlen then
      c.qlen_raw, c.qlen_read, c.backlog_raw = got[#fields - 1], true, got[#fields]
    end
    if c.overrides == nil then
      local count = count_of(got[n_own + 1], 1e15)
      if count == nil then
        -- Not kept yet (the crawl's first call) or junk: from the limits.
        if got[n_own + 1] then c.junk = c.junk + 1 end
        count = redis.call('HLEN', KEYS[12])
        redis.call('HSET', KEYS[11], '||limits', count)
      end
      c.overrides = count > 0
      if c.overrides then
        -- This chunk's overrides, in the layout of the next chunks.
        local lf = {}
        for j = i, last do lf[#lf + 1] = '|' .. need[j] end
        local lv = redis.call('HMGET', KEYS[11], unpack(lf))
        local both = {}
        for j = 1, last - i + 1 do both[2 * j - 1] = got[j]; both[2 * j] = lv[j] end
        got, per = both, 2
      end
    end
    for j = i, last do
      local k = need[j]
      RAW_ST[k] = got[per * (j - i) + 1]
      RAW_LIM[k] = per == 2 and got[2 * (j - i) + 2] or false
    end
  end
end
local function interval(c, k)
  return math.max(c.LIM[k].delay, c.ST[k].cd, c.ST[k].bo)
end
-- The weight of one answer in K's error rate: 1 / the window, the window at
-- least K's concurrency (at most 100): the answers of the requests in flight
-- together are one sample, and a window shorter than them turns a few
-- transient 503s among them, or one node's answers reported in one call,
-- into a backoff of the whole site (issue 47).
local function err_weight_of(c, k)
  return math.min(c.err_weight, math.floor(1000000 / math.max(1, math.min(c.LIM[k].conc, 100))))
end
local function pad(c, iv)
  -- The safety margin added to an interval of IV ms: the node gives back an
  -- entry it could not start within it of the lease (the client's lag_allowed).
  -- A share of 0 turns it off (limits held at lease only).
  if iv <= 0 or c.margin <= 0 then return 0 end
  return math.max(iv * c.margin, c.margin_min)
end
local function next_start(c, k)
  -- The earliest start of K's next request: its interval after the last
  -- start, jittered as Scrapy jitters DOWNLOAD_DELAY (x uniform(1 - JITTER,
  -- 1 + JITTER)) but never shortened (a draw below 1 is the interval itself:
  -- half the intervals, so the mean is 1 + JITTER / 4 of it), plus the margin;
  -- and not before a block.
  local s = c.ST[k]
  local iv = interval(c, k)
  local gap = iv
  if iv > 0 and c.jitter > 0 then gap = iv * math.max(1, 1 + c.jitter * (2 * math.random() - 1)) end
  return math.max(s.last + gap + pad(c, iv), s.block)
end
local function earliest(c, k)
  -- When K may start again at the soonest (no jitter): what the take checks.
  local s = c.ST[k]
  local iv = interval(c, k)
  return math.max(s.last + iv + pad(c, iv), s.block)
end
local function sync_load_touched(c)
  -- Only the keys whose in-flight count or state this call changes are read
  -- here: a key that only got new entries joins the ready set as a hint (its
  -- politeness is checked when it is taken from).
  local keys = {}
  for _, a in ipairs(c.acks) do keys[#keys + 1] = member_key(a[1]) end
  for _, f in ipairs(c.fails) do keys[#keys + 1] = member_key(f[1]) end
  for _, m in ipairs(c.nacks) do keys[#keys + 1] = member_key(m) end
  for _, f in ipairs(c.feedback) do if f[1] ~= '' then keys[#keys + 1] = f[1] end end
  for _, m in ipairs(c.fetched) do keys[#keys + 1] = member_key(m) end
  for _, h in ipairs(c.handoffs) do keys[#keys + 1] = member_key(h[2]) end
  for _, r in ipairs(c.reserve) do keys[#keys + 1] = r[1] end
  load(c, keys)
end
