-- sync/ready.lua: keys that got work, a free slot, a block or a backoff take
-- their place in KEYS[1] ready before the take: a key at its concurrency
-- leaves it, one that got work or a free slot joins it at its next start
-- (unless already there), a block or backoff pushes it later.
-- Reads C.touched, C.raise, C.ST, C.LIM; writes KEYS[1] (ZREM, ZADD NX, ZADD GT).
local function sync_ready(c)
  local ST, LIM = c.ST, c.LIM
  local rem, nx, gt, nowf = {}, {}, {}, nil
  for k, _ in pairs(c.touched) do
    if ST[k] == nil then   -- a hint, checked at take
      nowf = nowf or fmt(now(c))
      nx[#nx + 1] = nowf; nx[#nx + 1] = k
    elseif ST[k].n >= LIM[k].conc then rem[#rem + 1] = k
    else nx[#nx + 1] = fmt(math.max(now(c), next_start(c, k))); nx[#nx + 1] = k end
  end
  for k, _ in pairs(c.raise) do
    if ST[k].n < LIM[k].conc then gt[#gt + 1] = fmt(next_start(c, k)); gt[#gt + 1] = k end
  end
  if #rem > 0 then call_chunked('ZREM', KEYS[1], rem, 1) end
  for i = 1, #nx, 1200 do redis.call('ZADD', KEYS[1], 'NX', unpack(nx, i, math.min(i + 1199, #nx))) end
  for i = 1, #gt, 1200 do redis.call('ZADD', KEYS[1], 'GT', unpack(gt, i, math.min(i + 1199, #gt))) end
end
