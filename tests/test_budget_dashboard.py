"""The end of a crawl, as an operator sees it (issue 48, items 3 and 4): one real
node crawls two hosts of the multi-host demo site with a budget per host until
it idle-closes; then its log, ``crawlctl status`` and the dashboard (a real
``crawlctl dashboard`` read by the system Chromium) must say what happened:
which budgets are spent, that the crawl is finished, how much is stored."""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pymongo
import pytest
import redis as redis_lib

from tests.crawl_helpers import ROOT, Node, crawl_until_done, node_env

HOSTS = ("127.0.0.2", "127.0.0.3")
BUDGET = 6          # new pages per host (the seed counts as one)
PAGES = 40          # per host: far more than the budget


def artifacts_dir() -> Path:
    """Where screenshots go: $ARTIFACTS_DIR if set, else tests/artifacts (as
    tests/test_dashboard.py; ignored by git)."""
    path = Path(os.environ.get("ARTIFACTS_DIR") or ROOT / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def spent_crawl(redis_url, mongo_uri, tmp_path_factory):
    """One crawl, done: its node's log, the Redis state it left, its MongoDB."""
    from devtools.demo.hosts import MultiHostSite

    tmp = tmp_path_factory.mktemp("spent")
    database = f"test_{uuid.uuid4().hex[:12]}"
    client = redis_lib.Redis.from_url(redis_url)
    client.flushall()
    env = node_env(redis_url, mongo_uri, database)
    settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                "FRONTIER_SITE_BUDGET": BUDGET, "MAX_IDLE_TIME_BEFORE_CLOSE": 1,
                "CONCURRENT_REQUESTS": 8, "LOG_LEVEL": "INFO"}
    try:
        with MultiHostSite(HOSTS, pages=PAGES) as site:
            node = Node("b1", tmp, env, spider="hosts", settings=settings)
            codes = crawl_until_done([node], lambda: client.lpush(
                "hosts:start_urls", *site.root_urls()), timeout=120)
            fetched = {h: len(site.requests(h)) for h in HOSTS}
        stored = pymongo.MongoClient(mongo_uri)[database]["hosts"].count_documents({})
        yield {"node": node, "codes": codes, "fetched": fetched, "stored": stored,
               "env": env, "redis_url": redis_url, "client": client}
    finally:
        client.flushall()
        client.close()
        pymongo.MongoClient(mongo_uri).drop_database(database)


