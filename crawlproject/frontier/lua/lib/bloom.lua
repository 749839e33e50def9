-- Shared Lua helpers: the sharded, scalable Bloom filter (uses lib/score: fmt, call_chunked).
-- Bloom helpers take the filter's meta key (from the caller's KEYS) and derive
-- its shard keys as <meta key>:<layer>:<shard>; shards of the next layer may
-- exist before the layer opens (the meta field 'ahead' counts them).
local TWO32 = 4294967296
local BLOOM_STEP_BYTES = 33554432  -- a next layer this small is made when it opens
local BLOOM_AHEAD_ROOM = 0.1       -- make the next layer from 90 % full

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
  -- each adding call makes at most one shard (<= 8 MiB at the default
  -- shard_bits, 2^26) of the next layer, counted in the 'ahead' field. A next
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

local function bloom_bits(key, m, layer, fps, indices, op)
  -- One BITFIELD per shard over the bits of FPS[INDICES] in LAYER (double
  -- hashing inside one shard; offsets below 2^32 stay exact in Lua numbers).
  -- OP 'GET' reads; 'SET' sets to 1 and returns the old bits. Returns
  -- {index -> true} for fingerprints whose k bits were all 1. (Hot: no table
  -- per fingerprint, lengths kept in counters.)
  local L = tostring(layer)
  local k, shards, per = tonumber(m['k' .. L]), tonumber(m['shards' .. L]), tonumber(m['bits' .. L])
  local set = op == 'SET'
  local sub = string.sub
  local ops, lens, owners, counts = {}, {}, {}, {}
  for _, i in ipairs(indices) do
    local fp = fps[i]
    local a, b = tonumber(sub(fp, 1, 8), 16), tonumber(sub(fp, 9, 16), 16)
    local c, d = tonumber(sub(fp, 17, 24), 16), tonumber(sub(fp, 25, 32), 16)
    local e = tonumber(sub(fp, 33, 40), 16)
    local h1 = (a + layer * c) % TWO32
    local h2 = (b + layer * d) % TWO32 % (per - 1) + 1
    local shard = (e + layer * a) % shards
    local o, n = ops[shard], lens[shard]
    if not o then o = {}; ops[shard] = o; n = 0; owners[shard] = {}; counts[shard] = 0 end
    if set then
      -- ('1', not 1: Redis formats every number argument with "%.17g", and
      -- this loop sends a thousand or more of them a call)
      for j = 0, k - 1 do
        o[n + 1] = 'SET'; o[n + 2] = 'u1'; o[n + 3] = (h1 + j * h2) % per; o[n + 4] = '1'
        n = n + 4
      end
    else
      for j = 0, k - 1 do
        o[n + 1] = 'GET'; o[n + 2] = 'u1'; o[n + 3] = (h1 + j * h2) % per
        n = n + 3
      end
    end
    lens[shard] = n
    local cnt = counts[shard] + 1
    counts[shard] = cnt
    owners[shard][cnt] = i
  end
  local full = {}
  for shard, args in pairs(ops) do
    local bits = call_chunked('BITFIELD', key .. ':' .. L .. ':' .. shard, args, set and 4 or 3)
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
