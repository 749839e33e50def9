"""Lua scripts of the frontier, each with its KEYS/ARGV/return contract.

Every state change of the shared frontier is one atomic script call. Numbers
that may exceed 14 significant digits are formatted with ``%.0f`` before they
are handed to Redis (Lua's default number formatting would round them).

Entry members are ``"<priority>:<seq>"``; the queue score is
``-priority * 2^40 + seq`` so ``ZPOPMIN`` yields the highest priority first and
FIFO among equal priorities. The member carries its priority so that any
script can put an entry back in its place without another lookup.

Keys: every key a script touches is in its KEYS, or derived from a key in its
KEYS by one documented rule, under the same hash tag (so the script stays in
one Redis Cluster slot): the shards of a Bloom filter are
``<meta key>:<layer>:<shard>`` (:func:`crawlproject.keys.bloom_shard_key`),
derived from the filter's meta key in KEYS, never from an ARGV prefix.

Bloom growth never blocks Redis for long: while the newest layer nears
capacity, each adding call makes at most one shard (<= 32 MiB at the default
``shard_bits``) of the next layer, so the call that opens a big layer finds it
ready. A call can still allocate more at once: the first call (layer 0 is
made whole: over 32 MiB when ``capacity`` exceeds ~18M at 1e-3), a call that
opens a layer of at most 32 MiB (one step anyway), a batch that fills the
newest layer faster than one shard per call, and any shard larger than
``shard_bits = 2**28`` (one shard is one allocation). Each MiB allocated costs
about 1 ms of blocking (measured on this project's 2-core VMs with Redis 6.2
and 7.0: the pages are touched once, zero-filled); a smaller
``DUPEFILTER_SHARD_BITS`` makes smaller steps.
"""

# Redis server time in ms (or the time a test passes in).
_CLOCK = r"""
local function server_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# Shared Lua helpers: scoring and the sharded, scalable Bloom filter.
# Bloom helpers take the filter's meta key (from the caller's KEYS) and derive
# its shard keys as <meta key>:<layer>:<shard>; shards of the next layer may
# exist before the layer opens (the meta field 'ahead' counts them).
_LIB = _CLOCK + r"""
local TWO32 = 4294967296
local SHIFT = 1099511627776
local BLOOM_STEP_BYTES = 33554432  -- a next layer this small is made when it opens
local BLOOM_AHEAD_ROOM = 0.1       -- make the next layer from 90 % full

local function fmt(x) return string.format('%.0f', x) end

local function score(member)
  local p, s = string.match(member, '^(-?%d+):(%d+)$')
  return fmt(-tonumber(p) * SHIFT + tonumber(s))
end

