"""SYNC in parts (crawlproject/frontier/lua/sync/): one atomic script composed
from one part per job, and its profiling build (bench.costs --parts)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from importlib.resources import files

from crawlproject.frontier import scripts
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.queue import Batch, Frontier

LUA = files("crawlproject.frontier").joinpath("lua")


def _fp(text):
    return hashlib.sha1(text.encode()).digest()


def test_every_lua_file_is_short_and_each_sync_part_says_what_it_touches():
    files_ = [p for p in (*LUA.iterdir(), *LUA.joinpath("lib").iterdir(),
                          *LUA.joinpath("sync").iterdir()) if p.name.endswith(".lua")]
    assert len(files_) > 20
    for p in files_:
        assert len(p.read_text().splitlines()) <= 250, p.name
    for part in scripts.SYNC_PARTS:
        text = LUA.joinpath("sync", f"{part}.lua").read_text()
        header = "\n".join(re.match(r"((?:--.*\n)+)", text).group(1).splitlines()[:12])
        assert header.startswith(f"-- sync/{part}.lua: "), part
        assert part == "contract" or re.search(r"KEYS\[|ARGV", header), part
    main = LUA.joinpath("sync", "main.lua").read_text()
    assert main.index("KEYS[17]") < main.index("ARGV[1]") < main.index("Returns") < \
        main.index("local c = sync_args()")    # the contract first, then the steps
    # one script: the parts, then the body (the first step is defined before it's called)
    assert scripts.SYNC.index("local function sync_args()") < scripts.SYNC.index(
        "local c = sync_args()")


def _calls(f: Frontier, clock) -> list[dict]:
    """A run through every section: adds (one a duplicate, one delayed), a
    take, ack, fail, nack, a block, a maintenance call that reclaims a node
    gone and promotes the delayed entry, a check-mode call."""
    out = []
    b = Batch(take=3)
    for i in range(6):
        b.add(f"p{i}", _fp(f"p{i}"), i % 3)
    b.add("p0", _fp("p0"), 0)
    b.add("later", _fp("later"), 0, 5_000)
    out.append(f.sync(b))
    taken = [m for m, _ in out[-1].taken]
    b = Batch(acks=[taken[0]], take=1)
    b.fail(taken[1], "dead", '{"reason": "x"}')
    b.nacks.append(taken[2])
    b.feedback.append(("default", "block", 1_000))
    out.append(f.sync(b))
    clock.ms += 11_000           # the lease of what the last call took expires
    other = Frontier(f.client, f.keys.spider, "other", clock=clock, bloom=f.bloom)
    other._sync = f._sync
    out.append(other.sync(Batch(take=2)))
    out.append(f.sync(Batch(take=5, check=True)))
    return [dataclasses.asdict(r) for r in out]


def test_the_profiling_build_answers_as_sync_does_and_times_every_step(redis):
    class Clock:
        ms = 1_000_000

        def __call__(self):
            return self.ms

    plain = Frontier(redis, "plain", "a", clock=Clock(), bloom=BloomConfig(capacity=10_000))
    profiled = Frontier(redis, "prof", "a", clock=Clock(), bloom=BloomConfig(capacity=10_000))
    profiled._sync = redis.register_script(scripts.sync_profiled())
    want, got = _calls(plain, plain.clock), _calls(profiled, profiled.clock)
    assert want == got and want[0]["added"] == 7 and want[0]["duplicates"] == 1
    assert want[2]["reclaimed"] == 1 and len(want[3]["taken"]) >= 1
    stats = {k.decode(): int(v) for k, v in redis.hgetall(profiled.keys.stats).items()}
    assert stats["prof:calls"] == 4
    for _, name in scripts.sync_steps():
        assert f"prof:{name}" in stats, name
    assert "prof:bloom_check_add" in stats and "prof:lease_out" in stats
    assert not [k for k in redis.hkeys(plain.keys.stats) if k.startswith(b"prof:")]
