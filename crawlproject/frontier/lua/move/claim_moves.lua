-- CLAIM_MOVES: claim the lease of one politeness key to move its entries
-- between Redis and MongoDB (crawlproject/frontier/mover.py; KEYS and the
-- fencing rule: move/common.lua), and for a spill do its step 1.
-- KEYS: FrontierKeys.move_keys(); uses KEYS[1] mover, KEYS[2] moves, KEYS[3]:<key>
--       queue, KEYS[4]:<key> moving, KEYS[5]:<key> refilled, KEYS[6] payloads,
--       KEYS[12] stats.
-- ARGV: [1] now ms ('' : Redis time), [2] node, [3] key, [4] lease ms,
--       [5] 'spill' or 'refill', [6] window (spill: the entries the queue keeps),
--       [7] batch (spill: the most members moved, <= 1024).
-- Returns {status, epoch, deadline, moving, refilled, moved}:
--   status 'busy': another node holds a live lease (its deadline in the third
--          field; nothing changed); 'idle': a spill with no leftovers and a
--          queue within its window (no lease taken); 'claimed': the lease is
--          this node's, with EPOCH (every commit passes it) until DEADLINE (ms);
--   moving: {member, score, payload, ...} of KEYS[4]:<key>, the members
--          leaving for MongoDB: a dead predecessor's leftovers, or those this
--          spill's step 1 moved there (MOVED of them; 0: all are leftovers);
--   refilled: members of KEYS[5]:<key>, a dead predecessor's refill whose
--          MongoDB copies are to be tombstoned before anything else.
-- Leftovers are finished first: step 1 runs only when both sets are empty.
-- Step 1 moves the key's worst-ranked members beyond the window (highest
-- scores: lowest priority, newest) out of the queue into KEYS[4]:<key>, with
-- their scores; their payloads stay (not takeable, still durable in Redis).
-- A member this script does not write, or one without payload, stays in the
-- queue (the take sets it aside, as always).
local now_ms = server_now(ARGV[1])
local node, k, lease_ms, kind = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local window = math.max(0, tonumber(ARGV[6]) or 0)
local batch = math.max(1, math.min(MOVE_BATCH_MAX, tonumber(ARGV[7]) or 256))
if kind ~= 'spill' and kind ~= 'refill' then
  return redis.error_reply('BADARG move kind must be spill or refill, not ' .. tostring(kind))
end
local holder, deadline = lease_of(k)
if holder ~= nil and holder ~= node and deadline > now_ms then
  return {'busy', '', fmt(deadline), {}, {}, 0}
end
local bad = check_types({KEYS[1], 'hash', QUEUE(k), 'zset', MOVING(k), 'zset',
                         REFILLED(k), 'set', KEYS[6], 'hash'})
if bad then return redis.error_reply('BADKEY ' .. bad) end

local moving, moved = {}, 0
local refilled = redis.call('SMEMBERS', REFILLED(k))
local left = redis.call('ZRANGE', MOVING(k), 0, -1, 'WITHSCORES')
if #left > 0 then
  local members = {}
  for i = 1, #left, 2 do members[#members + 1] = left[i] end
  local payloads = redis.call('HMGET', KEYS[6], unpack(members))
  local lost = {}
  for i, member in ipairs(members) do
    if payloads[i] then
      moving[#moving + 1] = member; moving[#moving + 1] = left[2 * i]
      moving[#moving + 1] = payloads[i]
    else
      lost[#lost + 1] = member   -- deleted by someone else: nothing left to spill
    end
  end
  if #lost > 0 then
    redis.call('ZREM', MOVING(k), unpack(lost))
    move_stat('backlog_lost_payload', #lost)
  end
elseif #refilled == 0 and kind == 'spill' then
  local extra = redis.call('ZCARD', QUEUE(k)) - window
  if extra > 0 then
    local count = math.min(extra, batch)
    local worst = redis.call('ZRANGE', QUEUE(k), -count, -1, 'WITHSCORES')
    local members = {}
    for i = 1, #worst, 2 do members[#members + 1] = worst[i] end
    local payloads = redis.call('HMGET', KEYS[6], unpack(members))
    local zargs = {}
    for i, member in ipairs(members) do
      if payloads[i] and mover_member_ok(member, k) then
        zargs[#zargs + 1] = worst[2 * i]; zargs[#zargs + 1] = member
        moving[#moving + 1] = member; moving[#moving + 1] = worst[2 * i]
        moving[#moving + 1] = payloads[i]
      end
    end
    if #zargs > 0 then
      local out = {}
      for i = 2, #zargs, 2 do out[#out + 1] = zargs[i] end
      redis.call('ZREM', QUEUE(k), unpack(out))
      redis.call('ZADD', MOVING(k), unpack(zargs))
      moved = #out
    end
  end
  if moved == 0 then return {'idle', '', '0', {}, {}, 0} end
end

local epoch = redis.pcall('HINCRBY', KEYS[1], '||epoch', 1)
if type(epoch) == 'table' then
  -- junk in the counter: start again above any epoch a count could have given
  epoch = now_ms * 1000
  redis.call('HSET', KEYS[1], '||epoch', fmt(epoch))
  move_stat('move_epoch_junk', 1)
end
local until_ms = now_ms + math.max(1, lease_ms)
redis.call('HSET', KEYS[1], k, node .. '|' .. fmt(until_ms) .. '|' .. fmt(epoch))
redis.call('ZREM', KEYS[2], k)
return {'claimed', fmt(epoch), fmt(until_ms), moving, refilled, moved}