local function call_chunked(cmd, key, args, width, counts)
  -- Run CMD key args... in chunks of whole WIDTH-sized groups (unpack limits).
  -- Returns the concatenated array replies (or, with COUNTS, the integer ones).
  local out = {}
  local step = width * 600
  for i = 1, #args, step do
    local last = math.min(i + step - 1, #args)
    local res = redis.call(cmd, key, unpack(args, i, last))
    if type(res) == 'table' then
      for _, v in ipairs(res) do out[#out + 1] = v end
    elseif counts then
      out[#out + 1] = res
    end
  end
  return out
end

local function bloom_meta(key)
  local raw = redis.call('HGETALL', key)
  local m = {}
  for i = 1, #raw, 2 do m[raw[i]] = raw[i + 1] end
  return m
end

local function prev_prime(n)
  -- Double hashing cycles early when the step shares a factor with the
  -- table size: a prime size makes every step visit distinct bits.
  if n % 2 == 0 then n = n - 1 end
  while n > 3 do
    local prime, d = true, 3
    while d * d <= n do
      if n % d == 0 then prime = false; break end
      d = d + 2
    end
    if prime then return n end
    n = n - 2
  end
  return n
end

local function fitted_bytes(bytes)
  -- Redis allocates a string in the allocator's next size class (above a few
  -- KiB: 2^k times 1, 1.25, 1.5, 1.75); use every byte of that class (minus
  -- room for the string header), which lowers the FP rate for free.
  local need = bytes + 16
  local base = 2 ^ math.floor(math.log(need) / math.log(2))
  for j = 4, 8 do
    if base * j / 4 >= need then return base * j / 4 - 16 end
  end
  return bytes
end

local function bloom_layer_params(cap, p, shard_bits)
  -- A layer's shape, fixed by its capacity and error rate alone (so a shard
  -- made ahead of time is exactly the one the layer opens with): hash count
  -- k, shard count, bits per shard (a prime), bytes per shard string.
  local ln2 = math.log(2)
  local bits = math.ceil(-cap * math.log(p) / (ln2 * ln2))
  local k = math.max(1, math.floor(bits / cap * ln2 + 0.5))
  local max_bytes = math.floor(shard_bits / 8) - 16
  local shards = math.ceil(bits / 8 / max_bytes)
  local bytes = math.min(max_bytes, fitted_bytes(math.ceil(bits / shards / 8)))
  local per = prev_prime(math.max(67, bytes * 8))
  return k, shards, per, math.ceil(per / 8)
end

local function bloom_next(m)
  -- Capacity and error rate of the layer after the newest one.
  local L = tostring(tonumber(m['layers']) - 1)
  return tonumber(m['cap' .. L]) * tonumber(m['growth']),
         tonumber(m['p' .. L]) * tonumber(m['tightening'])
end

local function bloom_make_shard(key, layer, shard, nbytes)
  -- SETRANGE on a missing key makes Redis allocate the string once, at its
  -- final size, zero-filled, with no copy through Lua (grown bit by bit,
  -- Redis 6 over-allocates a string up to twice its length). A key already
  -- there is a leftover the layer table does not count (its meta key was
  -- deleted alone): replaced, so that no stale bit is reused.
  local shard_key = key .. ':' .. layer .. ':' .. shard
  redis.call('DEL', shard_key)
  redis.call('SETRANGE', shard_key, nbytes - 1, '\0')
end

local function bloom_add_layer(key, m, layer, cap, p, shard_bits)
  local k, shards, per, nbytes = bloom_layer_params(cap, p, shard_bits)
  local L = tostring(layer)
  -- Shards not made ahead (layer 0, a layer of at most one step, or a burst
  -- that filled the newest layer faster than one shard per call) are made
  -- now, in this call: about 1 ms of blocking per MiB.
  for shard = tonumber(m['ahead'] or 0), shards - 1 do
    bloom_make_shard(key, L, shard, nbytes)
  end
  redis.call('HDEL', key, 'ahead')
  m['ahead'] = nil
  redis.call('HSET', key, 'layers', layer + 1, 'cap' .. L, fmt(cap), 'p' .. L, tostring(p),
             'k' .. L, k, 'shards' .. L, shards, 'bits' .. L, fmt(per), 'n' .. L, 0)
  m['layers'] = tostring(layer + 1)
  m['cap' .. L] = fmt(cap); m['p' .. L] = tostring(p); m['k' .. L] = tostring(k)
  m['shards' .. L] = tostring(shards); m['bits' .. L] = fmt(per); m['n' .. L] = '0'
end

local function bloom_make_ahead(key, m, batch)
  -- Growth must never block Redis: while the newest layer nears capacity,
  -- each adding call makes at most one shard (<= 32 MiB at the default
  -- shard_bits) of the next layer, counted in the 'ahead' field. A next
  -- layer of at most BLOOM_STEP_BYTES is left to the call that opens it:
  -- one step either way, and no memory is spent before it is needed.
  local L = tostring(tonumber(m['layers']) - 1)
  local cap, n = tonumber(m['cap' .. L]), tonumber(m['n' .. L])
  if n < cap / 2 then return end  -- cheap exit before computing the shape
  local ncap, np = bloom_next(m)
  local _, shards, _, nbytes = bloom_layer_params(ncap, np, tonumber(m['shard_bits']))
  local ahead = tonumber(m['ahead'] or 0)
  if ahead >= shards or shards * nbytes <= BLOOM_STEP_BYTES then return end
  -- From 90 % full, or earlier when, at this call's batch size, fewer than
  -- two calls per missing shard are left before the layer is full.
  if cap - n > math.max(cap * BLOOM_AHEAD_ROOM, 2 * (shards - ahead) * batch) then return end
  bloom_make_shard(key, tonumber(L) + 1, ahead, nbytes)
  m['ahead'] = tostring(redis.call('HINCRBY', key, 'ahead', 1))
end

local function bloom_open(key, cap, p, growth, tight, shard_bits)
  local m = bloom_meta(key)
  if m['layers'] == nil then
    redis.call('HSET', key, 'capacity', fmt(cap), 'error_rate', tostring(p),
               'growth', tostring(growth), 'tightening', tostring(tight),
               'shard_bits', fmt(shard_bits))
    m['capacity'] = fmt(cap); m['error_rate'] = tostring(p); m['growth'] = tostring(growth)
    m['tightening'] = tostring(tight); m['shard_bits'] = fmt(shard_bits)
    bloom_add_layer(key, m, 0, cap, p * (1 - tight), shard_bits)
  end
  return m
end

local function fp_words(fp)
  return tonumber(string.sub(fp, 1, 8), 16), tonumber(string.sub(fp, 9, 16), 16),
         tonumber(string.sub(fp, 17, 24), 16), tonumber(string.sub(fp, 25, 32), 16),
         tonumber(string.sub(fp, 33, 40), 16)
end

local function bloom_positions(fp, m, layer)
  -- Double hashing inside one shard of LAYER; returns shard, {bit offsets}.
  -- (Offsets are below 2^32, so Lua's number formatting keeps them exact.)
  local L = tostring(layer)
  local k, shards, per = tonumber(m['k' .. L]), tonumber(m['shards' .. L]), tonumber(m['bits' .. L])
  local a, b, c, d, e = fp_words(fp)
  local h1 = (a + layer * c) % TWO32
  local h2 = (b + layer * d) % TWO32 % (per - 1) + 1
  local shard = (e + layer * a) % shards
  local pos = {}
  for j = 0, k - 1 do pos[j + 1] = (h1 + j * h2) % per end
  return shard, pos
end

local function bloom_bits(key, m, layer, fps, indices, op)
  -- One BITFIELD per shard over the bits of FPS[INDICES] in LAYER.
  -- OP 'GET' reads; 'SET' sets to 1 and returns the old bits. Returns
  -- {index -> true} for fingerprints whose k bits were all 1.
  local ops, owners = {}, {}
  for _, i in ipairs(indices) do
    local shard, pos = bloom_positions(fps[i], m, layer)
    local o = ops[shard]
    if not o then o = {}; ops[shard] = o; owners[shard] = {} end
    for _, p in ipairs(pos) do
      o[#o + 1] = op; o[#o + 1] = 'u1'; o[#o + 1] = p
      if op == 'SET' then o[#o + 1] = 1 end
    end
    owners[shard][#owners[shard] + 1] = i
  end
  local k = tonumber(m['k' .. tostring(layer)])
  local full = {}
  for shard, args in pairs(ops) do
    local bits = call_chunked('BITFIELD', key .. ':' .. layer .. ':' .. shard, args,
                              op == 'SET' and 4 or 3)
    for n, i in ipairs(owners[shard]) do
      local all = true
      for j = (n - 1) * k + 1, n * k do
        if bits[j] == 0 then all = false; break end
      end
      if all then full[i] = true end
    end
  end
  return full
end

local function bloom_check_add(key, m, fps, dry)
  -- FPS: {index -> 40-hex fingerprint}. Returns {index -> true} for the new
  -- ones (added to the newest layer unless DRY), and how many were added.
  local layers = tonumber(m['layers'])
  local todo = {}
  for i, _ in pairs(fps) do todo[#todo + 1] = i end
  -- Older layers are full: only read them. The newest layer is read and
  -- written in the same pass (BITFIELD SET returns the old bits).
  for layer = 0, dry and layers - 1 or layers - 2 do
    local full = bloom_bits(key, m, layer, fps, todo, 'GET')
    local rest = {}
    for _, i in ipairs(todo) do if not full[i] then rest[#rest + 1] = i end end
    todo = rest
  end
  local new = {}
  if dry then
    for _, i in ipairs(todo) do new[i] = true end
    return new, 0
  end
  -- When the newest layer fills, open the next one mid-batch, so that no
  -- layer holds more than its capacity (that would raise its FP rate).
  local idx, added = 1, 0
  while idx <= #todo do
    local last = tonumber(m['layers']) - 1
    local L = tostring(last)
    local cap, n = tonumber(m['cap' .. L]), tonumber(m['n' .. L])
    if n >= cap then
      local ncap, np = bloom_next(m)
      bloom_add_layer(key, m, last + 1, ncap, np, tonumber(m['shard_bits']))
    else
      local chunk = {}
      for j = idx, math.min(#todo, idx + (cap - n) - 1) do chunk[#chunk + 1] = todo[j] end
      idx = idx + #chunk
      local full = bloom_bits(key, m, last, fps, chunk, 'SET')
      local count = 0
      for _, i in ipairs(chunk) do
        if not full[i] then new[i] = true; count = count + 1 end
      end
      if count > 0 then
        m['n' .. L] = tostring(redis.call('HINCRBY', key, 'n' .. L, count))
        added = added + count
      end
    end
  end
  bloom_make_ahead(key, m, #todo)
  return new, added
end
"""

SYNC = _LIB + r"""
-- SYNC: one round trip of a node with the frontier.
-- KEYS[1] queue (zset)      KEYS[2] payloads (hash)   KEYS[3] inflight (hash member->node)
-- KEYS[4] nodes (zset node->lease deadline ms)        KEYS[5] delayed (zset member->due ms)
-- KEYS[6] dead (list)       KEYS[7] invalid (list)    KEYS[8] seq (string)
-- KEYS[9] bloom meta (hash); its shards are KEYS[9]:<layer>:<shard> (derived)
-- KEYS[10] cluster stats (hash)
-- ARGV[1] now in ms, or '' for Redis server time      ARGV[2] node id
-- ARGV[3] lease ttl ms (0 = this node leaves: drop its heartbeat)
-- ARGV[4] how many entries to take
-- ARGV[5] flags: 'm' = maintenance (renew this node's lease, reclaim the leases
--         of expired nodes, report delayed/inflight sizes), 'd' = promote due
--         delayed entries, 's' = sweep: also reclaim entries whose owner is not
--         a registered node (implies 'm'). A node sends 'm' at least every
--         heartbeat interval and whenever it is idle, so busy calls stay cheap.
-- ARGV[6..10] bloom capacity, error rate, growth, tightening, shard bits
-- ARGV[11] most records kept in the dead list  ARGV[12] ... in the invalid list
-- then five sections, each a count followed by its items:
--   adopt: n x (member, former owner)    (leases this node took under a former
--                                          id of its own: now held under this id)
--   add:  n x (fingerprint hex or '' for no dedupe, priority, payload, delay ms or 0)
--   ack:  n x member                     (done: forget it)
--   fail: n x (member, 'dead'|'invalid', record)   (forget it, keep record)
--   nack: n x member                     (not started: back to the queue)
-- Ownership: ack, fail and nack change an entry only if this node holds its
-- lease; a late ack or fail of an entry whose lease expired and that is back
-- in the queue (not leased by anyone) also removes it (the work was done).
-- Anything else (another node holds it now, or it is gone) is a stale call:
-- counted, nothing changed. Every take registers the node with a deadline, so
-- no entry is ever held by an id that cannot expire.
-- Returns {taken = {member, payload, ...}, added, duplicates, queue length,
--          delayed length or -1, inflight length or -1, reclaimed, now or -1,
--          stale calls, queue members without payload set aside, records trimmed}
local node, ttl, take_n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local sweep = string.find(ARGV[5], 's', 1, true) ~= nil
local maintenance = sweep or string.find(ARGV[5], 'm', 1, true) ~= nil
local promote = maintenance or string.find(ARGV[5], 'd', 1, true) ~= nil
local dead_max, invalid_max = tonumber(ARGV[11]), tonumber(ARGV[12])
local now_cache = nil
local function now()
  if now_cache == nil then now_cache = server_now(ARGV[1]) end
  return now_cache
end
local trimmed = 0
local function keep_record(kind, record)
  -- Dead letters and invalid payloads are kept for operators, the newest
  -- first, up to a cap; what falls off the end is counted.
  local key, cap = KEYS[6], dead_max
  if kind == 'invalid' then key, cap = KEYS[7], invalid_max end
  local len = redis.call('LPUSH', key, record)
  if len > cap then
    redis.call('LTRIM', key, 0, cap - 1)
    redis.call('HINCRBY', KEYS[10], kind .. '_trimmed', len - cap)
    trimmed = trimmed + len - cap
  end
end
local pos = 13

-- adopt: after a failed call a node changes its id (entries a lost reply may
-- have leased to the old id are unknown to it and must come back when that id
-- expires); the entries it does know it holds move to the new id.
local n_adopt = tonumber(ARGV[pos]); pos = pos + 1
for i = 1, n_adopt do
  local member, former = ARGV[pos], ARGV[pos + 1]
  pos = pos + 2
  if redis.call('HGET', KEYS[3], member) == former then
    redis.call('HSET', KEYS[3], member, node)
  end
end
if n_adopt > 0 and ttl > 0 then redis.call('ZADD', KEYS[4], fmt(now() + ttl), node) end

-- add: dedupe (Bloom) and enqueue in the same atomic step
local n_add = tonumber(ARGV[pos]); pos = pos + 1
local entries, fps = {}, {}
for i = 1, n_add do
  entries[i] = {ARGV[pos], tonumber(ARGV[pos + 1]), ARGV[pos + 2], tonumber(ARGV[pos + 3])}
  if ARGV[pos] ~= '' then fps[i] = ARGV[pos] end
  pos = pos + 4
end
local added, dups = 0, 0
if n_add > 0 then
  local new = {}
  if next(fps) ~= nil then
    local m = bloom_open(KEYS[9], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]),
                         tonumber(ARGV[9]), tonumber(ARGV[10]))
    new = bloom_check_add(KEYS[9], m, fps)
  end
  local keep = {}
  for i = 1, n_add do
    if entries[i][1] == '' or new[i] then keep[#keep + 1] = entries[i] end
  end
  added, dups = #keep, n_add - #keep
  if added > 0 then
    local seq = redis.call('INCRBY', KEYS[8], added) - added
    local qargs, dargs, pargs = {}, {}, {}
    for j, e in ipairs(keep) do
      local member = tostring(e[2]) .. ':' .. fmt(seq + j)
      pargs[#pargs + 1] = member; pargs[#pargs + 1] = e[3]
      if e[4] > 0 then
        dargs[#dargs + 1] = fmt(now() + e[4]); dargs[#dargs + 1] = member
      else
        qargs[#qargs + 1] = score(member); qargs[#qargs + 1] = member
      end
    end
    call_chunked('HSET', KEYS[2], pargs, 2)
    if #qargs > 0 then call_chunked('ZADD', KEYS[1], qargs, 2) end
    if #dargs > 0 then call_chunked('ZADD', KEYS[5], dargs, 2) end
  end
end

local stale = 0
local function owned_or_requeued(member)
  -- True when this call may finish MEMBER: this node holds it, or nobody
  -- does and it went back to the queue (then it is taken out of the queue).
  local owner = redis.call('HGET', KEYS[3], member)
  if owner == node then
    redis.call('HDEL', KEYS[3], member)
    return true
  end
  if not owner and redis.call('ZREM', KEYS[1], member) == 1 then return true end
  stale = stale + 1
  return false
end

-- ack
local n = tonumber(ARGV[pos]); pos = pos + 1
for i = 1, n do
  local member = ARGV[pos]; pos = pos + 1
  if owned_or_requeued(member) then redis.call('HDEL', KEYS[2], member) end
end

-- fail
n = tonumber(ARGV[pos]); pos = pos + 1
for i = 1, n do
  local member, kind, record = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2]
  pos = pos + 3
  if owned_or_requeued(member) then
    redis.call('HDEL', KEYS[2], member)
    keep_record(kind, record)
  end
end

-- nack
n = tonumber(ARGV[pos]); pos = pos + 1
for i = 1, n do
  local member = ARGV[pos]; pos = pos + 1
  if redis.call('HGET', KEYS[3], member) == node then
    redis.call('HDEL', KEYS[3], member)
    redis.call('ZADD', KEYS[1], score(member), member)
  else
    stale = stale + 1
  end
end

-- maintenance: renew this node's lease, then reclaim expired nodes' leases
local reclaimed = 0
if maintenance or ttl == 0 then
  if ttl > 0 then
    redis.call('ZADD', KEYS[4], fmt(now() + ttl), node)
  else
    redis.call('ZREM', KEYS[4], node)
  end
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', fmt(now()))
  if #expired > 0 or sweep then
    local gone = {}
    for _, nd in ipairs(expired) do gone[nd] = true end
    local flat = redis.call('HGETALL', KEYS[3])
    local back, drop = {}, {}
    for i = 1, #flat, 2 do
      local owner = flat[i + 1]
      if gone[owner] == nil then
        gone[owner] = sweep and redis.call('ZSCORE', KEYS[4], owner) == false
      end
      if gone[owner] then
        back[#back + 1] = score(flat[i]); back[#back + 1] = flat[i]
        drop[#drop + 1] = flat[i]
      end
    end
    if #drop > 0 then
      call_chunked('HDEL', KEYS[3], drop, 1)
      call_chunked('ZADD', KEYS[1], back, 2)
    end
    if #expired > 0 then call_chunked('ZREM', KEYS[4], expired, 1) end
    reclaimed = #drop
  end
end

-- delayed entries whose time has come go back to the queue
if promote then
  local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', fmt(now()), 'LIMIT', 0, 1000)
  if #due > 0 then
    local qargs = {}
    for _, member in ipairs(due) do qargs[#qargs + 1] = score(member); qargs[#qargs + 1] = member end
    call_chunked('ZADD', KEYS[1], qargs, 2)
    call_chunked('ZREM', KEYS[5], due, 1)
  end
end

-- take (every take registers this node, so its leases can always expire)
local taken, missing = {}, 0
if take_n > 0 and ttl > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], take_n)
  if #popped > 0 then
    local members = {}
    for i = 1, #popped, 2 do members[#members + 1] = popped[i] end
    local payloads = redis.call('HMGET', KEYS[2], unpack(members))
    local owned = {}
    for i, member in ipairs(members) do
      if payloads[i] then
        taken[#taken + 1] = member; taken[#taken + 1] = payloads[i]
        owned[#owned + 1] = member; owned[#owned + 1] = node
      else
        missing = missing + 1
        keep_record('invalid', cjson.encode({member = member, reason = 'no payload',
                                             node = node, at = now() / 1000}))
      end
    end
    if #owned > 0 then
      call_chunked('HSET', KEYS[3], owned, 2)
      redis.call('ZADD', KEYS[4], fmt(now() + ttl), node)
    end
  end
end

local delayed_len, inflight_len = -1, -1
if maintenance then
  delayed_len = redis.call('ZCARD', KEYS[5])
  inflight_len = redis.call('HLEN', KEYS[3])
end
return {taken, added, dups, redis.call('ZCARD', KEYS[1]), delayed_len, inflight_len,
        reclaimed, now_cache and fmt(now_cache) or -1, stale, missing, trimmed}
"""

BLOOM_ADD = _LIB + r"""
-- BLOOM_ADD: check-and-add fingerprints (the standalone dupefilter).
-- KEYS[1] bloom meta (hash); its shards are KEYS[1]:<layer>:<shard> (derived)
-- ARGV[1..5] capacity, error rate, growth, tightening, shard bits
-- ARGV[6] 'add' (check-and-add) or 'check' (read only); ARGV[7..] 40-hex fingerprints
-- Returns one integer per fingerprint: 1 = new (added unless 'check'), 0 = seen before.
local m = bloom_open(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                     tonumber(ARGV[4]), tonumber(ARGV[5]))
local fps = {}
for i = 7, #ARGV do fps[i - 6] = ARGV[i] end
local new = bloom_check_add(KEYS[1], m, fps, ARGV[6] == 'check')
local out = {}
for i = 1, #ARGV - 6 do out[i] = new[i] and 1 or 0 end
return out
"""

REPLAY_DEAD = _LIB + r"""
-- REPLAY_DEAD: put dead letters back into the queue.
-- KEYS[1] dead (list)  KEYS[2] queue (zset)  KEYS[3] payloads (hash)  KEYS[4] seq
-- ARGV: n x (dead record as stored, payload to queue, priority)
-- Each record is removed from the dead list first: a record another replay
-- already took (or that an operator deleted) is skipped, so two replays
-- running at once never queue the same dead letter twice.
-- Returns the number replayed.
local replayed = 0
for i = 1, #ARGV, 3 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    local prio = math.max(-4095, math.min(4095, math.floor(tonumber(ARGV[i + 2]) or 0)))
    local member = tostring(prio) .. ':' .. fmt(redis.call('INCR', KEYS[4]))
    redis.call('HSET', KEYS[3], member, ARGV[i + 1])
    redis.call('ZADD', KEYS[2], score(member), member)
    replayed = replayed + 1
  end
end
return replayed
"""

CLAIM_SEEDS = _CLOCK + r"""
-- CLAIM_SEEDS: take seeds, keeping each as a claim until the requests made from
-- it are safely in the frontier; expired claims (their node died) go back first.
-- KEYS[1] seed key (list | set | zset)   KEYS[2] claims (hash id -> seed)
-- KEYS[3] claim deadlines (zset id -> ms) KEYS[4] claim counter (string)
-- (KEYS[2..4] are tagged {<seed key>}, so all four share the seed key's slot.)
-- ARGV[1] 'list' | 'set' | 'zset'  ARGV[2] how many  ARGV[3] claim ttl ms
-- ARGV[4] now in ms, or '' for Redis server time
-- Returns {restored count, id1, seed1, id2, seed2, ...}
local now = server_now(ARGV[4])
local kind, count = ARGV[1], tonumber(ARGV[2])
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now), 'LIMIT', 0, 500)
for _, id in ipairs(expired) do
  local seed = redis.call('HGET', KEYS[2], id)
  if seed then
    if kind == 'list' then redis.call('RPUSH', KEYS[1], seed)
    elseif kind == 'set' then redis.call('SADD', KEYS[1], seed)
    else
      local score, raw = string.match(seed, '^([^\n]*)\n(.*)$')
      redis.call('ZADD', KEYS[1], score, raw)
    end
  end
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local got = {}
if kind == 'list' then
  got = redis.call('RPOP', KEYS[1], count) or {}
elseif kind == 'set' then
  got = redis.call('SPOP', KEYS[1], count) or {}
else
  local flat = redis.call('ZPOPMAX', KEYS[1], count)
  for i = 1, #flat, 2 do got[#got + 1] = flat[i + 1] .. '\n' .. flat[i] end
end
local out = {#expired}
if type(got) ~= 'table' or #got == 0 then return out end
local last = redis.call('INCRBY', KEYS[4], #got)
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
local fields, scores = {}, {}
for i, seed in ipairs(got) do
  local id = tostring(last - #got + i)
  fields[#fields + 1] = id; fields[#fields + 1] = seed
  scores[#scores + 1] = deadline; scores[#scores + 1] = id
  out[#out + 1] = id
  out[#out + 1] = seed
end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[3], unpack(scores))
return out
"""

RENEW_CLAIMS = _CLOCK + r"""
-- RENEW_CLAIMS: a live node still holds these seed claims: push their deadline.
-- KEYS[1] claim deadlines (zset id -> ms)
-- ARGV[1] claim ttl ms  ARGV[2] now in ms, or '' for Redis server time  ARGV[3..] claim ids
-- Returns how many claims were renewed (claims already put back are not revived).
local deadline = string.format('%.0f', server_now(ARGV[2]) + tonumber(ARGV[1]))
local renewed = 0
for i = 3, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
end
return renewed
"""
