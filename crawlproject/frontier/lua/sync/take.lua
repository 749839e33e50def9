-- sync/take.lua: the take: from keys whose time has come (KEYS[1] ready,
-- oldest-ready first, each once), within each key's concurrency and interval,
-- and this node's share of a key while others are wanting (contract.lua).
-- Reads KEYS[1], KEYS[11] (load), KEYS[16] wanting and KEYS[4] nodes (the
-- share), KEYS[3] (HLEN, a count above every lease); pops the queues
-- KEYS[13]:<key>; lease_out reads KEYS[2] payloads and writes KEYS[3],
-- KEYS[14]:<node>, KEYS[4] (this node's deadline, unless renewed already).
-- Sets C.taken {member, payload, ...}, C.capped, C.capped_keys,
-- C.polite_keys, C.unready, C.later, C.passed, C.n_passed; moves C.ST (a
-- start: its last and its pace, pace.lua), C.took,
-- C.qdelta, C.missing, C.polite_budget.
local SHARE_WINDOW = 1000
local function lease_out(c, popped, value, out)
  -- Lease POPPED (taken out of their queues) to this node as VALUE, appending
  -- member, payload to OUT. A member without payload is set aside in the
  -- invalid list and returned (its key's count is the caller's to mend).
  local owned, held, lost = {}, {}, {}
  for i = 1, #popped, 500 do
    local last = math.min(i + 499, #popped)
    local payloads = redis.call('HMGET', KEYS[2], unpack(popped, i, last))
    for j = i, last do
      local member, payload = popped[j], payloads[j - i + 1]
      if payload then
        out[#out + 1] = member; out[#out + 1] = payload
        owned[#owned + 1] = member; owned[#owned + 1] = value
        held[#held + 1] = member
      else
        lost[#lost + 1] = member
        c.missing = c.missing + 1
        keep_record(c, 'invalid', cjson.encode({member = member, reason = 'no payload',
                                                node = c.node, at = now(c) / 1000}))
      end
    end
  end
  if #owned > 0 then
    call_chunked('HSET', KEYS[3], owned, 2)
    call_chunked('SADD', HELD(c.node), held, 1)
    if not (c.maintenance or c.registered) then
      redis.call('ZADD', KEYS[4], fmt(now(c) + c.ttl), c.node)
    end
  end
  return lost
end
local function note_capped(c, k)
  c.capped = c.capped + 1
  if #c.capped_keys < 64 then c.capped_keys[#c.capped_keys + 1] = k end
end
local function room_for_me(c, sh, k)
  -- How many more slots of key K this node may take now (nil: no limit).
  if sh.sharing == nil then
    local wanting = redis.call('ZRANGEBYSCORE', KEYS[16], fmt(now(c) - SHARE_WINDOW), '+inf')
    for _, n in ipairs(wanting) do if n ~= c.node then sh.others = sh.others + 1 end end
    -- (marks are read from Redis: never more sharers than registered nodes)
    if sh.others > 0 then sh.others = math.min(sh.others, redis.call('ZCARD', KEYS[4]) - 1) end
    sh.sharing = sh.others > 0
    if sh.sharing then
      -- the slots held: leased here, download not ended, not a reserve
      local held, flags = leases_of(c, c.node)
      for i, m in ipairs(held) do
        local mk = not flags[i] and member_key(m)
        if mk then sh.mine[mk] = (sh.mine[mk] or 0) + 1 end
      end
    end
  end
  if not sh.sharing then return nil end
  local share = math.ceil(math.min(c.LIM[k].conc, 1000000) / (1 + sh.others))
  return math.max(0, share - (sh.mine[k] or 0))
end
local function sync_take(c)
  c.taken, c.capped, c.capped_keys, c.polite_keys = {}, 0, {}, {}
  c.unready, c.later, c.passed, c.n_passed = {}, {}, {}, 0
  if not (c.take_n > 0 and c.ttl > 0) then return end
  local ST, LIM, unready, later = c.ST, c.LIM, c.unready, c.later
  local members, inflight_total = {}, nil
  local sh = {sharing = nil, others = 0, mine = {}}
  local want, offset = c.take_n, 0
  for _ = 1, 10 do
    if want <= 0 then break end
    local ks = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now(c)), 'LIMIT', offset, want)
    if #ks == 0 then break end
    offset = offset + #ks
    load(c, ks)
    for _, k in ipairs(ks) do
      if want <= 0 then break end
      local s, l = ST[k], LIM[k]
      if s.n >= l.conc then
        -- A count above every lease there is was written by someone else: the
        -- sweep recounts it, but an idle cluster may make no sweep, and the
        -- key would wait for ever.
        inflight_total = inflight_total or redis.call('HLEN', KEYS[3])
        if s.n > inflight_total then
          s.n = inflight_total; c.dirty[k] = true; c.junk = c.junk + 1
        end
      end
      local due = earliest(c, k)
      if s.n >= l.conc then
        unready[k] = true
        note_capped(c, k)        -- at its concurrency: the node reports ends at once
      elseif due > now(c) then
        later[#later + 1] = fmt(due); later[#later + 1] = k   -- an early hint: wait its turn
      else
        local count = math.min(want, l.conc - s.n)
        local polite = interval(c, k) > 0
        if polite then count = math.min(1, c.polite_budget) end
        local room = room_for_me(c, sh, k)
        local held_back = room ~= nil and room < count
        if held_back then count = room end
        local popped = count > 0 and redis.call('ZPOPMIN', Q(k), count) or {}
        if (polite or held_back) and count == 0 then popped = nil end
        if popped == nil then
          -- no start budget left for polite keys in this call, or this node
          -- holds its share of the key: it stays ready (for the others)
          if held_back then c.passed[k] = true; c.n_passed = c.n_passed + 1 end
        elseif #popped == 0 then
          unready[k] = true      -- its queue ran empty: out of the ready set
        else
          local got, bad = 0, {}
          for i = 1, #popped, 2 do
            if well_formed(popped[i], k) then members[#members + 1] = popped[i]; got = got + 1
            else bad[#bad + 1] = popped[i] end
          end
          if #bad > 0 then set_aside(c, bad, 'malformed member'); c.qdelta = c.qdelta - #bad end
          if got > 0 then
            if polite then
              c.polite_budget = c.polite_budget - got
              c.polite_keys[#c.polite_keys + 1] = k
              c.polite_keys[#c.polite_keys + 1] = interval(c, k)
            end
            s.n = s.n + got; moved_last(c, s, now(c), got); c.dirty[k] = true; c.took[k] = true
            if s.n >= l.conc then note_capped(c, k) end   -- filled up to its concurrency
            want = want - got
            c.qdelta = c.qdelta - got
          end
        end
      end
    end
  end
  for _, member in ipairs(lease_out(c, members, c.node, c.taken)) do
    local k = member_key(member)
    ST[k].n = math.max(0, ST[k].n - 1)
  end
end
