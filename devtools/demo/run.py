"""The demo: a real two-node crawl on local embedded services.

``python -m devtools.demo.run`` starts Redis (append-only file on), a
MongoDB-wire server and the demo site on free ports, pushes the seed with
``LPUSH products:start_urls``, runs two ``scrapy crawl products`` processes as
two machines would, waits for them to go idle and close, prints a summary and
where the data is, then stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import redis

from crawlproject import settings as project
from crawlproject.connection import mongo_client
from devtools.demo.site import DemoSite
from crawlproject.keys import FrontierKeys, reset_spider, start_urls_key
from devtools.services import MongoServer, RedisServer

ROOT = Path(__file__).resolve().parents[2]


def start_nodes(count: int, env: dict, log_dir: Path, idle_close: int,
                concurrency: int) -> list[subprocess.Popen]:
    """Start *count* ``scrapy crawl products`` processes, each downloading at
    most *concurrency* pages at a time. The demo shop is one host, and the
    frontier lets it have CONCURRENT_REQUESTS_PER_DOMAIN requests in flight
    across all nodes. The frontier shares those slots between nodes that ask
    for work; a *concurrency* below them also keeps the split predictable on
    a crawl this short."""
    nodes = []
    for n in range(1, count + 1):
        log = log_dir / f"node-{n}.log"
        log.unlink(missing_ok=True)  # Scrapy appends to LOG_FILE
        cmd = [sys.executable, "-m", "scrapy", "crawl", "products",
               "-s", f"MAX_IDLE_TIME_BEFORE_CLOSE={idle_close}",
               "-s", f"CONCURRENT_REQUESTS={concurrency}",
               "-s", f"NODE_ID=node-{n}", "-s", f"LOG_FILE={log}"]
        nodes.append(subprocess.Popen(cmd, cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return nodes


def wait_nodes(nodes: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            node.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.terminate()
            node.wait(30)


def wait_joined(client: redis.Redis, nodes: list[subprocess.Popen], count: int,
                timeout: float) -> int:
    """Wait (bounded) until *count* nodes are registered in the frontier, or one exited."""
    key = FrontierKeys("products").nodes
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        joined = client.zcard(key)
        if joined >= count or any(node.poll() is not None for node in nodes):
            return joined
        time.sleep(0.2)  # a plain script, not a reactor
    return client.zcard(key)


def node_stat(log: Path, name: str) -> int:
    match = re.search(rf"'{re.escape(name)}': (\d+)", log.read_text(errors="replace"))
    return int(match.group(1)) if match else 0


def run(args: argparse.Namespace) -> int:
    work = (ROOT / args.dir).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    redis_server = RedisServer(data_dir=str(work / "redis"), appendonly=True)
    mongo_server = MongoServer(storage_path=str(work / "mongo"))
    site = DemoSite(products=args.products, latency_ms=args.latency_ms)
    started = []
    try:
        for service in (redis_server, mongo_server, site):
            service.start()
            started.append(service)
        print(f"Redis {redis_server.url} | MongoDB-wire {mongo_server.uri} | demo site {site.url}")
        client = redis.Redis.from_url(redis_server.url)
        reset_spider(client, "products")
        mongo = mongo_client(mongo_server.uri, asyncio=False)
        collection = mongo[args.database]["products"]
        collection.delete_many({})
        # Every node of the crawl gets the same secret, as an operator exports
        # it on each machine; the demo makes one for its own run.
        env = dict(os.environ, REDIS_URL=redis_server.url, MONGO_URI=mongo_server.uri,
                   MONGO_DATABASE=args.database,
                   FRONTIER_SECRET=os.environ.get("FRONTIER_SECRET") or secrets.token_urlsafe(32))
        nodes = start_nodes(args.nodes, env, logs, args.idle_close, args.node_concurrency)
        print(f"Started {args.nodes} nodes (scrapy crawl products); waiting for them to join...")
        joined = wait_joined(client, nodes, args.nodes, timeout=120)
        # The seed goes in once every node is up, as an operator seeds a running
        # cluster: pushed first, the node that starts a second sooner would take
        # the whole small demo site before the other one asks for work.
        began = time.monotonic()
        client.lpush(start_urls_key("products"), site.url)
        print(f"{joined} nodes in the frontier; LPUSH products:start_urls {site.url}; "
              "waiting for the crawl to finish...")
        wait_nodes(nodes, args.timeout)
        elapsed = time.monotonic() - began - args.idle_close
        print_summary(args, site, collection, logs, elapsed, mongo_server, work)
        return 0 if all(n.returncode == 0 for n in nodes) else 1
    finally:
        for service in reversed(started):
            service.stop()


def print_summary(args, site, collection, logs: Path, elapsed: float, mongo_server, work) -> None:
    from rich.console import Console
    from rich.table import Table

    stats = site.stats()
    pages = sum(stats.values())
    stored = collection.count_documents({})
    table = Table(title=f"crawlproject demo: {args.nodes} nodes, one shared Redis frontier")
    table.add_column("node")
    table.add_column("pages downloaded", justify="right")
    table.add_column("items scraped", justify="right")
    for n in range(1, args.nodes + 1):
        log = logs / f"node-{n}.log"
        table.add_row(f"node-{n}", str(node_stat(log, "downloader/response_count")),
                      str(node_stat(log, "item_scraped_count")))
    console = Console()
    console.print(table)
    console.print(f"Site served {pages} requests; {stored} products stored "
                  f"(expected {args.products}); crawl time {elapsed:.1f}s "
                  f"(plus {args.idle_close}s idle-close wait)")
    console.print(f"Politeness: the shop (one host) had at most "
                  f"{project.CONCURRENT_REQUESTS_PER_DOMAIN} requests in flight across all "
                  f"nodes (CONCURRENT_REQUESTS_PER_DOMAIN, cluster-wide), each node at most "
                  f"{args.node_concurrency} (CONCURRENT_REQUESTS)")
    console.print(f"Data: {mongo_server.uri} database {args.database!r} collection 'products' "
                  f"(files in {work / 'mongo'}); logs in {logs}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--products", type=int, default=120)
    parser.add_argument("--latency-ms", type=int, default=150,
                        help="added to every page: long enough that both nodes get a share")
    parser.add_argument("--idle-close", type=int, default=5)
    parser.add_argument("--node-concurrency", type=int, default=8,
                        help="CONCURRENT_REQUESTS of each node")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--database", default="crawlproject_demo")
    parser.add_argument("--dir", default=".demo")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
