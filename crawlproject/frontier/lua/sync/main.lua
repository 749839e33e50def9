-- SYNC: one round trip of a node with one partition of the frontier.
-- Composed by crawlproject/frontier/scripts.py: lib/clock, lib/bloom,
-- lib/key_check, then the parts in lua/sync/ (each defines local functions on
-- the call context C, its KEYS/ARGV at its top; contract.lua has the rules),
-- then this body, which calls them in order: still one atomic call.
--
-- KEYS[1] ready (zset politeness key -> ms it may start its next request)
-- KEYS[2] payloads (hash)   KEYS[3] inflight (hash member->node)
-- KEYS[4] nodes (zset node->lease deadline ms)        KEYS[5] delayed (zset member->due ms)
-- KEYS[6] dead (list)       KEYS[7] invalid (list)    KEYS[8] seq (string)
-- KEYS[9] bloom meta (hash); its shards are KEYS[9]:<layer>:<shard> (derived)
-- KEYS[10] partition stats (hash): counters of the scripts (trims, recounts,
--          keys_pruned, budget_refused, budget_skipped, sent_refused,
--          state_junk); junk in a counter, or a key of another type, stops no
--          call (the counter starts again)
-- KEYS[11] kstate (hash key -> "n|last|block|backoff|crawl delay|error rate
--          [|starts|history]" (the error rate in millionths; a state of an
--          older version has no such field: 0; the pace, pace.lua, only once
--          the key started with the MongoDB tier on), field '|key'
--          -> the key's override, mirrored from KEYS[12] by SET_LIMITS, field
--          '||limits' -> how many overrides there are (SET_LIMITS), field
--          '||cursor' -> where the next window of it starts (HSCAN), field
--          '||qlen' -> entries queued in this partition, and field '||bounds'
--          -> "longest block ms|longest backoff or crawl delay ms" of the crawl,
--          recorded by the first call that needed them, see feedback.lua)
--          Every field is read strictly (contract.lua, "What is read back").
-- KEYS[12] limits (hash key -> "delay ms|concurrency|source"; SYNC reads each
--          override from its mirror in KEYS[11], this only to count them where
--          KEYS[11] has no '||limits' field yet)
-- KEYS[13] queue prefix: the queue of key K is KEYS[13]:K (derived)
-- KEYS[14] held prefix: the members leased to node N are in the set KEYS[14]:N (derived)
-- KEYS[15] unused (older versions kept the queue length there; the slot stays
--          so that the keys after it keep their place)
-- KEYS[16] wanting (zset node -> ms): when each node's take last went unmet
--          while entries were queued (contract.lua, "Sharing a key's slots")
-- KEYS[17] budget (hash key -> "admitted|refused": new pages of the key this
--          partition queued, and refused over its budget; '||crawl' -> the
--          same for the whole partition). Written only while budgets apply;
--          a key of another type skips this call's budget accounting (the
--          reply says so) instead of stopping the call.
-- KEYS[18] moves (zset key -> ms since it wants a spill or a refill) and
-- KEYS[19] backlog (zset key -> its entries in MongoDB): the MongoDB tier's
--          (backlog.lua; read and written only while the tier is on)
-- ARGV[1] now in ms, or '' for Redis server time      ARGV[2] node id
-- ARGV[3] lease ttl ms (0 = this node leaves: drop its heartbeat; at most an
--         hour is honoured)
-- ARGV[4] how many entries to take
-- ARGV[5] flags: 'm' = maintenance (renew this node's lease, reclaim the leases
--         of expired nodes, report delayed/inflight sizes, drop the state of
--         keys idle for days in a window of kstate), 'd' = promote due
--         delayed entries, 's' = sweep: also reclaim entries whose owner is not
--         a registered node and recount the in-flight of the keys with leases
--         and of a window of kstate (implies 'm'),
--         'r' = this node renewed its lease well within the TTL (a take need
--         not register it again), 'c' = check first: every key the call may
--         write must hold the right type (the node's call before this one
--         stopped inside the script), or the call is refused with the error
--         reply 'BADKEY <key> is a <type>, not a <type>: nothing changed'.
-- ARGV[6..10] bloom capacity, error rate, growth, tightening, shard bits
-- ARGV[11] most records kept in the dead list  ARGV[12] ... in the invalid list
-- ARGV[13] default interval ms between request starts of a key (at most a day)
-- ARGV[14] default most requests of a key in flight   ARGV[15] jitter (0..1)
-- ARGV[16] most backoff interval ms   ARGV[17] most Retry-After block ms: this
--          node's FRONTIER_BACKOFF_MAX and FRONTIER_RETRY_AFTER_MAX, which can
--          only lower the crawl's recorded ones (KEYS[11] '||bounds'); at most
--          a day either way
-- ARGV[18] random seed (the interval jitter)
-- ARGV[19] most entries to take from keys with an interval (what the node can
--          start at once: an entry of a polite key must not wait in a buffer)
-- ARGV[20] safety margin on intervals (0.02: 2 % longer, so that the time a
--          node takes from lease to sending never shortens what the site sees;
--          at most 0.5)
-- After the nine sections below (where a script of before them ignores them),
-- six settings then the MongoDB tier's four:
--   least safety margin ms on an interval (ARGV[20]'s share, but at least this:
--     the node's own scheduling latency does not shrink with the interval; at
--     most a minute)
--   backoff tolerance: the share of a key's recent answers (millionths) that
--     may be slow-down answers before the key is slowed down
--   weight of one answer in that share (millionths: 1 / the answers it is
--     averaged over)
--   first backoff interval ms (or twice the key's interval, if longer)
--   default budget: most new pages a key may queue (0 = none; an override's
--     budget field wins)
--   crawl budget: most new pages this partition may queue (0 = none)
--   spill above: the tier flags keys only while this partition queues more
--     than this (0 or absent = the tier is off: nothing more is read or written)
--   window ms, window min, window max: a key's window W = clamp(ceil(window ms
--     x its pace), min, max), the pace observed (at most 1 / its interval), or
--     before it is, 1 / its interval; max for a key without (pace.lua)
-- then nine sections, each a count followed by its items:
--   adopt: n x (member, former owner)    (leases this node took under a former
--                                          id of its own: now held under this id)
--   add:  n x (politeness key, fingerprint hex, '' (the same page again: a retry)
--         or '+' (a new page, not deduplicated), priority, payload, delay ms or 0)
--         (a fingerprint prefixed '!' is added to the filter and the entry queued
--         even if the filter had it: the node sends its adds so again after a
--         call that stopped inside the script, which may have marked them seen
--         without queueing them, since a script is not rolled back)
--   ack:  n x (member, '1' = a success that relaxes the key's backoff | '0')
--   fail: n x (member, 'dead'|'invalid', record)   (forget it, keep record)
--   nack: n x member                     (not started: back to its queue)
--   feedback: n x (key, 'block'|'backoff'|'crawldelay', ms) or (member, 'sent', ms)
--         ('sent': that leased entry left the node ms ago, later than its lease
--         allowed; taken only if the member is leased to this node, else
--         refused and counted)
--   fetched: n x member                  (its download ended: its key's slot is
--                                          free; the entry stays leased until acked)
--   handoff: n x (ended member, started member)  (the node gave the slot of a
--            download that ended to an entry it held in reserve for that key)
--   reserve: n x (key, count)            (entries of K this node wants in reserve:
--            leased, holding no slot, started only on a slot the node frees; a
--            count of 0 asks only whether its reserve may still be used)
-- Returns {taken = {member, payload, ...}, added, duplicates, queue length,
--          delayed length or -1, inflight length or -1, reclaimed, now or -1,
--          stale calls, queue members without payload or malformed set aside,
--          records trimmed,
--          earliest ready time (ms), -1 when no key is ready or due, -2 when the
--          take got all it asked for (more may be ready), keys the take filled
--          up to their concurrency or passed over because they had it in flight,
--          reserved = {member, payload, ...}, status = {key, 1|0, share, ...},
--          capped keys = {key, ...} (at most 64), polite keys = {key, interval
--          ms, ...}: the keys with an interval this call took from (their
--          entries must start at once: within margin x interval of the lease),
--          new pages refused over a budget, fields read back as junk (state_junk),
--          1 when the budget key was not a hash (budget accounting skipped) else
--          0, 'sent' reports refused, {longest block ms, longest backoff ms} as
--          recorded when this call read them, else {}, entries of this partition
--          in MongoDB (kstate '||backlog', 0 with the tier off), moves waiting
--          in KEYS[18] (0 when this call did not look: backlog.lua)}
local c = sync_args()          -- args.lua: nothing read or written yet
local refused = sync_check(c)  -- check.lua: nothing is written before this
if refused then return refused end
sync_keystate(c)               -- keystate.lua
sync_load_touched(c)           -- the states of the keys acks, fails, ... change
sync_adopt(c)                  -- leases.lua
sync_sent(c)                   -- leases.lua: before the acks settle the members
sync_enqueue(c)                -- enqueue.lua (with budgets.lua)
sync_fetched(c)                -- settle.lua
sync_handoff(c)
sync_settle(c)                 -- acks, fails, nacks
sync_feedback(c)               -- feedback.lua
sync_maintenance(c)            -- maintenance.lua (with reclaim.lua)
sync_tidy(c)                   -- tidy.lua
sync_promote(c)                -- promote.lua
sync_ready(c)                  -- ready.lua: before the take
sync_take(c)                   -- take.lua
sync_reserve(c)                -- reserve.lua
sync_writeback(c)              -- writeback.lua
sync_backlog(c)                -- backlog.lua: keys flagged for a spill or a refill
return sync_reply(c)
