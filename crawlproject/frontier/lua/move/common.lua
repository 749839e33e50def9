-- move/common.lua: what the move scripts (the MongoDB tier's spill and refill,
-- crawlproject/frontier/mover.py) share. Their KEYS, in this order
-- (crawlproject.keys.FrontierKeys.move_keys), each script using some:
--   KEYS[1] mover    hash: key -> "node|deadline ms|epoch", the one node moving
--                    that key; field '||epoch' -> the last epoch given (no key
--                    starts with '|')
--   KEYS[2] moves    zset: key -> since when it wants a move
--   KEYS[3] queue prefix     (KEYS[3]:<key>: the key's queue, zset)
--   KEYS[4] moving prefix    (KEYS[4]:<key>: members leaving for MongoDB, zset
--                             by queue score, payloads kept)
--   KEYS[5] refilled prefix  (KEYS[5]:<key>: members back in the queue whose
--                             MongoDB copy is not yet tombstoned, set)
--   KEYS[6] payloads, KEYS[7] inflight, KEYS[8] delayed (SYNC's)
--   KEYS[9] backlog  zset: key -> its entries in MongoDB
--   KEYS[10] kstate  hash: '||backlog' (the partition's entries in MongoDB),
--                    '||qlen' (entries queued in Redis, SYNC's count)
--   KEYS[11] ready, KEYS[12] stats (SYNC's)
-- ARGV[1] is the time in ms ('' : Redis server time), ARGV[2] the node, ARGV[3]
-- the politeness key; the commit scripts' ARGV[4] is the epoch their claim got.
--
-- Fencing: every claim raises the partition's epoch; a commit is refused
-- unless the key's lease names this node and that epoch and has not expired
-- (Redis time): a node paused or cut off past its lease never commits.
-- '||qlen' counts the entries with a payload that are neither in flight nor
-- delayed (SYNC's recount): a member leaving for MongoDB keeps its payload and
-- so its place in '||qlen' until SPILL_COMMIT deletes the payload.
local function MOVING(k) return KEYS[4] .. ':' .. k end
local function REFILLED(k) return KEYS[5] .. ':' .. k end
local function QUEUE(k) return KEYS[3] .. ':' .. k end
-- the most members one script moves (docs/frontier.md: batches of 256)
local MOVE_BATCH_MAX = 1024

local function move_stat(name, n)
  local r = redis.pcall('HINCRBY', KEYS[12], name, n)
  if type(r) == 'table' and r.err then redis.pcall('HSET', KEYS[12], name, n) end
end

local function lease_of(k)
  -- node, deadline, epoch of K's lease (nil: none, or junk: as none)
  local v = redis.call('HGET', KEYS[1], k)
  if not v then return nil end
  local node, deadline, epoch = string.match(v, '^(.*)|(%d+)|(%d+)$')
  if not node then return nil end
  return node, tonumber(deadline), epoch
end

local function fence(now_ms)
  -- nil when this call (ARGV[2] node, ARGV[3] key, ARGV[4] epoch) holds the
  -- key's live lease, else why not
  local node, deadline, epoch = lease_of(ARGV[3])
  if node == nil then return 'no lease' end
  if node ~= ARGV[2] or epoch ~= ARGV[4] then return 'lease taken over' end
  if deadline <= now_ms then return 'lease expired' end
  return nil
end

local function check_types(list)
  -- {key, type, ...}: the first that holds another type (refused before
  -- anything is written: a script is not rolled back)
  for i = 1, #list, 2 do
    local bad = bad_key(list[i], list[i + 1])
    if bad then return bad end
  end
  return nil
end

local function qlen_add(delta)
  -- SYNC's '||qlen' moved by DELTA (after the change was made): junk there is
  -- recounted from the entries as writeback.lua does
  local raw = redis.call('HGET', KEYS[10], '||qlen')
  local q = raw and string.match(raw, '^%d+$') and tonumber(raw)
  if q then
    q = math.max(0, q + delta)
  else
    q = math.max(0, redis.call('HLEN', KEYS[6]) - redis.call('HLEN', KEYS[7])
                    - redis.call('ZCARD', KEYS[8]))
    if raw then move_stat('qlen_recounted', 1) end
  end
  redis.call('HSET', KEYS[10], '||qlen', fmt(q))
end

local function backlog_add(k, delta)
  -- KEYS[9][K] and KEYS[10] '||backlog' moved by DELTA (never below 0); junk in
  -- '||backlog' is recounted from KEYS[9]
  local left = tonumber(redis.call('ZINCRBY', KEYS[9], delta, k))
  if left <= 0 then redis.call('ZREM', KEYS[9], k) end
  local raw = redis.call('HGET', KEYS[10], '||backlog')
  local total = raw and string.match(raw, '^%d+$') and tonumber(raw)
  if total then
    total = math.max(0, total + delta)
  else
    total = 0
    local cursor = 0
    repeat
      local page = redis.call('ZSCAN', KEYS[9], cursor, 'COUNT', 1000)
      cursor = tonumber(page[1])
      for i = 2, #page[2], 2 do total = total + math.max(0, tonumber(page[2][i])) end
    until cursor == 0
    if raw then move_stat('backlog_recounted', 1) end
  end
  redis.call('HSET', KEYS[10], '||backlog', fmt(total))
end

local function mover_member_ok(member, k)
  -- "<priority>:<seq>@<key>" of key K, as SYNC writes it (well_formed in
  -- lua/sync/context.lua)
  local p, sq, key = string.match(member, '^(%-?%d+):(%d+)@(.*)$')
  return p ~= nil and #p <= 5 and #sq <= 15 and math.abs(tonumber(p)) <= 4095 and key == k
end
