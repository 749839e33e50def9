-- sync/feedback.lua: the site's word (Retry-After, 429/503 without it,
-- robots.txt crawl delay) and late sends, applied to each key's state.
-- Reads/writes KEYS[11] '||bounds' (bounds(): the crawl's maxima).
-- Moves C.ST[k].block, .bo, .er, .cd, .last; marks keys dirty and raised
-- (C.raise: their ready time goes later, ready.lua); sets C.bounds_stored.
--
-- The crawl's maxima for what a site may ask, in ms: kstate's field '||bounds'
-- = "longest block|longest backoff or crawl delay", recorded by the first
-- call that needed them, from its node's FRONTIER_RETRY_AFTER_MAX and
-- FRONTIER_BACKOFF_MAX (as the partition count is recorded by the first node
-- in the crawl's config), within the hard bounds (contract.lua). Every call is
-- held to them, and to its own ARGV when lower: a call cannot raise them. Junk
-- there is counted and recorded again. C.bounds_stored is them as stored (the
-- node compares them with its own settings).
local function bounds(c)
  if c.bounds_stored == nil then
    local raw = redis.call('HGET', KEYS[11], '||bounds')
    local b, o = string.match(raw or '', '^(%d+)|(%d+)$')
    b, o = count_of(b, BLOCK_HARD_MS), count_of(o, INTERVAL_HARD_MS)
    if not (b and o) then
      if raw then c.junk = c.junk + 1 end
      b, o = c.block_max, c.backoff_max
      redis.call('HSET', KEYS[11], '||bounds', fmt(b) .. '|' .. fmt(o))
    end
    c.bounds_stored = {b, o}
  end
  return math.min(c.bounds_stored[1], c.block_max), math.min(c.bounds_stored[2], c.backoff_max)
end

local function sync_feedback(c)
  local ST, LIM = c.ST, c.LIM
  for _, f in ipairs(c.feedback) do
    local k, kind, ms = f[1], f[2], f[3]
    local s = ST[k]
    if kind == 'block' then
      local most = bounds(c)
      s.block = math.max(s.block, now(c) + math.min(ms, most))
    elseif kind == 'backoff' then
      -- In proportion: the answer raises the key's recent error rate, and only a
      -- rate over the tolerance slows the key down (its interval doubled). A few
      -- transient 5xx among many successes cost their retries, not the site's
      -- speed; a site answering mostly 429/503 reaches backoff_max within a few
      -- answers (the ones in flight when it turned).
      s.er = s.er + math.floor((1000000 - s.er) * err_weight_of(c, k) / 1000000)
      if s.er >= c.tolerance then
        local _, most = bounds(c)
        s.bo = math.min(most, math.max(s.bo * 2, LIM[k].delay * 2, c.backoff_base))
      end
    elseif kind == 'crawldelay' then
      local _, most = bounds(c)
      s.cd = math.min(ms, most)
    elseif kind == 'sent' then
      -- The node sent a request of K later than its lease allowed (its loop was
      -- busy after the buffer): K's next start counts from that send, not from
      -- the lease, or a request leased on time elsewhere would reach the site
      -- closer than the interval. (Reported before that next lease, as a late
      -- send is with the node's next call, this holds it; after, it holds the
      -- ones that follow.)
      moved_last(c, s, math.max(s.last, now(c) - ms), 0)   -- (pace.lua)
    end
    if kind ~= 'refused' then c.dirty[k] = true; c.raise[k] = true end
  end
end
