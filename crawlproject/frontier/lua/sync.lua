-- SYNC: one round trip of a node with one partition of the frontier.
-- KEYS[1] ready (zset politeness key -> ms it may start its next request)
-- KEYS[2] payloads (hash)   KEYS[3] inflight (hash member->node)
-- KEYS[4] nodes (zset node->lease deadline ms)        KEYS[5] delayed (zset member->due ms)
-- KEYS[6] dead (list)       KEYS[7] invalid (list)    KEYS[8] seq (string)
-- KEYS[9] bloom meta (hash); its shards are KEYS[9]:<layer>:<shard> (derived)
-- KEYS[10] partition stats (hash): counters of the scripts (trims, recounts,
--          keys_pruned, budget_refused, budget_skipped, sent_refused,
--          state_junk); junk in a counter, or a key of another type, stops no
--          call (the counter starts again)
-- KEYS[11] kstate (hash key -> "n|last|block|backoff|crawl delay|error rate"
--          (the error rate in millionths; a state of an older version has no
--          such field: 0), field '|key'
--          -> the key's override, mirrored from KEYS[12] by SET_LIMITS, field
--          '||limits' -> how many overrides there are (SET_LIMITS), field
--          '||cursor' -> where the next window of it starts (HSCAN), field
--          '||qlen' -> entries queued in this partition, and field '||bounds'
--          -> "longest block ms|longest backoff or crawl delay ms" of the crawl,
--          recorded by the first call that needed them, see bounds())
--          Every field is read strictly (see "What is read back" below).
-- KEYS[12] limits (hash key -> "delay ms|concurrency|source"; SYNC reads each
--          override from its mirror in KEYS[11], this only to count them where
--          KEYS[11] has no '||limits' field yet)
-- KEYS[13] queue prefix: the queue of key K is KEYS[13]:K (derived)
-- KEYS[14] held prefix: the members leased to node N are in the set KEYS[14]:N (derived)
-- KEYS[15] qlen of older versions (string): the queue length is kstate's field
--          '||qlen' now; a crawl begun by an older version has it here, moved
--          into kstate (and this key deleted) by the first call
-- KEYS[16] wanting (zset node -> ms): when each node's take last went unmet
--          while entries were queued (see "Sharing a key's slots" below)
-- KEYS[17] budget (hash key -> "admitted|refused": new pages of the key this
--          partition queued, and refused over its budget; '||crawl' -> the
--          same for the whole partition). Written only while budgets apply;
--          a key of another type skips this call's budget accounting (the
--          reply says so) instead of stopping the call.
-- ARGV[1] now in ms, or '' for Redis server time      ARGV[2] node id
-- ARGV[3] lease ttl ms (0 = this node leaves: drop its heartbeat; at most an
--         hour is honoured)
-- ARGV[4] how many entries to take
-- ARGV[5] flags: 'm' = maintenance (renew this node's lease, reclaim the leases
--         of expired nodes, report delayed/inflight sizes, drop the state of
--         keys idle for days in a window of kstate), 'd' = promote due
--         delayed entries, 's' = sweep: also reclaim entries whose owner is not
--         a registered node and recount the in-flight of the keys with leases
--         and of a window of kstate (implies 'm'),
--         'r' = this node renewed its lease well within the TTL (a take need
--         not register it again), 'c' = check first: every key the call may
--         write must hold the right type (the node's call before this one
--         stopped inside the script), or the call is refused with the error
--         reply 'BADKEY <key> is a <type>, not a <type>: nothing changed'.
-- ARGV[6..10] bloom capacity, error rate, growth, tightening, shard bits
-- ARGV[11] most records kept in the dead list  ARGV[12] ... in the invalid list
-- ARGV[13] default interval ms between request starts of a key (at most a day)
-- ARGV[14] default most requests of a key in flight   ARGV[15] jitter (0..1)
-- ARGV[16] most backoff interval ms   ARGV[17] most Retry-After block ms: this
--          node's FRONTIER_BACKOFF_MAX and FRONTIER_RETRY_AFTER_MAX, which can
--          only lower the crawl's recorded ones (KEYS[11] '||bounds'); at most
--          a day either way
-- ARGV[18] random seed (the interval jitter)
-- ARGV[19] most entries to take from keys with an interval (what the node can
--          start at once: an entry of a polite key must not wait in a buffer)
-- ARGV[20] safety margin on intervals (0.02: 2 % longer, so that the time a
--          node takes from lease to sending never shortens what the site sees;
--          at most 0.5)
-- ARGV[#ARGV - 5 .. #ARGV], after the nine sections below (where a script of
-- before them ignores them):
--   least safety margin ms on an interval (ARGV[20]'s share, but at least this:
--     the node's own scheduling latency does not shrink with the interval; at
--     most a minute)
--   backoff tolerance: the share of a key's recent answers (millionths) that
--     may be slow-down answers before the key is slowed down
--   weight of one answer in that share (millionths: 1 / the answers it is
--     averaged over)
--   first backoff interval ms (or twice the key's interval, if longer)
--   default budget: most new pages a key may queue (0 = none; an override's
--     budget field wins)
--   crawl budget: most new pages this partition may queue (0 = none)
-- then nine sections, each a count followed by its items:
--   adopt: n x (member, former owner)    (leases this node took under a former
--                                          id of its own: now held under this id)
--   add:  n x (politeness key, fingerprint hex, '' (the same page again: a retry)
--         or '+' (a new page, not deduplicated), priority, payload, delay ms or 0)
--         (a fingerprint prefixed '!' is added to the filter and the entry queued
--         even if the filter had it: the node sends its adds so again after a
--         call that stopped inside the script, which may have marked them seen
--         without queueing them, since a script is not rolled back)
--   ack:  n x (member, '1' = a success that relaxes the key's backoff | '0')
--   fail: n x (member, 'dead'|'invalid', record)   (forget it, keep record)
--   nack: n x member                     (not started: back to its queue)
--   feedback: n x (key, 'block'|'backoff'|'crawldelay', ms) or (member, 'sent', ms)
--         ('sent': that leased entry left the node ms ago, later than its lease
--         allowed; taken only if the member is leased to this node, else
--         refused and counted)
--   fetched: n x member                  (its download ended: its key's slot is
--                                          free; the entry stays leased until acked)
--   handoff: n x (ended member, started member)  (the node gave the slot of a
--            download that ended to an entry it held in reserve for that key)
--   reserve: n x (key, count)            (entries of K this node wants in reserve:
--            leased, holding no slot, started only on a slot the node frees; a
--            count of 0 asks only whether its reserve may still be used)
--
-- Politeness is enforced here, at lease time, for all nodes: a key is taken
-- from only when its ready time has come (a minimum interval since its last
-- start, a Retry-After block, a backoff, a robots.txt crawl delay) and while
-- fewer than its concurrency are in flight. Ready keys are served oldest-ready
-- first, each at most once per call (several entries only when it has no
-- interval), highest priority first within a key.
-- Ownership: ack, fail and nack change an entry only if this node holds its
-- lease; a late ack or fail of an entry whose lease expired and that is back
-- in its queue (not leased by anyone) also removes it (the work was done); an
-- ack or fail of an entry already gone (repeated after a lost reply) is a
-- no-op. Anything else is a stale call: counted, nothing changed. Every take
-- registers the node with a deadline, so no entry is held by an id that
-- cannot expire.
-- Reserve (the slot hand-off): a key with no interval and no block that has
-- its concurrency in flight frees a slot only when a download ends; the node
-- whose download ended may start the next request of that key at once, from
-- its reserve, and say so afterwards (handoff): the key's in-flight count never
-- goes up, so its concurrency holds for the cluster. A reserve is given only
-- while the key is at its concurrency, at most its share (concurrency / nodes
-- of the partition, rounded up) per ask; the reply tells, for every key asked
-- about, whether the reserve may still be used (no interval, no block, not
-- over its concurrency) and the share.
-- Sharing a key's slots: a node whose take got fewer entries than it asked
-- while entries were queued is *wanting* (KEYS[16], for SHARE_WINDOW ms).
-- While other nodes are wanting, a take gives this node at most its share of
-- a key's concurrency, ceil(concurrency / (1 + other wanting nodes)), counting
-- the entries of the key it already holds a slot for; a key it holds its share
-- of is passed over (it stays ready for the others, and is not this node's
-- next ready time). With no other node wanting, a node may hold all of a
-- key's slots: nothing is left idle for a node that does not ask (paused,
-- busy elsewhere, gone).
-- Returns {taken = {member, payload, ...}, added, duplicates, queue length,
--          delayed length or -1, inflight length or -1, reclaimed, now or -1,
--          stale calls, queue members without payload or malformed set aside,
--          records trimmed,
--          earliest ready time (ms), -1 when no key is ready or due, -2 when the
--          take got all it asked for (more may be ready), keys the take filled
--          up to their concurrency or passed over because they had it in flight,
--          reserved = {member, payload, ...}, status = {key, 1|0, share, ...},
--          capped keys = {key, ...} (at most 64), polite keys = {key, interval
--          ms, ...}: the keys with an interval this call took from (their
--          entries must start at once: within margin x interval of the lease),
--          new pages refused over a budget, fields read back as junk (state_junk),
--          1 when the budget key was not a hash (budget accounting skipped) else
--          0, 'sent' reports refused, {longest block ms, longest backoff ms} as
--          recorded when this call read them, else {}}
-- What is read back is untrusted (anyone who can write to Redis writes it):
-- each field of a state, an override or a budget count is parsed on its own
-- (junk in one never zeroes the others), values are bounded (a block at most
-- a day from now, intervals at most a day, a last start at most now, an
-- in-flight count at most the leases there are), a member this script does
-- not write is set aside (never leased), a node deadline beyond the longest
-- lease is expired and a ready time beyond any state is brought back to now;
-- each is counted in the reply and in KEYS[10]'s 'state_junk', and a state
-- the script owns is written back mended.
local node, ttl, take_n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
-- What this script honours at most, whatever a call passes in ARGV or Redis
-- holds (anyone with a node's credential can make a call or write a state:
-- docs/frontier.md, trust model): a block until at most a day after it is
-- read, an interval (a limit's delay, a backoff, a crawl delay) of at most a
-- day, a lease of at most an hour.
local BLOCK_HARD_MS, INTERVAL_HARD_MS, LEASE_HARD_MS = 86400000, 86400000, 3600000
ttl = math.min(ttl, LEASE_HARD_MS)
local sweep = string.find(ARGV[5], 's', 1, true) ~= nil
local registered = string.find(ARGV[5], 'r', 1, true) ~= nil
local maintenance = sweep or string.find(ARGV[5], 'm', 1, true) ~= nil
local promote = maintenance or string.find(ARGV[5], 'd', 1, true) ~= nil
local dead_max, invalid_max = tonumber(ARGV[11]), tonumber(ARGV[12])
local def_delay, def_conc, jitter = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
-- (within what a node's settings can give: no call makes every key wait longer)
def_delay, jitter = math.min(def_delay, INTERVAL_HARD_MS), math.min(jitter, 1)
-- (this node's own maxima: the crawl's, recorded in kstate's '||bounds', win
-- when lower; see bounds() below)
local backoff_max = math.min(tonumber(ARGV[16]), INTERVAL_HARD_MS)
local block_max = math.min(tonumber(ARGV[17]), BLOCK_HARD_MS)
local margin, margin_min = math.min(tonumber(ARGV[20]), 0.5), math.min(tonumber(ARGV[#ARGV - 5]), 60000)
local tolerance, err_weight, backoff_base = tonumber(ARGV[#ARGV - 4]), tonumber(ARGV[#ARGV - 3]),
                                            tonumber(ARGV[#ARGV - 2])
local def_budget, crawl_budget = tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV])
math.randomseed(tonumber(ARGV[18]))
local QP, HP = KEYS[13], KEYS[14]
-- Fields of the frontier's own records that held what this script never
-- writes (junk: someone else wrote them); each is read field by field, what
-- is valid is kept, the rest is counted here and mended when written back.
local junk = 0
local function Q(k) return QP .. ':' .. k end
local function HELD(n) return HP .. ':' .. n end
-- A lease's value is its node id, with '|f' once its download ended (then its
-- key's in-flight slot is already free) or '|r' while it waits in the node's
-- reserve (it holds no slot yet). The second value is that flag, or false.
local byte, sub, find = string.byte, string.sub, string.find
local function lease(v)
  -- (by bytes, not a pattern: this runs for every member an ack, a take or a
  -- reclaim touches; 124 = '|', 102 = 'f', 114 = 'r')
  if not v then return false, false end
  if byte(v, -2) == 124 then
    local f = byte(v, -1)
    if f == 102 then return sub(v, 1, -3), 'f' end
    if f == 114 then return sub(v, 1, -3), 'r' end
  end
  return v, false
end
local function leases_of(nd)
  -- The members of ND's held set that ND still holds, and their lease flags
  -- (read chunked: a held set may be large).
  local members = redis.pcall('SMEMBERS', HELD(nd))
  if members.err then
    -- not a set (someone else wrote it): stops no call; the entries it should
    -- list come back by the sweep (their owner is gone) and reclaim deletes it
    junk = junk + 1
    members = {}
  end
  local held, flags = {}, {}
  for i = 1, #members, 500 do
    local last = math.min(i + 499, #members)
    local values = redis.call('HMGET', KEYS[3], unpack(members, i, last))
    for j = i, last do
      local owner, flag = lease(values[j - i + 1])
      if owner == nd then held[#held + 1] = members[j]; flags[#held] = flag end
    end
  end
  return held, flags
end
local now_cache = nil
local function now()
  if now_cache == nil then now_cache = server_now(ARGV[1]) end
  return now_cache
end
local trimmed, stale, qdelta, missing = 0, 0, 0, 0
local function stat(name, n)
  -- A counter of the partition: junk in its field (or a stats key of another
  -- type) must not stop the call (a script is not rolled back): the field
  -- starts again from N.
  local r = redis.pcall('HINCRBY', KEYS[10], name, n)
  if type(r) == 'table' and r.err then redis.pcall('HSET', KEYS[10], name, n) end
end
local function count_of(v, hi)
  -- V (a field read from Redis) as a whole number 0..HI, or nil when it is
  -- not one: digits only, as this script writes them.
  if type(v) ~= 'string' or #v > 17 or not string.match(v, '^%d+$') then return nil end
  local x = tonumber(v)
  if x > hi then return nil end
  return x
end
local function keep_record(kind, record)
  -- Dead letters and invalid payloads are kept for operators, the newest
  -- first, up to a cap; what falls off the end is counted.
  local key, cap = KEYS[6], dead_max
  if kind == 'invalid' then key, cap = KEYS[7], invalid_max end
  local len = redis.call('LPUSH', key, record)
  if len > cap then
    redis.call('LTRIM', key, 0, cap - 1)
    stat(kind .. '_trimmed', len - cap)
    trimmed = trimmed + len - cap
  end
end

local function next_seq(n)
  -- The first of N new sequence numbers. The fingerprints of these entries are
  -- already in the Bloom filter, so a counter that is not a count (written by
  -- someone else) must not fail the call: numbering goes on above every
  -- member there is (each queued, delayed or leased entry has a payload).
  local seq = redis.pcall('INCRBY', KEYS[8], n)
  if type(seq) == 'number' then return seq - n end
  local top = 0
  for _, m in ipairs(redis.call('HKEYS', KEYS[2])) do
    local s = tonumber(string.match(m, '^%-?%d+:(%d+)'))
    if s and s > top then top = s end
  end
  redis.call('SET', KEYS[8], fmt(top + n))  -- whatever type the key had
  stat('seq_recounted', 1)
  return top
end

-- Per-key state, read once per call for all the keys it touches and written
-- back once at the end.
local ST, LIM, dirty = {}, {}, {}
-- Whether any key has an override: kstate's field '||limits' counts them (SET_LIMITS
-- keeps it), read with the first states a call loads, so a crawl without
-- overrides pays neither a command nor a field per key for them.
local overrides = nil
-- The partition's queue length is kstate's field '||qlen', read with the first
-- states a call loads and written back with them: no command of its own in a
-- call that reads and writes state anyway. qlen_raw is its value as read (false
-- when absent), qlen_read whether it was read.
local qlen_raw, qlen_read = false, false
-- load() keeps each key's fields as read (RAW_ST, RAW_LIM: the string, or
-- false when absent); they are parsed into ST[k] and LIM[k] when first used: a
-- take reads a window of ready keys and often uses only the first of them.
local RAW_ST, RAW_LIM = {}, {}
local DEFAULT_LIM = {delay = def_delay, conc = def_conc, budget = def_budget}   -- read only
-- Keys whose ready time must be computed again (a state read as junk may have
-- put them far in the future): see the end of the call.
local reready = {}
local function fields_of(s, most)
  -- S split at '|' (at most MOST + 1 fields: more is junk anyway)
  local out = {}
  for f in string.gmatch(s .. '|', '([^|]*)|') do
    out[#out + 1] = f
    if #out > most then break end
  end
  return out
end
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
    -- (the common case, a state this script wrote, without a table or a closure)
    local n, la, bl, bo, cd, er = string.match(s, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|?(%d*)$')
    if n and #s < 100 then
      n, la, bl, bo, cd, er = tonumber(n), tonumber(la), tonumber(bl), tonumber(bo),
                              tonumber(cd), tonumber(er) or 0
      if n <= 1000000000 and la <= now() and bl <= now() + BLOCK_HARD_MS
          and bo <= INTERVAL_HARD_MS and cd <= INTERVAL_HARD_MS and er <= 1000000 then
        v.n, v.last, v.block, v.bo, v.cd, v.er = n, la, bl, bo, cd, er
        rawset(t, k, v)
        return v
      end
    end
    local f, bad = fields_of(s, 6), 0
    if #f < 5 or #f > 6 then bad = bad + 1 end
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
    if v.last > now() then v.last = now(); bad = bad + 1 end
    if v.block > now() + BLOCK_HARD_MS then v.block = now() + BLOCK_HARD_MS; bad = bad + 1 end
    if bad > 0 then
      junk = junk + bad
      dirty[k] = true; reready[k] = true
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
    local d, c, b = string.match(l, '^(%d*)|(%d*)|[^|]*$')
    if not d then d, c, b = string.match(l, '^(%d*)|(%d*)|(%d*)|[^|]*$') end
    if d and #l < 100 then
      d, c, b = tonumber(d) or def_delay, tonumber(c) or def_conc, tonumber(b) or def_budget
      if c <= 0 or c > 1000000000 then c = 1000000000 end
      if d <= INTERVAL_HARD_MS and b <= 1e15 then
        v = {delay = d, conc = c, budget = b}
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
    local c = field(2, 1e15, def_conc)
    if c <= 0 then c = 1000000000 end
    -- (an older override has no budget: its third field is the source)
    local b = #f == 4 and field(3, 1e15, def_budget) or def_budget
    if bad > 0 then junk = junk + bad end
    v = {delay = d, conc = math.min(c, 1000000000), budget = b}
  end
  rawset(t, k, v)
  return v
end})
local function load(keys)
  -- State and override of each key come from kstate: the override of key K
  -- is mirrored there as field '|K' (see SET_LIMITS).
  local need, seen = {}, {}
  for _, k in ipairs(keys) do
    if RAW_ST[k] == nil and not seen[k] then need[#need + 1] = k; seen[k] = true end
  end
  for i = 1, #need, 500 do
    local last = math.min(i + 499, #need)
    local fields, per = {}, overrides and 2 or 1
    for j = i, last do
      fields[#fields + 1] = need[j]
      if overrides then fields[#fields + 1] = '|' .. need[j] end
    end
    local n_own = #fields
    if overrides == nil then fields[#fields + 1] = '||limits' end
    if not qlen_read then fields[#fields + 1] = '||qlen' end
    local got = redis.call('HMGET', KEYS[11], unpack(fields))
    if not qlen_read then qlen_raw, qlen_read = got[#fields], true end
    if overrides == nil then
      local count = count_of(got[n_own + 1], 1e15)
      if count == nil then
        -- Not kept yet (a crawl begun by an older version) or junk: from the limits.
        if got[n_own + 1] then junk = junk + 1 end
        count = redis.call('HLEN', KEYS[12])
        redis.call('HSET', KEYS[11], '||limits', count)
      end
      overrides = count > 0
      if overrides then
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
local function interval(k)
  return math.max(LIM[k].delay, ST[k].cd, ST[k].bo)
end
-- The weight of one answer in K's error rate: 1 / the window, the window at
-- least K's concurrency (at most 100): the answers of the requests in flight
-- together are one sample, and a window shorter than them turns a few
-- transient 503s among them, or one node's answers reported in one call,
-- into a backoff of the whole site (issue 47).
local function err_weight_of(k)
  return math.min(err_weight, math.floor(1000000 / math.max(1, math.min(LIM[k].conc, 100))))
end
local function pad(iv)
  -- The safety margin added to an interval of IV ms: the node gives back an
  -- entry it could not start within it of the lease (the client's lag_allowed).
  -- A share of 0 turns it off (limits held at lease only).
  if iv <= 0 or margin <= 0 then return 0 end
  return math.max(iv * margin, margin_min)
end
local function next_start(k)
  -- The earliest start of K's next request: its interval after the last
  -- start, jittered as Scrapy jitters DOWNLOAD_DELAY (x uniform(1 - JITTER,
  -- 1 + JITTER)) but never shortened (a draw below 1 is the interval itself:
  -- half the intervals, so the mean is 1 + JITTER / 4 of it), plus the margin;
  -- and not before a block.
  local s = ST[k]
  local iv = interval(k)
  local gap = iv
  if iv > 0 and jitter > 0 then gap = iv * math.max(1, 1 + jitter * (2 * math.random() - 1)) end
  return math.max(s.last + gap + pad(iv), s.block)
end
local function earliest(k)
  -- When K may start again at the soonest (no jitter): what the take checks.
  local s = ST[k]
  local iv = interval(k)
  return math.max(s.last + iv + pad(iv), s.block)
end
local function member_key(member)
  -- the politeness key of "<priority>:<seq>@<key>" (nil if it has none)
  local at = find(member, '@', 1, true)
  return at and sub(member, at + 1) or nil
end
local function well_formed(member, k)
  -- Whether MEMBER is one this script writes, "<priority>:<seq>@<key>" (of key
  -- K when given). A queue, the delayed set or the in-flight hash may hold
  -- anything someone else wrote there: such a member is never leased (its
  -- key, its score and its ack would fail the calls of every node).
  local p, sq, key = string.match(member, '^(%-?%d+):(%d+)@(.*)$')
  return p ~= nil and #p <= 5 and #sq <= 15 and math.abs(tonumber(p)) <= 4095
         and (k == nil or key == k)
end
local function set_aside(members, why)
  -- MEMBERS (already out of their queue, the delayed set or the in-flight
  -- hash) go to the invalid list with their payloads, and are counted with
  -- the entries that had no payload.
  if #members == 0 then return end
  for i = 1, #members, 500 do
    local last = math.min(i + 499, #members)
    local values = redis.call('HMGET', KEYS[2], unpack(members, i, last))
    for j = i, last do
      keep_record('invalid', cjson.encode({member = members[j], payload = values[j - i + 1] or nil,
                                           reason = why, node = node, at = now() / 1000}))
    end
  end
  call_chunked('HDEL', KEYS[2], members, 1)
  missing = missing + #members
end

-- What becomes of each touched key's entry in the ready set, decided at the end.
local took, touched, raise = {}, {}, {}

-- parse every section first: their keys are loaded in one go
local polite_budget = tonumber(ARGV[19])
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
  if string.byte(f, 1) == 33 then forced[i] = true; f = string.sub(f, 2) end  -- '!'
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
  -- 'sent' names the member that was sent (checked below: it must be leased
  -- to this node), its key is the member's
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

-- check mode: nothing is written before this
if string.find(ARGV[5], 'c', 1, true) then
  local bad = nil
  -- (not the stats hash nor the budget hash: junk there stops no call, see
  -- stat() and within_budget())
  local want = {{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[3], 'hash'}, {KEYS[4], 'zset'},
                {KEYS[5], 'zset'}, {KEYS[6], 'list'}, {KEYS[7], 'list'}, {KEYS[9], 'hash'},
                {KEYS[11], 'hash'}, {KEYS[12], 'hash'},
                {KEYS[16], 'zset'}, {HELD(node), 'set'}}
  for _, w in ipairs(want) do bad = bad or bad_key(w[1], w[2]) end
  -- the queues this call may write: of its adds, its nacks, and the keys a
  -- take or a promotion looks at first (the seq counter and the old queue
  -- length mend themselves)
  if not bad then
    local qs = {}
    for _, e in ipairs(entries) do qs[ARGV[e]] = true end
    for _, m in ipairs(nacks) do qs[member_key(m) or ''] = true end
    for _, k in ipairs(redis.call('ZRANGE', KEYS[1], 0, 999)) do qs[k] = true end
    for _, m in ipairs(redis.call('ZRANGE', KEYS[5], 0, 999)) do qs[member_key(m) or ''] = true end
    for k, _ in pairs(qs) do bad = bad or bad_key(Q(k), 'zset') end
  end
  if bad then return redis.error_reply('BADKEY ' .. bad .. ': nothing changed') end
end

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

-- Only the keys whose in-flight count or state this call changes are read
-- here: a key that only got new entries joins the ready set as a hint (its
-- politeness is checked when it is taken from).
local keys = {}
for _, a in ipairs(acks) do keys[#keys + 1] = member_key(a[1]) end
for _, f in ipairs(fails) do keys[#keys + 1] = member_key(f[1]) end
for _, m in ipairs(nacks) do keys[#keys + 1] = member_key(m) end
for _, f in ipairs(feedback) do if f[1] ~= '' then keys[#keys + 1] = f[1] end end
for _, m in ipairs(fetched) do keys[#keys + 1] = member_key(m) end
for _, h in ipairs(handoffs) do keys[#keys + 1] = member_key(h[2]) end
for _, r in ipairs(reserve) do keys[#keys + 1] = r[1] end
load(keys)

-- adopt
for _, a in ipairs(adopt) do
  local owner, fetched_ = lease(redis.call('HGET', KEYS[3], a[1]))
  if owner == a[2] then
    redis.call('HSET', KEYS[3], a[1], fetched_ and node .. '|' .. fetched_ or node)
    redis.call('SMOVE', HELD(a[2]), HELD(node), a[1])
  end
end
if #adopt > 0 and ttl > 0 then redis.call('ZADD', KEYS[4], fmt(now() + ttl), node) end

-- 'sent' feedback moves its key's last start: it is taken only from the node
-- that holds the lease of the member it names (checked here, before this
-- call's acks and fails settle them), so a call from anywhere else cannot
-- hold a key back by repeating it; a refused one is counted (sent_refused),
-- and the node that gets the count in its reply says so.
local sent_refused = 0
do
  local members, at = {}, {}
  for i, f in ipairs(feedback) do
    if f[2] == 'sent' then members[#members + 1] = f[4]; at[#at + 1] = i end
  end
  if #members > 0 then
    local owners = redis.call('HMGET', KEYS[3], unpack(members))
    for j, i in ipairs(at) do
      if feedback[i][1] == '' or lease(owners[j]) ~= node then
        feedback[i][2] = 'refused'; sent_refused = sent_refused + 1
      end
    end
    if sent_refused > 0 then stat('sent_refused', sent_refused) end
  end
end

-- Budgets: a key (a site) may queue at most its budget of new pages, and
-- this partition at most the crawl budget; what is over is refused and
-- counted (per key, per partition, and in the reply), never queued. Only new
-- pages count (an add with a fingerprint): a retry or a page waiting for its
-- site's robots.txt is the same page again. Budgets apply when a setting
-- gives one or an override has one (kstate's '||budgets' counts those).
-- A budget key of another type than a hash (written by someone else) does not
-- stop the call, nor any other site of the partition: this call's budget
-- accounting is skipped (its new pages are admitted, none counted), and the
-- reply says so (budget_skipped), for the node to log and count. It is not
-- repaired here: a script does not delete what it did not write, and counts
-- started again from 0 would admit a whole budget more per site anyway; the
-- operator deletes the key and counting starts again.
local budget_refused, budget_skipped = 0, 0
local function within_budget(keep)
  if #keep == 0 then return keep end
  if def_budget <= 0 and crawl_budget <= 0 then
    -- (read with the queue length, which the call reads anyway: no command more)
    local got = redis.call('HMGET', KEYS[11], '||budgets', '||qlen')
    if not qlen_read then qlen_raw, qlen_read = got[2], true end
    local n = count_of(got[1], 1e15)
    -- junk there counts as budgets to check (the per-key check decides)
    if got[1] and not n then junk = junk + 1; n = 1 end
    if (n or 0) <= 0 then return keep end
  end
  local t = redis.call('TYPE', KEYS[17]).ok
  if t ~= 'hash' and t ~= 'none' then
    budget_skipped = 1
    stat('budget_skipped', 1)
    return keep
  end
  local ks, seen_k = {}, {}
  for _, e in ipairs(keep) do
    local k = ARGV[e]
    if ARGV[e + 1] ~= '' and not seen_k[k] then seen_k[k] = true; ks[#ks + 1] = k end
  end
  if #ks == 0 then return keep end
  load(ks)
  local count = {}
  local fields = {unpack(ks)}
  fields[#fields + 1] = '||crawl'
  for i = 1, #fields, 500 do
    local last = math.min(i + 499, #fields)
    local got = redis.call('HMGET', KEYS[17], unpack(fields, i, last))
    for j = i, last do
      local raw = got[j - i + 1]
      local a, r = string.match(raw or '', '^(%d+)|(%d+)$')
      a, r = count_of(a, 1e15), count_of(r, 1e15)
      if raw and not (a and r) then
        -- field by field: a valid count is kept, junk starts again from 0
        local f = fields_of(raw, 2)
        a, r = count_of(f[1], 1e15), count_of(f[2], 1e15)
        junk = junk + (a and 0 or 1) + (r and 0 or 1) + (#f == 2 and 0 or 1)
      end
      count[fields[j]] = {a = a or 0, r = r or 0}
    end
  end
  local crawl, out = count['||crawl'], {}
  for _, e in ipairs(keep) do
    local k = ARGV[e]
    if ARGV[e + 1] == '' then
      out[#out + 1] = e
    else
      local c, b = count[k], LIM[k].budget
      if (b > 0 and c.a >= b) or (crawl_budget > 0 and crawl.a >= crawl_budget) then
        c.r = c.r + 1; crawl.r = crawl.r + 1; budget_refused = budget_refused + 1
      else
        c.a = c.a + 1; crawl.a = crawl.a + 1; out[#out + 1] = e
      end
    end
  end
  local values = {}
  for k, c in pairs(count) do values[#values + 1] = k; values[#values + 1] = fmt(c.a) .. '|' .. fmt(c.r) end
  call_chunked('HSET', KEYS[17], values, 2)
  if budget_refused > 0 then stat('budget_refused', budget_refused) end
  return out
end

-- add: dedupe (Bloom) and enqueue in the same atomic step
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
    local f = ARGV[entries[i] + 1]
    if f == '' or f == '+' or new[i] or forced[i] then keep[#keep + 1] = entries[i] end
  end
  dups = n_add - #keep
  keep = within_budget(keep)
  added = #keep
  if added > 0 then
    local seq = next_seq(added)
    local byq, dargs, pargs = {}, {}, {}
    for j, e in ipairs(keep) do
      local k, prio, delay = ARGV[e], tonumber(ARGV[e + 2]), tonumber(ARGV[e + 4])
      local member = tostring(prio) .. ':' .. fmt(seq + j) .. '@' .. k
      pargs[#pargs + 1] = member; pargs[#pargs + 1] = ARGV[e + 3]
      if delay > 0 then
        dargs[#dargs + 1] = fmt(now() + delay); dargs[#dargs + 1] = member
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
      qdelta = qdelta + #q / 2
      touched[k] = true
    end
    if #dargs > 0 then call_chunked('ZADD', KEYS[5], dargs, 2) end
  end
end

-- Ownership, in batches: the members this node holds are settled at once;
-- a late finisher's member (nobody holds it, it is back in its queue) is
-- taken out of the queue; anything else is stale. A key's in-flight count
-- goes down when its download ended ('fetched', reported earlier) or now.
local unheld, gone = {}, {}
local function settle(members, on_done)
  if #members == 0 then return end
  local values = {}
  for i = 1, #members, 500 do
    local last = math.min(i + 499, #members)
    local got = redis.call('HMGET', KEYS[3], unpack(members, i, last))
    for j = i, last do values[j] = got[j - i + 1] end
  end
  local mine = {}
  for i, member in ipairs(members) do
    local owner, fetched_ = lease(values[i])
    if owner == node then
      mine[#mine + 1] = member
      if not fetched_ then
        local k = member_key(member)
        ST[k].n = math.max(0, ST[k].n - 1); dirty[k] = true; touched[k] = true
      end
      on_done(i, member)
    elseif not owner and redis.call('ZREM', Q(member_key(member)), member) == 1 then
      qdelta = qdelta - 1
      on_done(i, member)
    elseif not owner and redis.call('HEXISTS', KEYS[2], member) == 0 then
      -- already settled: the same ack/fail again after a call whose reply was
      -- lost (Redis stopped between running it and answering); nothing to do
    else
      stale = stale + 1
    end
  end
  if #mine == 0 then return end
  call_chunked('HDEL', KEYS[3], mine, 1)
  for _, member in ipairs(mine) do unheld[#unheld + 1] = member end
end

-- fetched: downloads that ended: their key's slot is free for the next request
if #fetched > 0 then
  local values = redis.call('HMGET', KEYS[3], unpack(fetched))
  local marks = {}
  for i, member in ipairs(fetched) do
    local owner, done = lease(values[i])
    if owner == node and not done then
      marks[#marks + 1] = member; marks[#marks + 1] = node .. '|f'
      local k = member_key(member)
      ST[k].n = math.max(0, ST[k].n - 1); dirty[k] = true; touched[k] = true
    end
  end
  if #marks > 0 then call_chunked('HSET', KEYS[3], marks, 2) end
end

-- handoff: a download ended and the node started a reserved entry of the same
-- key in its place: the ended one no longer holds a slot, the started one does
if #handoffs > 0 then
  local flat = {}
  for _, h in ipairs(handoffs) do flat[#flat + 1] = h[1]; flat[#flat + 1] = h[2] end
  local values = redis.call('HMGET', KEYS[3], unpack(flat))
  local marks = {}
  for i, h in ipairs(handoffs) do
    -- Both are of the same key; the ready set changes only if its count does.
    local k, delta = member_key(h[2]), 0
    local owner, flag = lease(values[2 * i - 1])
    if owner == node and not flag then
      marks[#marks + 1] = h[1]; marks[#marks + 1] = node .. '|f'
      delta = delta - 1
    end
    owner, flag = lease(values[2 * i])
    if owner == node and flag == 'r' then
      marks[#marks + 1] = h[2]; marks[#marks + 1] = node
      delta = delta + 1
    else
      stale = stale + 1    -- reclaimed meanwhile: it runs without a lease
    end
    ST[k].n = math.max(0, ST[k].n + delta); ST[k].last = now(); dirty[k] = true
    if delta ~= 0 then touched[k] = true end
  end
  if #marks > 0 then call_chunked('HSET', KEYS[3], marks, 2) end
end

-- ack
local ack_members = {}
for i, a in ipairs(acks) do ack_members[i] = a[1] end
settle(ack_members, function(i, member)
  gone[#gone + 1] = member
  local k = member_key(member)
  local s = ST[k]
  if acks[i][2] == '1' and (s.bo > 0 or s.er > 0) then
    -- a success lowers the key's error rate and relaxes its backoff (halved;
    -- gone below its interval): a site that recovered is back at full speed
    -- after a few answers
    s.er = math.floor(s.er * (1000000 - err_weight_of(k)) / 1000000)
    s.bo = math.floor(s.bo / 2)
    if s.bo <= LIM[k].delay then s.bo = 0 end
    dirty[k] = true
  end
end)

-- fail
local fail_members = {}
for i, f in ipairs(fails) do fail_members[i] = f[1] end
settle(fail_members, function(i, member)
  gone[#gone + 1] = member
  keep_record(fails[i][2], fails[i][3])
end)
if #gone > 0 then call_chunked('HDEL', KEYS[2], gone, 1) end

-- nack: not started, back to its queue (only the holder's)
local nacked = {}
for _, member in ipairs(nacks) do
  if lease(redis.call('HGET', KEYS[3], member)) == node then nacked[#nacked + 1] = member
  else stale = stale + 1 end
end
if #nacked > 0 then
  local back = {}
  for _, member in ipairs(nacked) do
    local k = member_key(member)
    local q = back[k]
    if not q then q = {}; back[k] = q end
    q[#q + 1] = score(member); q[#q + 1] = member
  end
  settle(nacked, function() end)
  for k, q in pairs(back) do call_chunked('ZADD', Q(k), q, 2) end
  qdelta = qdelta + #nacked
end
if #unheld > 0 then call_chunked('SREM', HELD(node), unheld, 1) end

-- The crawl's maxima for what a site may ask, in ms: kstate's field '||bounds'
-- = "longest block|longest backoff or crawl delay", recorded by the first
-- call that needed them, from its node's FRONTIER_RETRY_AFTER_MAX and
-- FRONTIER_BACKOFF_MAX (as the partition count is recorded by the first node
-- in the crawl's config), within the hard bounds above. Every call is held to
-- them, and to its own ARGV when lower: a call cannot raise them. Junk there
-- is counted and recorded again. Returns them as stored (the node compares
-- them with its own settings).
local bounds_stored = nil
local function bounds()
  if bounds_stored == nil then
    local raw = redis.call('HGET', KEYS[11], '||bounds')
    local b, o = string.match(raw or '', '^(%d+)|(%d+)$')
    b, o = count_of(b, BLOCK_HARD_MS), count_of(o, INTERVAL_HARD_MS)
    if not (b and o) then
      if raw then junk = junk + 1 end
      b, o = block_max, backoff_max
      redis.call('HSET', KEYS[11], '||bounds', fmt(b) .. '|' .. fmt(o))
    end
    bounds_stored = {b, o}
  end
  return math.min(bounds_stored[1], block_max), math.min(bounds_stored[2], backoff_max)
end

-- feedback: the site's word (Retry-After, 429/503 without it, robots.txt)
for _, f in ipairs(feedback) do
  local k, kind, ms = f[1], f[2], f[3]
  local s = ST[k]
  if kind == 'block' then
    local most = bounds()
    s.block = math.max(s.block, now() + math.min(ms, most))
  elseif kind == 'backoff' then
    -- In proportion: the answer raises the key's recent error rate, and only a
    -- rate over the tolerance slows the key down (its interval doubled). A few
    -- transient 5xx among many successes cost their retries, not the site's
    -- speed; a site answering mostly 429/503 reaches backoff_max within a few
    -- answers (the ones in flight when it turned).
    s.er = s.er + math.floor((1000000 - s.er) * err_weight_of(k) / 1000000)
    if s.er >= tolerance then
      local _, most = bounds()
      s.bo = math.min(most, math.max(s.bo * 2, LIM[k].delay * 2, backoff_base))
    end
  elseif kind == 'crawldelay' then
    local _, most = bounds()
    s.cd = math.min(ms, most)
  elseif kind == 'sent' then
    -- The node sent a request of K later than its lease allowed (its loop was
    -- busy after the buffer): K's next start counts from that send, not from
    -- the lease, or a request leased on time elsewhere would reach the site
    -- closer than the interval. (Reported before that next lease, as a late
    -- send is with the node's next call, this holds it; after, it holds the
    -- ones that follow.)
    s.last = math.max(s.last, now() - ms)
  end
  if kind ~= 'refused' then dirty[k] = true; raise[k] = true end
end

-- maintenance: renew this node's lease, then reclaim expired nodes' leases
local reclaimed = 0
local function requeue(members, done)
  -- Put MEMBERS (whose owner is gone) back in their queues; DONE[i] true when
  -- member i's download had ended (its key's slot is already free).
  local ks = {}
  for _, member in ipairs(members) do ks[#ks + 1] = member_key(member) end
  load(ks)
  local back, bad = {}, {}
  for i, member in ipairs(members) do
    if well_formed(member) then
      local k = member_key(member)
      local q = back[k]
      if not q then q = {}; back[k] = q end
      q[#q + 1] = score(member); q[#q + 1] = member
      if not done[i] then ST[k].n = math.max(0, ST[k].n - 1) end
      dirty[k] = true; touched[k] = true
    else
      bad[#bad + 1] = member
    end
  end
  call_chunked('HDEL', KEYS[3], members, 1)
  for k, q in pairs(back) do call_chunked('ZADD', Q(k), q, 2) end
  set_aside(bad, 'malformed member')
  qdelta = qdelta + #members - #bad
  reclaimed = reclaimed + #members - #bad
end
-- A window of the per-key state, from a cursor kept in the hash itself (field
-- '||cursor' -> "cursor|ms of the last window": no key starts with '|', so no
-- override field is '||...'): a call reads a bounded part of it however many
-- keys the partition has seen, and successive calls go round all of it (HSCAN:
-- keys there throughout are seen). The tidy windows are paced per partition,
-- not per node, so a hundred idle nodes cost what one does.
local SWEEP_WINDOW, TIDY_WINDOW, TIDY_EVERY_MS = 1000, 100, 100
local IDLE_MS = 259200000  -- 3 days: above twice the longest interval a limit may set
local function kstate_window(count, paced)
  -- Returns {field, value, ...} (overrides and the cursor left out), or nil
  -- when a paced window is not due yet.
  local raw = redis.call('HGET', KEYS[11], '||cursor') or ''
  local cursor, at = string.match(raw, '^(%d+)|(%d+)$')
  cursor, at = cursor or '0', tonumber(at) or 0
  if paced and at <= now() and now() - at < TIDY_EVERY_MS then return nil end
  -- A cursor written by someone else may be one HSCAN refuses: start over.
  local scan = redis.pcall('HSCAN', KEYS[11], cursor, 'COUNT', count)
  if scan.err then scan = redis.call('HSCAN', KEYS[11], '0', 'COUNT', count) end
  redis.call('HSET', KEYS[11], '||cursor', scan[1] .. '|' .. fmt(now()))
  local out = {}
  for i = 1, #scan[2], 2 do
    if string.sub(scan[2][i], 1, 1) ~= '|' then
      out[#out + 1] = scan[2][i]; out[#out + 1] = scan[2][i + 1]
    end
  end
  return out
end
local function reclaim(nd)
  -- Node ND is gone: its leases back to their queues. Only its own set is
  -- read, not every lease of the partition.
  local mine, done = leases_of(nd)
  if #mine > 0 then requeue(mine, done) end
  redis.call('DEL', HELD(nd))
  redis.call('ZREM', KEYS[4], nd)
end
local window = nil
if maintenance or ttl == 0 then
  if ttl > 0 then
    redis.call('ZADD', KEYS[4], fmt(now() + ttl), node)
  else
    redis.call('ZREM', KEYS[4], node)
    redis.call('ZREM', KEYS[16], node)
  end
  -- wanting marks of nodes long gone (a node id per process start)
  redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', fmt(now() - 60000))
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', fmt(now()), 'LIMIT', 0, 100)
  for _, nd in ipairs(expired) do reclaim(nd) end
  if sweep then
    -- wanting marks dated in the future (not written by this script)
    redis.call('ZREMRANGEBYSCORE', KEYS[16], '(' .. fmt(now() + 60000), '+inf')
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
    if #orphans > 0 then requeue(orphans, done) end
    -- Recounted: every key with a live lease, and the window of the state
    -- read below (all keys are recounted over successive sweeps).
    local all, seen = {}, {}
    for k, _ in pairs(count) do all[#all + 1] = k; seen[k] = true end
    window = kstate_window(SWEEP_WINDOW, false)
    for i = 1, #window, 2 do
      if not seen[window[i]] then all[#all + 1] = window[i] end
    end
    load(all)
    for _, k in ipairs(all) do
      if ST[k].n ~= (count[k] or 0) then ST[k].n = count[k] or 0; dirty[k] = true; touched[k] = true end
    end
  end
  -- Tidy: the state of a key idle for longer than any interval it could have
  -- is the same as no state, so it is dropped (a crawl of millions of hosts
  -- seen once would otherwise keep a field for each of them for ever).
  window = window or kstate_window(TIDY_WINDOW, true)
  if window then
    -- (paced with the tidy windows: at most every TIDY_EVERY_MS per partition)
    -- A deadline further away than the longest lease never comes (written by
    -- someone else): such a node is expired too, or its leases would never
    -- come back and it would count as a live node for ever.
    local forged = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. fmt(now() + LEASE_HARD_MS),
                              '+inf', 'LIMIT', 0, 100)
    for _, nd in ipairs(forged) do reclaim(nd) end
    junk = junk + #forged
    -- Likewise a ready time further away than any state can put it (a block or
    -- an interval of at most a day, jittered): the key is looked at now (a
    -- take checks its state before it leases).
    local far = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now() + IDLE_MS), '+inf',
                           'LIMIT', 0, 100)
    if #far > 0 then
      local at = {}
      for _, k in ipairs(far) do at[#at + 1] = fmt(now()); at[#at + 1] = k end
      redis.call('ZADD', KEYS[1], unpack(at))
      junk = junk + #far
    end
  end
  -- Only a state "0|last|block|0|0|error rate" can go (its error rate is
  -- forgotten with it): the others are not parsed.
  local idle = {}
  for i = 1, window and #window or 0, 2 do
    local k, v = window[i], window[i + 1]
    if not dirty[k] and string.sub(v, 1, 2) == '0|' then
      local la, bl = string.match(v, '^0|(%d+)|(%d+)|0|0|?%d*$')
      if la and now() - tonumber(la) > IDLE_MS and tonumber(bl) <= now() then
        idle[#idle + 1] = k
      end
    end
  end
  if #idle > 0 then
    load(idle)  -- this call's view (the state may have changed above) and limits
    local gone = {}
    for _, k in ipairs(idle) do
      local s = ST[k]
      if not dirty[k] and s.n == 0 and s.bo == 0 and s.cd == 0 and s.block <= now()
          and now() - s.last > math.max(IDLE_MS, 2 * (LIM[k].delay + pad(LIM[k].delay))) then
        gone[#gone + 1] = k
      end
    end
    if #gone > 0 then
      call_chunked('HDEL', KEYS[11], gone, 1)
      stat('keys_pruned', #gone)
    end
  end
end

-- delayed entries whose time has come go back to their queues
if promote then
  local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', fmt(now()), 'LIMIT', 0, 1000)
  if #due > 0 then
    local byq, bad = {}, {}
    for _, member in ipairs(due) do
      if well_formed(member) then
        local k = member_key(member)
        local q = byq[k]
        if not q then q = {}; byq[k] = q end
        q[#q + 1] = score(member); q[#q + 1] = member
        touched[k] = true
      else
        bad[#bad + 1] = member
      end
    end
    for k, q in pairs(byq) do call_chunked('ZADD', Q(k), q, 2) end
    call_chunked('ZREM', KEYS[5], due, 1)
    set_aside(bad, 'malformed member')
    qdelta = qdelta + #due - #bad
  end
end

-- Keys that got work, a free slot, a block or a backoff take their place in
-- the ready set before the take: a key at its concurrency leaves it, one that
-- got work or a free slot joins it at its next start (unless already there),
-- a block or backoff pushes it later.
do
  local rem, nx, gt, nowf = {}, {}, {}, nil
  for k, _ in pairs(touched) do
    if ST[k] == nil then   -- a hint, checked at take
      nowf = nowf or fmt(now())
      nx[#nx + 1] = nowf; nx[#nx + 1] = k
    elseif ST[k].n >= LIM[k].conc then rem[#rem + 1] = k
    else nx[#nx + 1] = fmt(math.max(now(), next_start(k))); nx[#nx + 1] = k end
  end
  for k, _ in pairs(raise) do
    if ST[k].n < LIM[k].conc then gt[#gt + 1] = fmt(next_start(k)); gt[#gt + 1] = k end
  end
  if #rem > 0 then call_chunked('ZREM', KEYS[1], rem, 1) end
  for i = 1, #nx, 1200 do redis.call('ZADD', KEYS[1], 'NX', unpack(nx, i, math.min(i + 1199, #nx))) end
  for i = 1, #gt, 1200 do redis.call('ZADD', KEYS[1], 'GT', unpack(gt, i, math.min(i + 1199, #gt))) end
end

-- take: from keys whose time has come, oldest-ready first, each once
local taken, capped = {}, 0
local members, unready, later, capped_keys, polite_keys = {}, {}, {}, {}, {}
local function lease_out(popped, value, out)
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
        missing = missing + 1
        keep_record('invalid', cjson.encode({member = member, reason = 'no payload',
                                             node = node, at = now() / 1000}))
      end
    end
  end
  if #owned > 0 then
    call_chunked('HSET', KEYS[3], owned, 2)
    call_chunked('SADD', HELD(node), held, 1)
    if not (maintenance or registered) then redis.call('ZADD', KEYS[4], fmt(now() + ttl), node) end
  end
  return lost
end
local function note_capped(k)
  capped = capped + 1
  if #capped_keys < 64 then capped_keys[#capped_keys + 1] = k end
end
local SHARE_WINDOW = 1000
local inflight_total = nil
local sharing, others, mine = nil, 0, {}
local passed, n_passed = {}, 0
local function room_for_me(k)
  -- How many more slots of key K this node may take now (nil: no limit).
  if sharing == nil then
    local wanting = redis.call('ZRANGEBYSCORE', KEYS[16], fmt(now() - SHARE_WINDOW), '+inf')
    for _, n in ipairs(wanting) do if n ~= node then others = others + 1 end end
    -- (marks are read from Redis: never more sharers than registered nodes)
    if others > 0 then others = math.min(others, redis.call('ZCARD', KEYS[4]) - 1) end
    sharing = others > 0
    if sharing then
      -- the slots held: leased here, download not ended, not a reserve
      local held, flags = leases_of(node)
      for i, m in ipairs(held) do
        local mk = not flags[i] and member_key(m)
        if mk then mine[mk] = (mine[mk] or 0) + 1 end
      end
    end
  end
  if not sharing then return nil end
  local share = math.ceil(math.min(LIM[k].conc, 1000000) / (1 + others))
  return math.max(0, share - (mine[k] or 0))
end
if take_n > 0 and ttl > 0 then
  local want, offset = take_n, 0
  for _ = 1, 10 do
    if want <= 0 then break end
    local ks = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now()), 'LIMIT', offset, want)
    if #ks == 0 then break end
    offset = offset + #ks
    load(ks)
    for _, k in ipairs(ks) do
      if want <= 0 then break end
      local s, l = ST[k], LIM[k]
      if s.n >= l.conc then
        -- A count above every lease there is was written by someone else: the
        -- sweep recounts it, but an idle cluster may make no sweep, and the
        -- key would wait for ever.
        inflight_total = inflight_total or redis.call('HLEN', KEYS[3])
        if s.n > inflight_total then
          s.n = inflight_total; dirty[k] = true; junk = junk + 1
        end
      end
      local due = earliest(k)
      if s.n >= l.conc then
        unready[k] = true
        note_capped(k)           -- at its concurrency: the node reports ends at once
      elseif due > now() then
        later[#later + 1] = fmt(due); later[#later + 1] = k   -- an early hint: wait its turn
      else
        local count = math.min(want, l.conc - s.n)
        local polite = interval(k) > 0
        if polite then count = math.min(1, polite_budget) end
        local room = room_for_me(k)
        local held_back = room ~= nil and room < count
        if held_back then count = room end
        local popped = count > 0 and redis.call('ZPOPMIN', Q(k), count) or {}
        if (polite or held_back) and count == 0 then popped = nil end
        if popped == nil then
          -- no start budget left for polite keys in this call, or this node
          -- holds its share of the key: it stays ready (for the others)
          if held_back then passed[k] = true; n_passed = n_passed + 1 end
        elseif #popped == 0 then
          unready[k] = true      -- its queue ran empty: out of the ready set
        else
          local got, bad = 0, {}
          for i = 1, #popped, 2 do
            if well_formed(popped[i], k) then members[#members + 1] = popped[i]; got = got + 1
            else bad[#bad + 1] = popped[i] end
          end
          if #bad > 0 then set_aside(bad, 'malformed member'); qdelta = qdelta - #bad end
          if got > 0 then
            if polite then
              polite_budget = polite_budget - got
              polite_keys[#polite_keys + 1] = k
              polite_keys[#polite_keys + 1] = interval(k)
            end
            s.n = s.n + got; s.last = now(); dirty[k] = true; took[k] = true
            if s.n >= l.conc then note_capped(k) end   -- filled up to its concurrency
            want = want - got
            qdelta = qdelta - got
          end
        end
      end
    end
  end
  for _, member in ipairs(lease_out(members, node, taken)) do
    local k = member_key(member)
    ST[k].n = math.max(0, ST[k].n - 1)
  end
end

-- reserve: entries of keys at their concurrency, for this node's hand-offs
local reserved, status = {}, {}
if #reserve > 0 and ttl > 0 then
  local nodes = math.max(1, redis.call('ZCARD', KEYS[4]))
  local rmembers = {}
  for _, r in ipairs(reserve) do
    local k, s, l = r[1], ST[r[1]], LIM[r[1]]
    local share = math.ceil(math.min(l.conc, 1000000) / nodes)
    local ok = interval(k) == 0 and s.block <= now() and s.n <= l.conc
    status[#status + 1] = k; status[#status + 1] = ok and 1 or 0; status[#status + 1] = share
    local count = math.min(r[2], share)
    if ok and s.n >= l.conc and count > 0 then
      local popped, bad = redis.call('ZPOPMIN', Q(k), count), {}
      for i = 1, #popped, 2 do
        if well_formed(popped[i], k) then rmembers[#rmembers + 1] = popped[i]
        else bad[#bad + 1] = popped[i] end
      end
      set_aside(bad, 'malformed member')
      qdelta = qdelta - #popped / 2
    end
  end
  lease_out(rmembers, node .. '|r', reserved)   -- a reserve holds no slot to mend
end

-- write back the touched keys' state; the keys taken from get their next
-- start (or leave the ready set at their concurrency or found empty)
local states, rem, set = {}, {}, {}
for k, _ in pairs(dirty) do
  local s = ST[k]
  states[#states + 1] = k
  states[#states + 1] = s.n .. '|' .. s.last .. '|' .. s.block .. '|' .. s.bo .. '|' .. s.cd
                        .. '|' .. s.er
end
-- The queue length: as read plus this call's changes. A partition without the
-- field is new or was begun by an older version (its count is KEYS[15], moved
-- here); a value that is not a count (written by someone else) is recounted
-- from the entries, each of which has a payload while it is queued, delayed
-- or in flight.
if not qlen_read then qlen_raw, qlen_read = redis.call('HGET', KEYS[11], '||qlen'), true end
-- (A count is never negative: a node that read one would think nothing is
-- queued and close.)
local qlen = qlen_raw and string.match(qlen_raw, '^%d+$') and tonumber(qlen_raw)
if qlen then
  qlen = qlen + qdelta
else
  local junk_qlen = qlen_raw ~= false
  if not junk_qlen then
    local old = redis.pcall('GET', KEYS[15])
    qlen = type(old) == 'string' and string.match(old, '^%d+$') and tonumber(old)
    if qlen then qlen = qlen + qdelta end
    junk_qlen = old ~= false and not qlen
    if old ~= false then redis.call('DEL', KEYS[15]) end   -- whatever type it had
  end
  if not qlen then
    qlen = math.max(0, redis.call('HLEN', KEYS[2]) - redis.call('HLEN', KEYS[3])
                       - redis.call('ZCARD', KEYS[5]))
  end
  if junk_qlen then stat('qlen_recounted', 1) end
end
if qlen_raw ~= fmt(qlen) then
  states[#states + 1] = '||qlen'; states[#states + 1] = fmt(qlen)
end
for k, _ in pairs(unready) do rem[#rem + 1] = k end
for k, _ in pairs(took) do
  if ST[k].n >= LIM[k].conc then rem[#rem + 1] = k
  elseif not unready[k] then set[#set + 1] = fmt(next_start(k)); set[#set + 1] = k end
end
for i = 1, #later do set[#set + 1] = later[i] end
if #states > 0 then call_chunked('HSET', KEYS[11], states, 2) end
-- keys whose state was read as junk: their ready time as their mended state
-- says (a block or last start far ahead had put it far ahead too)
for k, _ in pairs(reready) do
  if ST[k] then redis.call('ZADD', KEYS[1], 'XX', fmt(math.max(now(), next_start(k))), k) end
end
if #rem > 0 then call_chunked('ZREM', KEYS[1], rem, 1) end
if #set > 0 then call_chunked('ZADD', KEYS[1], set, 2) end

local delayed_len, inflight_len, next_ready = -1, -1, -1
if maintenance then
  delayed_len = redis.call('ZCARD', KEYS[5])
  inflight_len = redis.call('HLEN', KEYS[3])
end
if (take_n > 0 and #taken / 2 + missing < take_n) or maintenance then
  -- (a key passed over for the others is not this node's to wait for)
  local first = redis.call('ZRANGE', KEYS[1], 0, n_passed, 'WITHSCORES')
  for i = 1, #first, 2 do
    if not passed[first[i]] then next_ready = first[i + 1]; break end
  end
elseif take_n > 0 then
  next_ready = -2  -- the take got all it asked for: more may be ready now
end
if take_n > 0 and ttl > 0 then
  if #taken / 2 + missing < take_n and qlen > 0 then
    redis.call('ZADD', KEYS[16], fmt(now()), node)   -- wanting: see the header
  end
end
if junk > 0 then stat('state_junk', junk) end
return {taken, added, dups, qlen, delayed_len, inflight_len, reclaimed,
        now_cache and fmt(now_cache) or -1, stale, missing, trimmed, next_ready, capped,
        reserved, status, capped_keys, polite_keys, budget_refused, junk, budget_skipped,
        sent_refused, bounds_stored and {bounds_stored[1], bounds_stored[2]} or {}}
