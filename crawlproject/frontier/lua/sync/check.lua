-- sync/check.lua: check mode (flag 'c'): before anything is written, every key
-- the call may write must hold the right type (the node's call before this
-- one stopped inside the script, which is not rolled back).
-- Reads the types of KEYS[1..7], KEYS[9], KEYS[11], KEYS[12], KEYS[16], this
-- node's held set, and the queues of the call's adds and nacks and of the
-- first 1000 ready keys and delayed entries (ZRANGE of KEYS[1] and KEYS[5]).
-- Returns nil, or the error reply 'BADKEY <key> is a <type>, not a <type>:
-- nothing changed' that the call returns.
local function sync_check(c)
  if not c.check then return nil end
  local bad = nil
  -- (not the stats hash nor the budget hash: junk there stops no call, see
  -- stat() and within_budget())
  local want = {{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[3], 'hash'}, {KEYS[4], 'zset'},
                {KEYS[5], 'zset'}, {KEYS[6], 'list'}, {KEYS[7], 'list'}, {KEYS[9], 'hash'},
                {KEYS[11], 'hash'}, {KEYS[12], 'hash'},
                {KEYS[16], 'zset'}, {HELD(c.node), 'set'}}
  for _, w in ipairs(want) do bad = bad or bad_key(w[1], w[2]) end
  -- the queues this call may write: of its adds, its nacks, and the keys a
  -- take or a promotion looks at first (the seq counter mends itself)
  if not bad then
    local qs = {}
    for _, e in ipairs(c.entries) do qs[ARGV[e]] = true end
    for _, m in ipairs(c.nacks) do qs[member_key(m) or ''] = true end
    for _, k in ipairs(redis.call('ZRANGE', KEYS[1], 0, 999)) do qs[k] = true end
    for _, m in ipairs(redis.call('ZRANGE', KEYS[5], 0, 999)) do qs[member_key(m) or ''] = true end
    for k, _ in pairs(qs) do bad = bad or bad_key(Q(k), 'zset') end
  end
  if bad then return redis.error_reply('BADKEY ' .. bad .. ': nothing changed') end
  return nil
end
