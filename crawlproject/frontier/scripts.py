"""Lua scripts of the frontier, each with its KEYS/ARGV/return contract (nodes call them
as Redis functions: :mod:`crawlproject.frontier.library`).

The Lua lives in ``crawlproject/frontier/lua/``: one file per script (its
header says its KEYS, ARGV and return value) and ``lua/lib/`` for the
functions several scripts share (server time, key-type checks, scoring and
the Bloom filter). This module reads them with :mod:`importlib.resources`
and composes each script from its library parts and its body, once at import.
SYNC, the node's one round trip, is composed of one part per job in
``lua/sync/`` (BullMQ's ``includes/``): each defines local functions of the
call context, with the KEYS/ARGV it reads and writes at its top, and
``lua/sync/main.lua`` (its KEYS/ARGV/return contract first) calls them in
order: still one atomic call.

Every state change of the shared frontier is one atomic script call. Numbers
that may exceed 14 significant digits are formatted with ``%.0f`` before they
are handed to Redis (Lua's default number formatting would round them).

Entry members are ``"<priority>:<seq>"``; the queue score is
``-priority * 2^40 + seq`` so ``ZPOPMIN`` yields the highest priority first and
FIFO among equal priorities. The member carries its priority so that any
script can put an entry back in its place without another lookup.

Keys: every key a script touches is in its KEYS, or derived from a key in its
KEYS by one documented rule, under the same hash tag (so the script stays in
one Redis Cluster slot): the shards of a Bloom filter are
``<meta key>:<layer>:<shard>`` (:func:`crawlproject.keys.bloom_shard_key`),
derived from the filter's meta key in KEYS, never from an ARGV prefix.

Bloom growth never blocks Redis for long: while the newest layer nears
capacity, each adding call makes at most one shard (<= 8 MiB at the default
``DUPEFILTER_SHARD_BITS = 2**26``) of the next layer, so the call that opens a
big layer finds it ready. A call can still allocate more than one shard at
once: the first call (layer 0 is made whole: over 32 MiB when ``capacity``
exceeds ~18M at 1e-3), a call that opens a layer of at most 32 MiB (one step,
``BLOOM_STEP_BYTES`` in ``lua/lib/bloom.lua``, made whole anyway), a batch
that fills the newest layer faster than one shard per call, and any shard of
a ``DUPEFILTER_SHARD_BITS`` raised above ``2**28`` (32 MiB; one shard is one
allocation). Each MiB allocated costs about 1 ms of blocking (measured on this
project's 2-core VMs with Redis 6.2 and 7.0: the pages are touched once,
zero-filled); a smaller ``DUPEFILTER_SHARD_BITS`` makes smaller steps.
"""

import re
from importlib.resources import files

_LUA = files(__package__).joinpath("lua")


def _lua(name: str) -> str:
    return _LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")


def _script(*parts: str) -> str:
    """One script: library parts first (they define functions), then the body."""
    return "\n".join(_lua(part) for part in parts)


# bad_key()'s rule for a counter, for Python (see lua/lib/key_check.lua).
COUNTER_PATTERN = r"-?[0-9]{1,18}"

#: SYNC's parts in the order they are defined (each uses only the ones before it)
SYNC_PARTS = ("contract", "context", "args", "check", "pace", "keystate", "leases", "budgets",
              "enqueue", "settle", "feedback", "reclaim", "maintenance", "tidy", "promote",
              "ready", "take", "reserve", "writeback", "backlog")
_SYNC_LIBS = ("lib/clock", "lib/score", "lib/bloom", "lib/key_check")
SYNC = _script(*_SYNC_LIBS, *(f"sync/{part}" for part in SYNC_PARTS), "sync/main")


def sync_steps() -> list[tuple[str, str]]:
    """``(part, function)`` of each step ``lua/sync/main.lua`` calls: the
    functions of one argument, the call context, that a part defines
    (``local function sync_<name>(c)``; ``sync_args()`` too)."""
    steps = []
    for part in SYNC_PARTS:
        for name in re.findall(r"^local function (sync_\w+)\((?:c)?\)", _lua(f"sync/{part}"),
                               re.MULTILINE):
            steps.append((part, name))
    return steps


