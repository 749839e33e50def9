"""A node's start-up log has no WARNING for what is simply off by default
(issue 39: each node logged five, "Disabled ...: X is off", for metrics,
recrawl, the proxy pool). A feature that is off says so at INFO at most; a
WARNING is for a real problem. Checked as users start nodes: a fresh
``scrapy startproject`` with the README's settings block pasted as written,
and this project with its defaults; each runs against real Redis and MongoDB
until it idle-closes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.crawl_helpers import ROOT, node_env, readme_settings_block

SPIDER = '''
from crawlproject.spiders import RedisSpider


class ShopSpider(RedisSpider):
    name = "shop"

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
'''


def readme_project(tmp_path) -> os.PathLike:
    """A new ``scrapy startproject`` with the README block pasted into its settings."""
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "userproj"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=60)
    project = tmp_path / "userproj"
    settings = project / "userproj" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + readme_settings_block())
    (project / "userproj" / "spiders" / "shop.py").write_text(SPIDER)
    return project


def start_up_log(cwd, spider: str, env: dict, log) -> str:
    """Run one node until it idle-closes (nothing to crawl); its whole log."""
    # The README block names a local Redis and MongoDB: a node of the test's own
    # is pointed at the test's servers the way a user would, with -s.
    out = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_FILE={log}",
         "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=1", "-s", f"REDIS_URL={env['REDIS_URL']}",
         "-s", f"MONGO_URI={env['MONGO_URI']}", "-s", f"MONGO_DATABASE={env['MONGO_DATABASE']}"],
        cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=180)
    text = log.read_text(errors="replace")
    assert out.returncode == 0, text[-3000:] + out.stderr[-2000:]
    assert "Spider closed (finished)" in text, text[-3000:]
    return text


def warnings_and_errors(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if re.search(r"\] (WARNING|ERROR|CRITICAL):", line) or "Traceback" in line]


@pytest.mark.slow
def test_a_node_of_a_new_project_with_the_readme_block_starts_without_warnings(
        redis_url, mongo_uri, database, tmp_path):
    project = readme_project(tmp_path)
    env = node_env(redis_url, mongo_uri, database.name)
    text = start_up_log(project, "shop", env, tmp_path / "readme.log")
    assert "Shared frontier for 'shop'" in text    # the README's components did start
    assert warnings_and_errors(text) == []


@pytest.mark.slow
def test_a_node_of_this_project_with_its_defaults_starts_without_warnings(
        redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    text = start_up_log(ROOT, "products", env, tmp_path / "defaults.log")
    assert "Shared frontier for 'products'" in text
    assert warnings_and_errors(text) == []
