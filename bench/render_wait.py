"""What a rendered page's wait costs: per-page render time of a fresh
``scrapy startproject`` with README's settings block (docs/middlewares.md,
"What a rendered page waits for").

    python -m bench.render_wait [--pages 20] [--code DIR]

Local Redis and MongoDB-wire servers and tests/render_site.py's product pages
(title and price written by a script 50 ms after load), rendered by
``RENDER_URL_PATTERNS`` one at a time (``DOWNLOAD_DELAY=0``, one request per
site), three ways: read at ``load`` (``RENDER_WAIT_IDLE=0``), after network
idle (the default with no selector), and waiting for the selector ``.price``.
The render time is scrapy-playwright's ``download_latency`` (navigation, waits,
``page.content()``). ``--code`` measures another checkout's ``crawlproject``
(e.g. ``git archive main crawlproject | tar -x -C /tmp/old``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymongo
import redis

from bench.common import ROOT
from bench.soak import readme_settings_block
from devtools.services import MongoServer, RedisServer
from tests.render_site import RenderSite

SPIDER = '''
from crawlproject.spiders import RedisSpider


class Shop(RedisSpider):
    name = "shop"

    def parse(self, response):
        yield {"url": response.url, "title": response.css(".title::text").get(),
               "price": response.css(".price::text").get(),
               "latency": response.meta.get("download_latency")}
'''
WAITS = {"load (RENDER_WAIT_IDLE=0)": ["RENDER_WAIT_IDLE=0"],
         "network idle (default)": [],
         "selector .price": ['RENDER_IF_MISSING={"/product/": ".price"}']}


def project(where: Path, redis_url: str, mongo_uri: str, database: str) -> Path:
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "shop"], cwd=where,
                   check=True, capture_output=True, timeout=60)
    settings = where / "shop" / "shop" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + readme_settings_block() +
                        '\nDOWNLOAD_ALLOWED_NETWORKS = ["loopback"]'   # the site: 127.0.0.1
                        f"\nREDIS_URL = {redis_url!r}\nMONGO_URI = {mongo_uri!r}\n"
                        f"MONGO_DATABASE = {database!r}\n")
    (where / "shop" / "shop" / "spiders" / "shop.py").write_text(SPIDER)
    return where / "shop"


def run(code: Path, pages: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, RedisServer(data_dir=Path(tmp) / "redis") as rs, \
            MongoServer(storage_path=Path(tmp) / "mongo") as ms, RenderSite() as site:
        client, mongo = redis.Redis.from_url(rs.url), pymongo.MongoClient(ms.uri)
        for n, (name, extra) in enumerate(WAITS.items()):
            client.flushall()
            where = Path(tmp) / f"run{n}"
            where.mkdir()
            path = project(where, rs.url, ms.uri, f"wait{n}")
            client.lpush("shop:start_urls",
                         *[f"{site.url}product/{i}" for i in range(1, pages + 1)])
            cmd = [sys.executable, "-m", "scrapy", "crawl", "shop", "-s", "LOG_LEVEL=WARNING",
                   "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3", "-s", "DOWNLOAD_DELAY=0",
                   "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1", "-s", "RENDER_IF_MISSING={}",
                   "-s", "RENDER_URL_PATTERNS=/product/", *[a for s in extra for a in ("-s", s)]]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(code)])}
            env.pop("SCRAPY_SETTINGS_MODULE", None)
            started = time.monotonic()
            subprocess.run(cmd, cwd=path, env=env, check=True, capture_output=True, timeout=600)
            items = list(mongo[f"wait{n}"]["shop"].find())
            latency = sorted(i["latency"] for i in items)
            rows.append({"wait": name, "pages": len(items),
                         "with_content": sum(1 for i in items if i["title"] and i["price"]),
                         "median_s": statistics.median(latency),
                         "p90_s": latency[max(0, int(len(latency) * 0.9) - 1)],
                         "max_s": latency[-1], "crawl_s": time.monotonic() - started})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose crawlproject runs")
    args = parser.parse_args(argv)
    print(f"{'wait':26} pages  with content  render s: median   p90    max   crawl s")
    for r in run(args.code.resolve(), args.pages):
        print(f"{r['wait']:26} {r['pages']:5}  {r['with_content']:12}  {r['median_s']:16.3f} "
              f"{r['p90_s']:6.3f} {r['max_s']:6.3f}  {r['crawl_s']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