#: functions called inside the steps, timed too in the profiling build (their
#: time is also in the step that called them)
SYNC_INNER = ("load", "within_budget", "bloom_open", "bloom_check_add", "next_seq", "settle",
              "lease_out", "requeue", "set_aside", "keep_record")


def sync_profiled() -> str:
    """SYNC with each step timed (for ``bench.costs`` only, never loaded by a
    node): every step function (and each of :data:`SYNC_INNER`) is wrapped
    with ``TIME`` before and after; the µs of each, summed per call, are added
    to the partition's stats hash (KEYS[10]) as ``prof:<function>`` (and
    ``prof:calls``) after the reply is made. The two ``TIME`` calls of a
    wrapper (about a µs each) are in what it measures."""
    wrap = ["-- (profiling build: bench/costs.py)",
            "local PROF, PROF_ORDER = {}, {}",
            "local function prof_us() local t = redis.call('TIME')"
            " return tonumber(t[1]) * 1000000 + tonumber(t[2]) end",
            "local function prof_done(name, t0, ...)",
            "  PROF[name] = (PROF[name] or 0) + prof_us() - t0",
            "  if name == 'sync_reply' then",
            "    redis.call('HINCRBY', KEYS[10], 'prof:calls', 1)",
            "    for _, n in ipairs(PROF_ORDER) do",
            "      if PROF[n] then redis.call('HINCRBY', KEYS[10], 'prof:' .. n, PROF[n]) end",
            "    end",
            "  end",
            "  return ...",
            "end",
            "local function prof_wrap(name, fn)",
            "  PROF_ORDER[#PROF_ORDER + 1] = name",
            "  return function(...) local t0 = prof_us(); return prof_done(name, t0, fn(...)) end",
            "end"]
    names = [name for _, name in sync_steps()] + list(SYNC_INNER)
    wrap += [f"{name} = prof_wrap('{name}', {name})" for name in names]
    return "\n".join([_script(*_SYNC_LIBS, *(f"sync/{part}" for part in SYNC_PARTS)),
                      *wrap, _lua("sync/main")])


BLOOM_ADD = _script("lib/clock", "lib/score", "lib/bloom", "bloom_add")
REPLAY_DEAD = _script("lib/clock", "lib/score", "lib/bloom", "lib/key_check", "replay_dead")
SET_LIMITS = _script("lib/clock", "set_limits")
CLAIM_SEEDS = _script("lib/clock", "lib/key_check", "claim_seeds")
RENEW_CLAIMS = _script("lib/clock", "renew_claims")
#: the MongoDB tier's moves (crawlproject/frontier/mover.py): a key's lease and a
#: spill's step 1, a spill's commit, a refill's commit and its end
#: (``lua/move/``; KEYS: crawlproject.keys.FrontierKeys.move_keys)
_MOVE_LIBS = ("lib/clock", "lib/score", "lib/key_check", "move/common")
CLAIM_MOVES = _script(*_MOVE_LIBS, "move/claim_moves")
SPILL_COMMIT = _script(*_MOVE_LIBS, "move/spill_commit")
REFILL_COMMIT = _script(*_MOVE_LIBS, "move/refill_commit")
REFILL_DONE = _script(*_MOVE_LIBS, "move/refill_done")
#: the operator's control hash (crawlproject/control.py), here with the other scripts
CLEAR_DRAIN = _lua("clear_drain")
#: a site's robots.txt fetch lock (crawlproject/robots/middleware.py)
ROBOTS_FETCH_LOCK = _lua("robots_fetch_lock")
#: seeds read from sitemaps into the seed key, while it has room (crawlproject/sitemaps/)
FEED_SITEMAP_SEEDS = _lua("feed_sitemap_seeds")
