-- sync/pace.lua: each politeness key's observed pace and its window in Redis
-- (docs/frontier.md, "The window rule"; crawlproject/frontier/window.py
-- computes the same for the mover, with the same constants).
-- The pace is kept in the key's state in KEYS[11] kstate, fields 7 and 8
-- ("...|starts|history": its starts x 1000, decaying with PACE_TAU_MS, as of
-- its last start; the ms of history then, at most PACE_HISTORY_MS), read by
-- keystate.lua and written back with the state by writeback.lua: no command
-- of its own. Counted only while the MongoDB tier is on (spill above > 0).
-- moved_last moves C.ST[k].last, .pc, .ph; window_of reads C.ST, C.LIM and
-- C.window_ms, C.window_min, C.window_max (args.lua).
local PACE_TAU_MS = 60000        -- the moving average's time constant
local PACE_HISTORY_MS = 600000   -- beyond this much history the average is whole
local PACE_SETTLED_MS = 5000     -- observed after this long, or window-min starts
local PACE_FLOOR_MS = 1000       -- a first burst is never a pace over a shorter span
local exp, floor = math.exp, math.floor
local function moved_last(c, s, at, got)
  -- K's last start moves to AT (not before s.last) with GOT starts (0: a late
  -- send moved it): the count decays by the time passed, then counts them.
  if s.pc ~= nil then
    local g = at - s.last
    if g < 0 then g = 0 end
    local pc, ph = floor(s.pc * exp(-g / PACE_TAU_MS) + got * 1000 + 0.5), s.ph + g
    s.pc = pc < 1e12 and pc or 1e12
    s.ph = ph < PACE_HISTORY_MS and ph or PACE_HISTORY_MS
  elseif got > 0 and c.spill_above > 0 then
    s.pc, s.ph = got * 1000, 0
  end
  s.last = at
end
local function pace_of(c, s)
  -- K's observed starts per ms now (the count decayed to now over the span it
  -- was gathered in: exact from the first start on, as the average is not
  -- yet whole), or nil before it started enough to say.
  if s.pc == nil or (s.ph + now(c) - s.last < PACE_SETTLED_MS and s.pc < c.window_min * 1000) then
    return nil
  end
  local g = math.max(0, now(c) - s.last)
  local span = PACE_TAU_MS * (1 - math.exp(-(s.ph + g) / PACE_TAU_MS))
  return s.pc / 1000 * math.exp(-g / PACE_TAU_MS) / math.max(PACE_FLOOR_MS, span)
end
local function window_of(c, k)
  -- W(k) = clamp(ceil(window ms x pace), min, max): the pace observed, at
  -- most what the key's limits allow (1 / interval); before it is observed,
  -- what they allow (no interval: max).
  local delay, p = c.LIM[k].delay, pace_of(c, c.ST[k])
  local w
  if p ~= nil and (delay <= 0 or p * delay < 1) then
    w = math.ceil(c.window_ms * p - 1e-9)
  elseif delay > 0 then
    w = math.ceil(c.window_ms / delay)
  else
    return c.window_max
  end
  return math.max(c.window_min, math.min(c.window_max, w))
end
