-- sync/budgets.lua: a key (a site) may queue at most its budget of new pages,
-- and this partition at most the crawl budget; what is over is refused and
-- counted (per key, per partition, and in the reply), never queued.
-- Reads KEYS[11] '||budgets' (how many overrides carry a budget) and '||qlen'
-- (read along) when no setting gives a budget; reads and writes KEYS[17]
-- budget (key -> "admitted|refused", '||crawl' for the partition); counts
-- KEYS[10] 'budget_refused' and 'budget_skipped'.
-- within_budget(c, keep) returns the ARGV positions of the adds it admits;
-- sets C.budget_refused and C.budget_skipped.
--
-- Only new pages count (an add with a fingerprint): a retry or a page waiting
-- for its site's robots.txt is the same page again. Budgets apply when a
-- setting gives one or an override has one (kstate's '||budgets' counts those).
-- A budget key of another type than a hash (written by someone else) does not
-- stop the call, nor any other site of the partition: this call's budget
-- accounting is skipped (its new pages are admitted, none counted), and the
-- reply says so (budget_skipped), for the node to log and count. It is not
-- repaired here: a script does not delete what it did not write, and counts
-- started again from 0 would admit a whole budget more per site anyway; the
-- operator deletes the key and counting starts again.
local function within_budget(c, keep)
  if #keep == 0 then return keep end
  if c.def_budget <= 0 and c.crawl_budget <= 0 then
    -- (read with the queue length, which the call reads anyway: no command more)
    local got = redis.call('HMGET', KEYS[11], '||budgets', '||qlen', '||backlog')
    if not c.qlen_read then c.qlen_raw, c.qlen_read, c.backlog_raw = got[2], true, got[3] end
    local n = count_of(got[1], 1e15)
    -- junk there counts as budgets to check (the per-key check decides)
    if got[1] and not n then c.junk = c.junk + 1; n = 1 end
    if (n or 0) <= 0 then return keep end
  end
  local function skip()
    c.budget_skipped = 1
    stat('budget_skipped', 1)
    return keep
  end
  local ks, seen_k = {}, {}
  for _, e in ipairs(keep) do
    local k = ARGV[e]
    if ARGV[e + 1] ~= '' and not seen_k[k] then seen_k[k] = true; ks[#ks + 1] = k end
  end
  if #ks == 0 then
    -- nothing to count: only the key's type, for the reply
    local t = redis.call('TYPE', KEYS[17]).ok
    if t ~= 'hash' and t ~= 'none' then return skip() end
    return keep
  end
  load(c, ks)
  local count = {}
  local fields = {unpack(ks)}
  fields[#fields + 1] = '||crawl'
  for i = 1, #fields, 500 do
    local last = math.min(i + 499, #fields)
    -- the key's type is checked by the read itself (WRONGTYPE), not by a TYPE
    -- before it: one command less in every call that adds a new page
    local got = redis.pcall('HMGET', KEYS[17], unpack(fields, i, last))
    if got.err then return skip() end
    for j = i, last do
      local raw = got[j - i + 1]
      local a, r = string.match(raw or '', '^(%d+)|(%d+)$')
      a, r = count_of(a, 1e15), count_of(r, 1e15)
      if raw and not (a and r) then
        -- field by field: a valid count is kept, junk starts again from 0
        local f = fields_of(raw, 2)
        a, r = count_of(f[1], 1e15), count_of(f[2], 1e15)
        c.junk = c.junk + (a and 0 or 1) + (r and 0 or 1) + (#f == 2 and 0 or 1)
      end
      count[fields[j]] = {a = a or 0, r = r or 0}
    end
  end
  local crawl, out, refused = count['||crawl'], {}, 0
  for _, e in ipairs(keep) do
    local k = ARGV[e]
    if ARGV[e + 1] == '' then
      out[#out + 1] = e
    else
      local n, b = count[k], c.LIM[k].budget
      if (b > 0 and n.a >= b) or (c.crawl_budget > 0 and crawl.a >= c.crawl_budget) then
        n.r = n.r + 1; crawl.r = crawl.r + 1; refused = refused + 1
      else
        n.a = n.a + 1; crawl.a = crawl.a + 1; out[#out + 1] = e
      end
    end
  end
  local values = {}
  for k, n in pairs(count) do values[#values + 1] = k; values[#values + 1] = fmt(n.a) .. '|' .. fmt(n.r) end
  call_chunked('HSET', KEYS[17], values, 2)
  c.budget_refused = c.budget_refused + refused
  if refused > 0 then stat('budget_refused', refused) end
  return out
end
