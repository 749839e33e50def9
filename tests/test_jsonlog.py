"""JSON-lines logs (crawlproject/extensions/jsonlog.py) of a real node."""

from __future__ import annotations

import json

import pytest

from devtools.demo.site import DemoSite
from crawlproject.keys import start_urls_key
from tests.crawl_helpers import Node, node_env

pytestmark = pytest.mark.slow


def test_every_line_of_a_crawl_log_is_one_json_object(redis, redis_url, mongo_uri, database,
                                                       tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    with DemoSite(products=6, faults=False) as site:
        node = Node("jsonl", tmp_path, env, settings={"LOG_JSON": True,
                                                      "MAX_IDLE_TIME_BEFORE_CLOSE": 2})
        try:
            node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("products"), site.url, "not a url")  # one WARNING
            assert node.wait(120) == 0, node.tail()
        finally:
            node.stop()
    lines = node.text().splitlines()
    # Scrapy writes its banner (and its list of add-ons) before the add-on takes over.
    first = next(i for i, line in enumerate(lines) if line.startswith("{\"time\""))
    assert first < 25, "the log did not switch to JSON lines"
    records = [json.loads(line) for line in lines[first:]]
    assert len(records) > 10 and all({"time", "level", "logger", "message"} <= set(r)
                                     for r in records)
    assert {r["node"].split("-")[0] for r in records} == {"jsonl"}
    assert any(r["level"] == "WARNING" and "not a url" in r["message"] for r in records)
    assert any(r.get("spider") == "products" for r in records)
    assert any("Dumping Scrapy stats" in r["message"] for r in records)
