-- Shared Lua helpers: numbers formatted for Redis, queue scores, and commands
-- sent in chunks (unpack limits). Entry members are "<priority>:<seq>"; the
-- queue score is -priority * 2^40 + seq (crawlproject/frontier/scripts.py).
local SHIFT = 1099511627776

local function fmt(x) return string.format('%.0f', x) end

local function score_of(priority, seq) return fmt(-priority * SHIFT + seq) end

local function score(member)
  -- "<priority>:<seq>" or "<priority>:<seq>@<politeness key>"
  local p, s = string.match(member, '^(-?%d+):(%d+)')
  return score_of(tonumber(p), tonumber(s))
end

local function call_chunked(cmd, key, args, width, counts)
  -- Run CMD key args... in chunks of whole WIDTH-sized groups (unpack limits).
  -- Returns the concatenated array replies (or, with COUNTS, the integer ones).
  local out = {}
  local step = width * 600
  for i = 1, #args, step do
    local last = math.min(i + step - 1, #args)
    local res = redis.call(cmd, key, unpack(args, i, last))
    if type(res) == 'table' then
      for _, v in ipairs(res) do out[#out + 1] = v end
    elseif counts then
      out[#out + 1] = res
    end
  end
  return out
end
