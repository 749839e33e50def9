-- sync/enqueue.lua: the adds, deduplicated (Bloom) and queued in the same
-- atomic step.
-- Reads/writes the Bloom filter KEYS[9] (and its shards KEYS[9]:<layer>:<shard>),
-- ARGV[6..10] its parameters; KEYS[8] seq (numbering), KEYS[2] payloads,
-- the queues KEYS[13]:<key> (due adds), KEYS[5] delayed (adds with a delay).
-- Sets C.added, C.dups, C.budget_refused/skipped (budgets.lua); marks each
-- queued key touched and adds to C.qdelta.
local function sync_enqueue(c)
  c.added, c.dups, c.budget_refused, c.budget_skipped = 0, 0, 0, 0
  local n_add, entries = c.n_add, c.entries
  if n_add == 0 then return end
  local new = {}
  if next(c.fps) ~= nil then
    local m = bloom_open(KEYS[9], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]),
                         tonumber(ARGV[9]), tonumber(ARGV[10]))
    new = bloom_check_add(KEYS[9], m, c.fps)
  end
  local keep, forced = {}, c.forced
  for i = 1, n_add do
    local f = ARGV[entries[i] + 1]
    if f == '' or f == '+' or new[i] or forced[i] then keep[#keep + 1] = entries[i] end
  end
  c.dups = n_add - #keep
  keep = within_budget(c, keep)
  c.added = #keep
  if #keep == 0 then return end
  local seq = next_seq(#keep)
  local byq, dargs, pargs = {}, {}, {}
  for j, e in ipairs(keep) do
    local k, prio, delay = ARGV[e], tonumber(ARGV[e + 2]), tonumber(ARGV[e + 4])
    local member = tostring(prio) .. ':' .. fmt(seq + j) .. '@' .. k
    pargs[#pargs + 1] = member; pargs[#pargs + 1] = ARGV[e + 3]
    if delay > 0 then
      dargs[#dargs + 1] = fmt(now(c) + delay); dargs[#dargs + 1] = member
    else
      local q = byq[k]
      if not q then q = {}; byq[k] = q end
      -- without parsing the member again where its priority is an integer
      -- that prints exactly (nodes send -4095..4095); anything else fails
      -- in score() as it always did
      local sc = (prio == math.floor(prio) and prio > -1e12 and prio < 1e12)
                 and score_of(prio, seq + j) or score(member)
      q[#q + 1] = sc; q[#q + 1] = member
    end
  end
  call_chunked('HSET', KEYS[2], pargs, 2)
  for k, q in pairs(byq) do
    call_chunked('ZADD', Q(k), q, 2)
    c.qdelta = c.qdelta + #q / 2
    c.touched[k] = true
  end
  if #dargs > 0 then call_chunked('ZADD', KEYS[5], dargs, 2) end
end
