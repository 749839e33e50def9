-- BLOOM_ADD: check-and-add fingerprints (the standalone dupefilter).
-- KEYS[1] bloom meta (hash); its shards are KEYS[1]:<layer>:<shard> (derived)
-- ARGV[1..5] capacity, error rate, growth, tightening, shard bits
-- ARGV[6] 'add' (check-and-add) or 'check' (read only); ARGV[7..] 40-hex fingerprints
-- Returns one integer per fingerprint: 1 = new (added unless 'check'), 0 = seen before.
local m = bloom_open(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                     tonumber(ARGV[4]), tonumber(ARGV[5]))
local fps = {}
for i = 7, #ARGV do fps[i - 6] = ARGV[i] end
local new = bloom_check_add(KEYS[1], m, fps, ARGV[6] == 'check')
local out = {}
for i = 1, #ARGV - 6 do out[i] = new[i] and 1 or 0 end
return out
