-- sync/promote.lua: delayed entries whose time has come go back to their
-- queues (flag 'd', or 'm'/'s'), at most 1000 a call.
-- Reads/writes KEYS[5] delayed, the queues KEYS[13]:<key>; malformed members
-- are set aside (KEYS[7]). Marks keys touched; adds to C.qdelta.
local function sync_promote(c)
  if not c.promote then return end
  local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', fmt(now(c)), 'LIMIT', 0, 1000)
  if #due == 0 then return end
  local byq, bad = {}, {}
  for _, member in ipairs(due) do
    if well_formed(member) then
      local k = member_key(member)
      local q = byq[k]
      if not q then q = {}; byq[k] = q end
      q[#q + 1] = score(member); q[#q + 1] = member
      c.touched[k] = true
    else
      bad[#bad + 1] = member
    end
  end
  for k, q in pairs(byq) do call_chunked('ZADD', Q(k), q, 2) end
  call_chunked('ZREM', KEYS[5], due, 1)
  set_aside(c, bad, 'malformed member')
  c.qdelta = c.qdelta + #due - #bad
end
