-- RENEW_CLAIMS: a live node still holds these seed claims: push their deadline.
-- KEYS[1] claim deadlines (zset id -> ms)
-- ARGV[1] claim ttl ms  ARGV[2] now in ms, or '' for Redis server time  ARGV[3..] claim ids
-- Returns how many claims were renewed (claims already put back are not revived).
local deadline = string.format('%.0f', server_now(ARGV[2]) + tonumber(ARGV[1]))
local renewed = 0
for i = 3, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
end
return renewed
