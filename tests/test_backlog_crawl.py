"""The MongoDB tier wired into the crawl (issue 49): SYNC flags keys for the
node's mover, the mover spills and refills, a crawl whose backlog spills
stores every page once; with the tier off or below its threshold SYNC costs
what it did before. Real redis-server, MongoDB-wire server and demo site."""

from __future__ import annotations

import pytest

from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.frontier.window import WindowRule
from devtools.demo.site import DemoSite, expected_items
from tests.crawl_helpers import (Node, assert_fetched_once, assert_matches_catalog,
                                 assert_written_once, node_env, stored_products)

PRODUCTS = 60


def _calls(redis) -> dict[str, int]:
    """Commands Redis ran (scripts' own commands included), by name."""
    stats = redis.info("commandstats")
    return {name[len("cmdstat_"):] if name.startswith("cmdstat_") else name: v["calls"]
            for name, v in stats.items()}


def _workload(redis, spider: str, rule: WindowRule) -> dict[str, int]:
    """A node's calls (adds over three sites, takes, acks, a maintenance call)
    against a fresh partition, and the commands they cost."""
    frontier = Frontier(redis, spider, "n1", lease_ttl=30)
    frontier.window = rule
    frontier.sync()          # the scripts loaded, the node registered
    redis.config_resetstat()
    for round_ in range(3):
        batch = Batch()
        for i in range(30):
            batch.add(f"p{round_}-{i}", f"{round_:04x}{i:028x}", 0, 0,
                      key=f"site{i % 3}.example")
        batch.take = 4
        taken = frontier.sync(batch).taken
        acks = Batch()
        acks.acks = [member for member, _ in taken]
        acks.take = 2
        acks.maintenance = round_ == 2
        frontier.sync(acks)
    calls = _calls(redis)
    for name in ("config|resetstat", "config", "info"):
        calls.pop(name, None)
    return calls


def test_sync_below_spill_above_costs_what_it_costs_with_the_tier_off(redis):
    off = _workload(redis, "off", WindowRule(enabled=False))
    below = _workload(redis, "below", WindowRule(enabled=True, spill_above=1_000_000))
    assert below == off
    assert not redis.exists("{below}:moves") and not redis.exists("{off}:moves")
    # over it, the keys over 1.25 W are flagged (and the check costs commands)
    above = _workload(redis, "above", WindowRule(enabled=True, spill_above=5, seconds=1,
                                                 minimum=2, maximum=2))
    assert above != off and above.get("zcard", 0) > off.get("zcard", 0)
    assert {k.decode() for k in redis.zrange("{above}:moves", 0, -1)} == {
        "site0.example", "site1.example", "site2.example"}
