"""Incremental recrawl with real nodes, Redis, a MongoDB-wire server and the demo
site serving validators: conditional second passes, adaptive intervals, a
revisit surviving SIGKILL."""

import json
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from devtools.demo.site import JS_PRODUCT_ID, NO_VALIDATORS_EVERY, DemoSite
from tests.crawl_helpers import Node, crawl_until_done, kill_while_holding, node_env

pytestmark = pytest.mark.slow
PRODUCTS = 40
PER_PAGE = 10
# Long enough that nothing is revisited during a pass unless asked.
SETTINGS = {"RECRAWL_ENABLED": True, "RECRAWL_INTERVAL": 3600, "RECRAWL_CHECK_INTERVAL": 0.5,
            "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "RENDERING_ENABLED": False,
            "CONCURRENT_REQUESTS": 4}


def cli(redis_url, *args):
    return subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url,
                           *args], capture_output=True, text=True, timeout=60)


def recrawl(redis_url, mongo_uri, database, *args):
    return cli(redis_url, "recrawl", "products", *args, "--mongo-uri", mongo_uri,
               "--database", database)


def first_pass(redis, tmp_path, env, site, settings=SETTINGS, name="first"):
    node = Node(name, tmp_path, env, settings=settings)
    codes = crawl_until_done([node], lambda: redis.lpush("products:start_urls", site.url))
    assert codes == [0], node.tail()
    return node


def revisit_pass(tmp_path, env, names=("second",), settings=SETTINGS):
    """Nodes started with nothing seeded: the feeder brings the due pages back."""
    nodes = [Node(name, tmp_path, env, settings=settings) for name in names]
    try:
        return nodes, [n.wait(240) for n in nodes]
    finally:
        for node in nodes:
            node.stop()


def statuses(served: dict, path: str) -> dict:
    return served["paths"].get(path, {})