def crawlctl(crawl, capsys, monkeypatch, *args: str) -> str:
    """``crawlctl ARGS`` in this process (its main(); a subprocess costs a second)."""
    from crawlproject.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(["--redis-url", crawl["redis_url"], *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_spent_budget_is_said_once_per_host_shown_in_status_and_the_idle_node_closes(
        spent_crawl, capsys, monkeypatch):
    node, log = spent_crawl["node"], spent_crawl["node"].text()
    # The node closed by itself (MAX_IDLE_TIME_BEFORE_CLOSE) with only refused pages left.
    assert spent_crawl["codes"] == [0], node.tail()
    assert "'finish_reason': 'finished'" in log, node.tail()
    assert spent_crawl["fetched"] == {h: BUDGET for h in HOSTS}, spent_crawl["fetched"]
    refused = node.stat("scheduler/budget_refused")
    assert refused > 0
    for host in HOSTS:   # one INFO line per key, whatever the number of refusals
        lines = [line for line in log.splitlines() if f"Budget reached for {host}" in line]
        assert len(lines) == 1, lines
        assert "INFO" in lines[0] and f"{BUDGET} new pages admitted" in lines[0], lines[0]
        assert f"(FRONTIER_SITE_BUDGET {BUDGET})" in lines[0], lines[0]
        assert "closes after 1s with nothing else to do" in lines[0], lines[0]
    assert node.stat("scheduler/budget_reached") == len(HOSTS)
    # crawlctl status --json: per key admitted / refused / budget, and the crawl's counts.
    data = json.loads(crawlctl(spent_crawl, capsys, monkeypatch, "status", "hosts", "--json"))
    budgets = data["budgets"]
    assert budgets["spent"] == len(HOSTS) and budgets["admitted"] == len(HOSTS) * BUDGET
    assert budgets["refused"] == refused
    assert {row["key"] for row in budgets["keys"]} == set(HOSTS)
    for row in budgets["keys"]:
        assert (row["admitted"], row["budget"], row["source"]) == (BUDGET, BUDGET, "settings")
        assert row["refused"] > 0
    assert sum(row["refused"] for row in budgets["keys"]) == refused
    text = crawlctl(spent_crawl, capsys, monkeypatch, "status", "hosts")
    for host in HOSTS:
        assert f"budget spent: {host}" in text, text
    assert f"{len(HOSTS) * BUDGET} / {refused}" in text, text
    assert "finished: no node is running and nothing is left to do" in text, text


def test_after_the_crawl_the_dashboard_says_finished_with_totals_in_chromium(spent_crawl):
    """After the last node closed: no "run (running)" with no node, no "no node
    reported in 10 minutes", totals that stay, Bloom figures that mean
    something, chart labels one can read; seen in Chromium, screenshot kept."""
    from playwright.sync_api import expect, sync_playwright

    from crawlproject.rendering.addon import CHROMIUM_ARGS, chromium_path
    from tests.test_dashboard import Dashboard

    node = spent_crawl["node"]
    acked = node.stat("scheduler/acked")
    assert acked == len(HOSTS) * BUDGET and spent_crawl["stored"] > 0
    with Dashboard(spent_crawl["redis_url"], "hosts", env=spent_crawl["env"]) as dash, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(),
                                             args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems = []
        page.on("console", lambda m: m.type == "error" and problems.append(m.text))
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.goto(f"{dash.url}/spider/hosts")
        expect(page.locator("#live")).to_have_text("live", timeout=20_000)
        state = page.locator(".crawl-state")
        expect(state).to_contain_text("State: finished")
        expect(state).to_contain_text(f"{acked} pages crawled")
        expect(page.locator('[data-field="control.state"]')).to_have_text("run")

        def field(name: str) -> str:
            return page.locator(f'[data-field="{name}"]').inner_text()

        assert field("crawl.pages_crawled") == str(acked)
        # (counted in a thread of its own: the page shows it from the next update)
        expect(page.locator('[data-field="stored.items"]')).to_have_text(
            str(spent_crawl["stored"]), timeout=15_000)
        assert "MongoDB collection test_" in page.locator("#frag-rates").inner_text()
        assert "No node is running" in page.locator("#frag-nodes").inner_text()
        assert field("frontier.nodes") == field("frontier.nodes_holding_leases") == "0"
        assert field("budgets.spent") == str(len(HOSTS))
        budgets = page.locator("#frag-budgets tbody tr")
        expect(budgets).to_have_count(len(HOSTS))
        assert {row.locator("th").inner_text() for row in budgets.all()} == set(HOSTS)
        # A filter sized for its capacity holds a few URLs: no bytes per URL seen.
        bloom = page.locator("#frag-bloom").inner_text()
        assert "bytes per URL seen" not in bloom, bloom
        assert 0 < float(field("bloom.bytes_per_capacity")) < 10, bloom
        # Charts: names in the legend, whole-second HH:MM:SS labels, room between them.
        for chart in ("#chart-frontier", "#chart-rates"):
            legend = page.locator(f"{chart} .u-legend").inner_text()
            assert "--" not in legend, legend
            # (drawn once two samples span a second: the page polls every 0.5 s)
            expect(page.locator(chart)).to_have_attribute(
                "data-ticks", re.compile(r"^\d\d:\d\d:\d\d( \d\d:\d\d:\d\d)*$"),
                timeout=15_000)
            ticks = page.locator(chart).get_attribute("data-ticks")
            labels = ticks.split(" ")
            assert all(len(t) == 8 and t[2] == t[5] == ":" for t in labels), ticks
            width = page.locator(chart).bounding_box()["width"]
            assert 1 <= len(labels) <= width // 90 + 1, (ticks, width)
        assert "queued" in page.locator("#chart-frontier .u-legend").inner_text()
        assert "pages/s" in page.locator("#chart-rates .u-legend").inner_text()
        shot = artifacts_dir() / "dashboard-finished-crawl.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"dashboard screenshot: {shot}")
        assert not problems, problems
        browser.close()
    assert shot.stat().st_size > 10_000


def test_the_crawl_state_is_told_from_the_reports_and_the_frontier(redis):
    """Each state an operator may find, made in a real Redis as nodes make it
    (SYNC calls, node reports), read as `status --json` and the dashboard read it."""
    import time

    from crawlproject.control import node_reports_key
    from crawlproject.frontier.queue import Batch, Frontier
    from crawlproject.keys import FrontierKeys, SeedKeys
    from crawlproject.ops.common import frontier_partitions
    from crawlproject.ops.status import status_data

    def read() -> dict:
        return status_data("shop", frontier_partitions(redis, "shop"), SeedKeys("shop:start_urls"))

    def state() -> tuple[str, str]:
        data = read()
        return data["crawl"]["state"], data["crawl"]["why"]

    def report(age_s: float, **fields) -> None:
        redis.hset(node_reports_key("shop"), "n1", json.dumps(
            {"at": int((time.time() - age_s) * 1000), "state": "run", **fields}))

    assert state()[0] == "idle" and "no crawl has started" in state()[1]
    frontier = Frontier(redis, "shop", "n1")
    batch = Batch()
    for i in range(3):
        batch.add(json.dumps({"url": f"http://127.0.0.1/{i}"}), f"fp{i}".encode() * 5, 0)
    frontier.sync(batch)                           # 3 queued, no node: stopped
    assert state() == ("stopped", "no node is running; 3 requests and seeds wait (start "
                                  "nodes to go on)")
    report(2, pages_per_s=0)                       # a node that crawls nothing, 3 queued
    assert state()[0] == "stuck" and "3 requests queued, none in flight" in state()[1]
    taken = frontier.sync(Batch(take=3)).taken     # leased: in flight
    assert state()[0] == "running"
    # "nodes holding leases" and the node row's leases: one source (the frontier's lease sets)
    data = read()
    assert data["frontier"]["nodes_holding_leases"] == 1 == data["frontier"]["nodes"]
    assert data["nodes"][0]["leases_held"] == 3
    report(45)                                     # its reports stopped coming
    assert state()[0] == "stuck" and "stopped reporting (45 s ago)" in state()[1]
    report(1)
    done = Batch()
    done.acks.extend(member for member, _ in taken)
    frontier.sync(done)                            # all done, the node waits
    assert state()[0] == "idle" and "1 node(s) wait for work" in state()[1]
    data = read()   # registered (its lease renewed), holding nothing
    assert (data["frontier"]["nodes"], data["frontier"]["nodes_holding_leases"]) == (1, 0)
    assert data["nodes"][0]["leases_held"] == 0
    redis.hdel(node_reports_key("shop"), "n1")     # it closed (its report removed)
    frontier.sync(Batch(), leaving=True)
    redis.hset(FrontierKeys("shop").cluster_stats, "scheduler/acked", 3)   # as nodes add it
    assert state() == ("finished", "no node is running and nothing is left to do: "
                                   "3 pages crawled")



def test_an_operator_s_budget_is_named_once_per_key_and_node(redis, redis_url, caplog):
    """`crawlctl politeness SPIDER HOST --budget N` (an override, no budget in
    the settings): the line names the override, once, however many refusals
    follow; a host under its budget is not named."""
    import asyncio
    import hashlib
    import logging

    import redis.asyncio as aioredis

    from crawlproject.frontier.queue import AsyncFrontier, Batch, Frontier
    from crawlproject.frontier.sitelimits import Limits, Override, PolitenessConfig
    from crawlproject.frontier.budgets import BudgetWatch

    counted = {}
    caplog.set_level(logging.INFO, "crawlproject.frontier.budgets")

    async def run():
        client = aioredis.Redis.from_url(redis_url)
        frontier = AsyncFrontier(client, "shop", "n1",
                                 politeness=PolitenessConfig(default=Limits(0, 5), margin=0.0))
        watch = BudgetWatch(lambda name, n: counted.update({name: counted.get(name, 0) + n}),
                            {}, idle_close=0)
        for start in (0, 10, 20):
            batch = Batch()
            for key in ("h1", "h2"):
                for i in range(start, start + (5 if key == "h1" else 1)):
                    url = f"http://{key}/{i}"
                    batch.add(json.dumps({"url": url}), hashlib.sha1(url.encode()).digest(),
                              0, 0, key)
            result = await frontier.sync(batch)
            if result.budget_refused:
                watch.refused(frontier, batch)
                await asyncio.gather(*watch._tasks)
        await client.aclose()

    Frontier(redis, "shop", "cli").set_limits({"h1": Override(budget=3)})
    asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if "Budget reached" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("Budget reached for h1: 3 new pages admitted, 2 refused so far "
                               "(its own budget: crawlctl politeness --budget"), lines[0]
    assert "MAX_IDLE_TIME_BEFORE_CLOSE = 0: never closes idle" in lines[0]
    assert counted == {"scheduler/budget_reached": 1}


def test_a_budget_hash_too_large_to_scan_gives_its_totals_only(redis, monkeypatch):
    """Every site has a count once budgets apply (by default): a broad crawl's
    hash is not scanned on each dashboard read, its totals are."""
    from crawlproject.frontier.queue import Frontier
    from crawlproject.ops import budgets

    frontier = Frontier(redis, "shop", "cli")
    redis.hset(frontier.keys.budget, mapping={"a": "5|2", "b": "5|1", "c": "1|0",
                                              "||crawl": "11|3"})
    whole = budgets.budget_summary([frontier])
    assert (whole["spent"], [k["key"] for k in whole["keys"]]) == (2, ["a", "b"])
    monkeypatch.setattr(budgets, "SCAN_MAX", 3)
    summary = budgets.budget_summary([frontier])
    assert summary == {"admitted": 11, "refused": 3, "spent": 0, "keys": [], "too_many": 1}
    assert "not listed: the nodes' logs name each once" in dict(budgets.budget_rows(summary))[
        "budgets: keys spent"]
