-- sync/args.lua: ARGV parsed once into the call context C (see main.lua for
-- what each ARGV is); nothing is read from or written to Redis here.
-- Sets C's settings (node, ttl, take_n, flags, bounds, defaults, budgets),
-- its sections (adopt, adds as entries/fps/forced, acks, fails, nacks,
-- feedback, fetched, handoffs, reserve) and zeroed counters; a download's end
-- (fetched) acknowledged or failed in the same call is left to the ack or fail.
local function sync_args()
  local flags = ARGV[5]
  local c = {node = ARGV[2], ttl = math.min(tonumber(ARGV[3]), LEASE_HARD_MS),
             take_n = tonumber(ARGV[4]),
             sweep = find(flags, 's', 1, true) ~= nil,
             registered = find(flags, 'r', 1, true) ~= nil,
             check = find(flags, 'c', 1, true) ~= nil,
             dead_max = tonumber(ARGV[11]), invalid_max = tonumber(ARGV[12]),
             -- (within what a node's settings can give: no call makes every key wait longer)
             def_delay = math.min(tonumber(ARGV[13]), INTERVAL_HARD_MS),
             def_conc = tonumber(ARGV[14]), jitter = math.min(tonumber(ARGV[15]), 1),
             -- (this node's own maxima: the crawl's, recorded in kstate's
             -- '||bounds', win when lower; see bounds() in feedback.lua)
             backoff_max = math.min(tonumber(ARGV[16]), INTERVAL_HARD_MS),
             block_max = math.min(tonumber(ARGV[17]), BLOCK_HARD_MS),
             polite_budget = tonumber(ARGV[19]),
             margin = math.min(tonumber(ARGV[20]), 0.5),
             -- Fields of the frontier's own records that held what this script
             -- never writes (junk: someone else wrote them); each is read field
             -- by field, what is valid is kept, the rest is counted here and
             -- mended when written back.
             junk = 0, trimmed = 0, stale = 0, qdelta = 0, missing = 0, now_cache = nil,
             -- What becomes of each touched key's entry in the ready set, decided at the end.
             took = {}, touched = {}, raise = {}}
  c.maintenance = c.sweep or find(flags, 'm', 1, true) ~= nil
  c.promote = c.maintenance or find(flags, 'd', 1, true) ~= nil
  math.randomseed(tonumber(ARGV[18]))

  local pos = 21
  local adopt = {}
  for i = 1, tonumber(ARGV[pos]) do adopt[i] = {ARGV[pos + 2 * i - 1], ARGV[pos + 2 * i]} end
  pos = pos + 1 + 2 * #adopt
  local n_add = tonumber(ARGV[pos]); pos = pos + 1
  -- entries[i]: where add i's five arguments start in ARGV (no table per add)
  local entries, fps, forced = {}, {}, {}
  for i = 1, n_add do
    entries[i] = pos
    local f = ARGV[pos + 1]
    if byte(f, 1) == 33 then forced[i] = true; f = sub(f, 2) end  -- '!'
    if f ~= '' and f ~= '+' then fps[i] = f end   -- '+': a new page, not deduplicated
    pos = pos + 5
  end
  local acks = {}
  for i = 1, tonumber(ARGV[pos]) do acks[i] = {ARGV[pos + 2 * i - 1], ARGV[pos + 2 * i]} end
  pos = pos + 1 + 2 * #acks
  local fails = {}
  for i = 1, tonumber(ARGV[pos]) do
    fails[i] = {ARGV[pos + 3 * i - 2], ARGV[pos + 3 * i - 1], ARGV[pos + 3 * i]}
  end
  pos = pos + 1 + 3 * #fails
  local nacks = {}
  for i = 1, tonumber(ARGV[pos]) do nacks[i] = ARGV[pos + i] end
  pos = pos + 1 + #nacks
  local feedback = {}
  for i = 1, tonumber(ARGV[pos]) do
    local k, kind = ARGV[pos + 3 * i - 2], ARGV[pos + 3 * i - 1]
    local ms = math.max(0, tonumber(ARGV[pos + 3 * i]) or 0)
    -- 'sent' names the member that was sent (checked in leases.lua: it must
    -- be leased to this node), its key is the member's
    if kind == 'sent' then feedback[i] = {member_key(k) or '', kind, ms, k}
    else feedback[i] = {k, kind, ms} end
  end
  pos = pos + 1 + 3 * #feedback
  local fetched = {}
  for i = 1, tonumber(ARGV[pos]) do fetched[i] = ARGV[pos + i] end
  pos = pos + 1 + #fetched
  local handoffs = {}
  for i = 1, tonumber(ARGV[pos]) do handoffs[i] = {ARGV[pos + 2 * i - 1], ARGV[pos + 2 * i]} end
  pos = pos + 1 + 2 * #handoffs
  local reserve = {}
  for i = 1, tonumber(ARGV[pos]) do
    reserve[i] = {ARGV[pos + 2 * i - 1], math.max(0, tonumber(ARGV[pos + 2 * i]) or 0)}
  end

  -- After the sections: six settings, then the MongoDB tier's four (absent:
  -- the tier is off; see main.lua).
  local t = pos + 1 + 2 * #reserve
  c.margin_min = math.min(tonumber(ARGV[t]), 60000)
  c.tolerance, c.err_weight = tonumber(ARGV[t + 1]), tonumber(ARGV[t + 2])
  c.backoff_base, c.def_budget = tonumber(ARGV[t + 3]), tonumber(ARGV[t + 4])
  c.crawl_budget = tonumber(ARGV[t + 5])
  c.spill_above = math.max(0, tonumber(ARGV[t + 6]) or 0)
  c.window_ms = math.max(0, tonumber(ARGV[t + 7]) or 0)
  c.window_min = math.max(1, tonumber(ARGV[t + 8]) or 1)
  c.window_max = math.max(c.window_min, tonumber(ARGV[t + 9]) or c.window_min)

  -- A download's end (fetched) acknowledged or failed in this same call is left
  -- to the ack or fail, which frees the slot itself: the same outcome, two
  -- commands fewer (a hand-off of that end marks it ended itself).
  if #fetched > 0 and (#acks > 0 or #fails > 0) then
    local settled, rest = {}, {}
    for _, a in ipairs(acks) do settled[a[1]] = true end
    for _, f in ipairs(fails) do settled[f[1]] = true end
    for _, member in ipairs(fetched) do
      if not settled[member] then rest[#rest + 1] = member end
    end
    fetched = rest
  end
  c.adopt, c.n_add, c.entries, c.fps, c.forced = adopt, n_add, entries, fps, forced
  c.acks, c.fails, c.nacks, c.feedback = acks, fails, nacks, feedback
  c.fetched, c.handoffs, c.reserve = fetched, handoffs, reserve
  return c
end