def test_second_pass_is_conditional_and_stores_only_what_changed(redis, redis_url, mongo_uri,
                                                                 database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    # With the browser: the JavaScript page is rendered on both visits (no
    # validators through Chromium: its rendered body tells it is unchanged).
    settings = {**SETTINGS, "RENDERING_ENABLED": True}
    with DemoSite(products=PRODUCTS, per_page=PER_PAGE, faults=False) as site:
        first_pass(redis, tmp_path, env, site, settings)
        pages = database["products_pages"]
        items = {d["url"]: d for d in database["products"].find()}
        assert len(items) == PRODUCTS
        # Every page fetched has a record: listings, products (not the 404 link).
        assert pages.count_documents({}) == PRODUCTS + PRODUCTS // PER_PAGE
        site.reset()
        changed, removed = [3, 10, 21], [6]
        site.change(changed)
        site.remove(removed)
        out = recrawl(redis_url, mongo_uri, database.name, "--now")
        assert out.returncode == 0 and f"{pages.count_documents({})} page(s)" in out.stdout, out
        nodes, codes = revisit_pass(tmp_path, env, settings=settings)
        served = site.served()
    assert codes == [0], nodes[0].tail()
    assert not nodes[0].errors(), nodes[0].errors()
    base = site.url.rstrip("/")
    for pid in range(1, PRODUCTS + 1):
        got = statuses(served, f"/product/{pid}")
        if pid in removed:
            assert got == {"410": 1}
        elif pid in changed or pid % NO_VALIDATORS_EVERY == 0 or pid == JS_PRODUCT_ID:
            assert got == {"200": 1}, (pid, got)   # no validators: only the body can tell
        else:
            assert got == {"304": 1}, (pid, got)   # no full body served
    assert all(statuses(served, p) == {"304": 1} for p in ("/", "/list/2", "/list/3", "/list/4"))
    assert "/product/999999" not in served["paths"]   # a dead link is never revisited
    after = {d["url"]: d for d in database["products"].find()}
    for url, before in items.items():
        pid = int(url.rsplit("/", 1)[1])
        now = after[url]
        assert now["first_seen"] == before["first_seen"], url
        if pid in changed:
            assert now["updated_at"] > before["updated_at"] and "(revision 1)" in now["description"]
        else:
            assert now["updated_at"] == before["updated_at"], url
        assert ("gone_at" in now) == (pid in removed), url
    # Only the changed pages were parsed and stored again; the rest only checked.
    node = nodes[0]
    assert node.stat("recrawl/changed") == len(changed)
    assert node.stat("recrawl/unchanged") == PRODUCTS - len(changed) - len(removed) + 4
    assert node.stat("recrawl/gone") == 1 and node.stat("mongo/marked_gone") == 1
    records = {d["url"]: d for d in database["products_pages"].find()}
    gone = records[f"{base}/product/{removed[0]}"]
    assert gone["gone_at"] is not None and gone["outcome"] == "gone"
    for url, record in records.items():
        assert record["checks"] == 2, url
        assert record["first_seen"] < record["last_checked"], url
    status = json.loads(cli(redis_url, "status", "products", "--json").stdout)
    assert status["recrawl"]["pages"] == len(records) and status["recrawl"]["due"] == 0


def test_adaptive_intervals_move_the_right_way_over_three_cycles(redis, redis_url, mongo_uri,
                                                                 database, tmp_path):
    rules = [{"pattern": r"/product/", "interval": 400, "adaptive": True,
              "min_interval": 100, "max_interval": 3200}]
    settings = {**SETTINGS, "RECRAWL_INTERVAL": 0, "RECRAWL_RULES": json.dumps(rules)}
    env = node_env(redis_url, mongo_uri, database.name)
    with DemoSite(products=20, per_page=10, faults=False) as site:
        first_pass(redis, tmp_path, env, site, settings)
        pages = database["products_pages"]
        base = site.url.rstrip("/")
        moving, still = f"{base}/product/3", f"{base}/product/4"
        intervals = {moving: [pages.find_one({"_id": moving})["interval"]],
                     still: [pages.find_one({"_id": still})["interval"]]}
        # Records are read back from MongoDB: untrusted. These are skipped,
        # counted, and the revisits go on.
        hostile = [
            {"_id": f"{base}/product/3?a", "url": f"{base}/product/3?a",
             "request": json.dumps({"url": f"{base}/product/3?a", "callback": "_set_crawler"})},
            {"_id": f"{base}/product/3?b", "url": f"{base}/product/3?b", "request": "{not json"},
            {"_id": f"{base}/product/3?c", "url": f"{base}/product/3?c", "request": 5},
        ]
        pages.insert_many([{**h, "next_visit": datetime.now(timezone.utc)} for h in hostile])
        for cycle in range(3):
            site.change([3])
            out = recrawl(redis_url, mongo_uri, database.name, "--pattern", r"/product/(3|4)$",
                          "--now")
            assert out.returncode == 0 and "2 page(s)" in out.stdout, out
            nodes, codes = revisit_pass(tmp_path, env, (f"cycle-{cycle}",), settings)
            assert codes == [0], nodes[0].tail()
            if cycle == 0:
                assert nodes[0].stat("recrawl/invalid_records") == 2, nodes[0].tail()
                assert nodes[0].stat("recrawl/not_revisitable") == 1
            for url in intervals:
                intervals[url].append(pages.find_one({"_id": url})["interval"])
        served = site.served()
    assert intervals[moving] == [400, 200, 100, 100]        # changed every time: shrinks
    assert intervals[still] == [400, 800, 1600, 3200]       # never changed: grows
    # Only the two pages the pattern chose were revisited (3 times each;
    # every node process reads robots.txt once).
    revisited = {p for p, c in served["paths"].items() if sum(c.values()) > 1} - {"/robots.txt"}
    assert revisited == {"/product/3", "/product/4"}, revisited
    assert pages.find_one({"_id": moving})["changes"] == 4  # first visit + 3 changes


def test_recrawl_with_two_nodes_and_a_sigkill_loses_nothing(redis, redis_url, mongo_uri,
                                                            database, tmp_path):
    products = 60
    settings = {**SETTINGS, "MAX_IDLE_TIME_BEFORE_CLOSE": 4, "CONCURRENT_REQUESTS": 2,
                "RECRAWL_CLAIM_TIMEOUT": 20}
    env = node_env(redis_url, mongo_uri, database.name)
    with DemoSite(products=products, per_page=PER_PAGE, latency_ms=100, faults=False) as site:
        first_pass(redis, tmp_path, env, site, settings)
        started = datetime.now(timezone.utc)
        site.reset()
        changed = list(range(2, products, 7))
        site.change(changed)
        assert recrawl(redis_url, mongo_uri, database.name).returncode == 0
        victim = Node("victim", tmp_path, env, settings=settings)
        survivor = Node("survivor", tmp_path, env, settings=settings)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                answered = sum(sum(c.values()) for c in site.served()["paths"].values())
                if answered >= 15 and victim.proc.poll() is None:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"no revisits under way:\n{victim.tail()}")
            kill_while_holding(victim, redis)
            assert survivor.wait(240) == 0, survivor.tail()
        finally:
            victim.stop()
            survivor.stop()
        served = site.served()
    # Every page was checked in this pass, every changed page stored again.
    records = list(database["products_pages"].find())
    assert len(records) == products + products // PER_PAGE
    late = [r["url"] for r in records if not r["last_checked"] > started]
    assert not late, late
    base = site.url.rstrip("/")
    for pid in changed:
        doc = database["products"].find_one({"_id": f"{base}/product/{pid}"})
        assert "(revision 1)" in doc["description"], pid
    assert all(sum(served["paths"].get(f"/product/{pid}", {}).values()) >= 1
               for pid in range(1, products + 1))
    # The kill hit revisits in flight: the survivor put the victim's leases back.
    assert survivor.stat("scheduler/reclaimed") >= 1, survivor.tail()
