-- ROBOTS_FETCH_LOCK: take a site's robots.txt fetch lock (crawlproject.robots), or
-- take over a stale one. A node's lock always expires within the lock TTL; a lock
-- with no expiry (a plain SET by someone else) or a longer one than that would
-- hold the site's pages back for ever, so it is stale, whatever type its key has.
-- KEYS[1] the lock ({spider}:robots:<origin>:fetch)
-- ARGV[1] the taker (node id)  ARGV[2] the lock's TTL (ms, > 0)
-- Returns 1 when the lock was free and is taken, 2 when a stale lock was taken
-- over, 0 when another node holds it.
local ttl = redis.call('PTTL', KEYS[1])
if ttl >= 0 and ttl <= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ttl == -2 then return 1 end
return 2
