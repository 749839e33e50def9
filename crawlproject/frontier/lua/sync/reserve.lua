-- sync/reserve.lua: entries of keys at their concurrency leased to this node
-- in reserve, for its hand-offs (contract.lua, Reserve).
-- Reads KEYS[4] nodes (ZCARD: the share); pops the queues KEYS[13]:<key>;
-- leases as '<node>|r' (lease_out, take.lua).
-- Sets C.reserved {member, payload, ...} and C.status {key, 1|0, share, ...};
-- moves C.qdelta.
local function sync_reserve(c)
  c.reserved, c.status = {}, {}
  if not (#c.reserve > 0 and c.ttl > 0) then return end
  local ST, LIM, status = c.ST, c.LIM, c.status
  local nodes = math.max(1, redis.call('ZCARD', KEYS[4]))
  local rmembers = {}
  for _, r in ipairs(c.reserve) do
    local k, s, l = r[1], ST[r[1]], LIM[r[1]]
    local share = math.ceil(math.min(l.conc, 1000000) / nodes)
    local ok = interval(c, k) == 0 and s.block <= now(c) and s.n <= l.conc
    status[#status + 1] = k; status[#status + 1] = ok and 1 or 0; status[#status + 1] = share
    local count = math.min(r[2], share)
    if ok and s.n >= l.conc and count > 0 then
      local popped, bad = redis.call('ZPOPMIN', Q(k), count), {}
      for i = 1, #popped, 2 do
        if well_formed(popped[i], k) then rmembers[#rmembers + 1] = popped[i]
        else bad[#bad + 1] = popped[i] end
      end
      set_aside(c, bad, 'malformed member')
      c.qdelta = c.qdelta - #popped / 2
    end
  end
  lease_out(c, rmembers, c.node .. '|r', c.reserved)   -- a reserve holds no slot to mend
end
