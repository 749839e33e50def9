-- A script is not rolled back on error: one that removes something and then writes
-- it elsewhere checks the keys it will write first, or junk there loses what it
-- removed. bad_key(key, want) names what is wrong ('counter': a string holding an
-- integer, as INCR needs), or returns nil. scripts.COUNTER_PATTERN is its rule, for Python.
local function bad_key(key, want)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then return nil end
  if want == 'counter' then
    if t ~= 'string' then return key .. ' is a ' .. t .. ', not a counter' end
    local v = redis.call('GET', key)
    local digits = string.match(v, '^%-?(%d+)$')
    if not digits or #digits > 18 then
      return key .. ' holds ' .. string.format('%q', string.sub(v, 1, 40)) .. ', not a counter'
    end
  elseif t ~= want then
    return key .. ' is a ' .. t .. ', not a ' .. want
  end
  return nil
end
