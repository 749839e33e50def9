-- FEED_SITEMAP_SEEDS: move seeds read from sitemaps into the seed key, oldest first,
-- only while the seed key holds fewer than a cap (crawlproject.sitemaps).
-- KEYS[1] the sitemap seeds waiting (list, LPUSHed)  KEYS[2] the seed key
-- (list | set | zset); both tagged on the seed key's slot.
-- ARGV[1] 'list' | 'set' | 'zset'  ARGV[2] most to move (1..1000)
-- ARGV[3] cap: the seed key holds at most this many after the move
-- Returns {moved, left waiting}. Every read comes before the first write, so a
-- key of the wrong type makes an error reply before anything moved.
local kind, count, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local size
if kind == 'list' then size = redis.call('LLEN', KEYS[2])
elseif kind == 'set' then size = redis.call('SCARD', KEYS[2])
else size = redis.call('ZCARD', KEYS[2]) end
local waiting = redis.call('LLEN', KEYS[1])
count = math.min(count, cap - size, waiting)
if count <= 0 then return {0, waiting} end
local got = redis.call('RPOP', KEYS[1], count)
if kind == 'list' then
  redis.call('LPUSH', KEYS[2], unpack(got))
elseif kind == 'set' then
  redis.call('SADD', KEYS[2], unpack(got))
else
  for _, seed in ipairs(got) do redis.call('ZADD', KEYS[2], 'NX', 0, seed) end
end
return {#got, waiting - #got}
