"""A node frozen (SIGSTOP) shorter than its lease: the cluster's rate after it wakes (issue 47).

Three ``scrapy crawl`` nodes of a user project (README block, one site on
127.0.0.2 at ``CONCURRENT_REQUESTS_PER_DOMAIN = 24`` cluster-wide,
``DOWNLOAD_DELAY = 0``) crawl a tree of ``--pages`` pages that each answer
after ``--latency-ms``. The site records every request's arrival time. Once
the crawl runs at speed (``--warmup`` s), one node is SIGSTOPped for
``--stop`` s (less than its 10 s lease), then SIGCONTed. Printed: requests
per second at the site, the median of the 10 s before the stop, and how long
after SIGCONT the rate stayed under half of it (the last such second). With
``--hosts 1``, per second: the site key's frontier state sampled every 0.2 s
from Redis (slots counted in flight, backoff interval ms, error rate in
millionths, entries queued, leased, delayed). ``--fail-every N``: every Nth
page answers 503 once (no Retry-After), as the soak's demo shop does;
``--items``: an item per page through the README block's MongoDB pipeline.

Run::

    .venv/bin/python -m bench.freeze [--quick] [--stop 7] [--pages 40000]
        [--latency-ms 50] [--fail-every 16] [--items] [--hosts N --concurrency C --delay D]

Findings (issue 47, 2026-12-06, ``--quick --latency-ms 50 --pages 40000``):
without 503s the rate is back at its level in the first second after SIGCONT
(stop 7 s and 9.5 s; 150, 50 and 20 ms pages; 45 sites at 1 s / 2 too). With
``--fail-every 16`` the one-site rate swung between 0 and ~300/s before any
fault (median 87-200/s) and stayed under half of it up to 16-20 s after
SIGCONT: the key's error rate, averaged over ``FRONTIER_BACKOFF_WINDOW`` = 10
answers, fewer than the 24 in flight, passed the 20 % tolerance whenever a
few 503s landed together (the woken node's answers come in one call, its
503s after its successes), which backed the whole site off (1 s for every
node, then halved per success). Averaged over at least the key's concurrency
(lua/sync/keystate.lua ``err_weight_of``): ~305/s steady before, ~166/s during the stop
(the stopped node's slots), ~304/s in the first second after SIGCONT.

Bounded: the run ends ``--after`` s after SIGCONT (nodes killed). Not part of
the test suite.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from datetime import timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis as redis_lib

from bench.common import ROOT, base_parser, results_dir
from crawlproject.keys import FrontierKeys, reset_spider, start_urls_key
from devtools.services import MongoServer, RedisServer

sys.path.insert(0, str(ROOT))
from tests.crawl_helpers import Node, node_env, user_project  # noqa: E402

SPIDER = "freeze"
HOST = "127.0.0.2"
FANOUT = 10
SPIDERS = '''
from crawlproject.spiders.seeded import RedisSpider


class FreezeSpider(RedisSpider):
    name = "freeze"

    def parse(self, response):
        if self.settings.getbool("FREEZE_ITEMS"):
            yield {"url": response.url, "title": response.url.rsplit("/", 1)[-1]}
        yield from response.follow_all(css="a")
'''


class TreeSite:
    """Page i links to pages FANOUT*i+1 .. FANOUT*i+FANOUT (below *pages*); every
    answer after *latency* s; arrival times recorded."""

    def __init__(self, pages: int, latency: float, host: str = HOST, fail_every: int = 0):
        site = self
        failed: set[int] = set()
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path
                if path == "/robots.txt":
                    body, status = b"User-agent: *\nAllow: /\n", 200
                else:
                    with site.lock:
                        site.arrivals.append(time.time())
                    try:
                        i = int(path.strip("/").removeprefix("p") or 0)
                    except ValueError:
                        i = 0
                    kids = range(FANOUT * i + 1, min(FANOUT * i + FANOUT, pages - 1) + 1)
                    body = ("<html><body>" + "".join(f'<a href="/p{k}">{k}</a>' for k in kids)
                            + "</body></html>").encode()
                    status = 200
                    with site.lock:
                        if fail_every and i and i % fail_every == 0 and i not in failed:
                            failed.add(i)  # 503 once (no Retry-After), as the demo shop
                            status, body = 503, b"busy"
                    time.sleep(latency)
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

            def handle_error(self, request, client_address):
                pass  # a node killed at the end: broken pipes

        self.server = Server((host, 0), Handler)
        self.host = host
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def per_second(arrivals: list[float], t0: float, until: float) -> list[int]:
    counts = [0] * int(until - t0 + 1)
    for t in arrivals:
        k = int(t - t0)
        if 0 <= k < len(counts):
            counts[k] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--latency-ms", type=int, default=150)
    parser.add_argument("--warmup", type=float, default=20, help="s of crawl before the stop")
    parser.add_argument("--stop", type=float, default=7, help="s the node stays SIGSTOPped")
    parser.add_argument("--after", type=float, default=25, help="s watched after SIGCONT")
    parser.add_argument("--hosts", type=int, default=1, help="sites 127.0.0.2, ...")
    parser.add_argument("--concurrency", type=int, default=24,
                        help="CONCURRENT_REQUESTS_PER_DOMAIN (cluster-wide)")
    parser.add_argument("--delay", type=float, default=0, help="DOWNLOAD_DELAY (cluster-wide)")
    parser.add_argument("--node-setting", action="append", default=[],
                        help="NAME=VALUE for every node (-s)")
    parser.add_argument("--fail-every", type=int, default=0,
                        help="every Nth page answers 503 once (0: none)")
    parser.add_argument("--items", action="store_true",
                        help="an item per page, through the README block's MongoDB pipeline")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.after = 15, 20
    work = Path(tempfile.mkdtemp(prefix="freeze-"))
    redis = RedisServer(data_dir=work / "redis")
    mongo = MongoServer(storage_path=work / "mongo")
    nodes: list[Node] = []
    try:
        redis.start()
        mongo.start()
        sites = [TreeSite(args.pages, args.latency_ms / 1000, f"127.0.0.{2 + i}", args.fail_every)
                 for i in range(args.hosts)]
        project = user_project(work / "project", "freezeproj", SPIDERS,
                               f"CONCURRENT_REQUESTS_PER_DOMAIN = {args.concurrency}\n"
                               f"DOWNLOAD_DELAY = {args.delay}\n"
                               "ROBOTSTXT_OBEY = False\nLOG_LEVEL = 'INFO'\n")
        env = node_env(redis.url, mongo.uri, "freeze")
        env["PYTHONPATH"] = f"{project}:{ROOT}"
        env["SCRAPY_SETTINGS_MODULE"] = "freezeproj.settings"
        r = redis_lib.Redis.from_url(redis.url)
        reset_spider(r, SPIDER)
        settings = dict(s.split("=", 1) for s in args.node_setting)
        settings.setdefault("MAX_IDLE_TIME_BEFORE_CLOSE", 60)
        if args.items:
            settings["FREEZE_ITEMS"] = "1"
        nodes = [Node(f"node-{i}", work, env, spider=SPIDER, settings=settings) for i in range(3)]
        for node in nodes:
            node.wait_for_log("Reading seeds from", timeout=90)
        t0 = time.time()
        states: list[tuple[float, str]] = []
        sampling = threading.Event()

        def sample_states():
            # every 0.2 s: each site key's frontier state "n|last|block|backoff|crawl
            # delay|error rate" (in flight, backoff interval ms, error rate x 1e6)
            sampler = redis_lib.Redis.from_url(redis.url)
            keys = FrontierKeys(SPIDER)
            while not sampling.wait(0.2):
                for name in sampler.scan_iter(match="*kstate*"):
                    queued = 0
                    for field, value in sampler.hgetall(name).items():
                        if not field.startswith(b"|"):
                            state = value.decode()
                        elif field == b"||qlen":
                            queued = int(value)
                    # + queued, leased (in flight or buffered), delayed entries
                    states.append((round(time.time() - t0, 2), f"{state}|{queued}|"
                                   f"{sampler.hlen(keys.inflight)}|{sampler.zcard(keys.delayed)}"))

        threading.Thread(target=sample_states, daemon=True).start()
        r.lpush(start_urls_key(SPIDER), *(f"http://{s.host}:{s.port}/p0" for s in sites))
        time.sleep(args.warmup)
        victim = nodes[1]
        stop_at = time.time()
        victim.proc.send_signal(19)  # SIGSTOP
        time.sleep(args.stop)
        victim.proc.send_signal(18)  # SIGCONT
        cont_at = time.time()
        time.sleep(args.after)
        end = time.time()
        sampling.set()
        data_states = states
        arrivals = sorted(t for s in sites for t in s.arrivals)
        counts = per_second(arrivals, t0, end)
        base_window = counts[max(0, int(stop_at - t0) - 10):int(stop_at - t0)]
        base = statistics.median(base_window) if base_window else 0
        k_stop, k_cont = int(stop_at - t0), int(cont_at - t0)
        last_low = None
        for k in range(k_cont, len(counts) - 1):
            if counts[k] < base / 2:
                last_low = k
        # the last second under half, counted from SIGCONT (None: never under half after it)
        after_s = None if last_low is None else round(last_low + 1 - (cont_at - t0), 1)
        data = {"benchmark": "freeze", "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                "config": vars(args) | {"out": str(args.out) if args.out else None},
                "per_second": counts, "stop_s": round(stop_at - t0, 2),
                "cont_s": round(cont_at - t0, 2), "base_rate": base,
                "under_half_after_cont_s": after_s, "kstate_samples": data_states, "pages_fetched": len(arrivals)}
        for i, c in enumerate(counts):
            mark = " <- SIGSTOP" if i == k_stop else " <- SIGCONT" if i == k_cont else ""
            print(f"{i:4d}s {c:4d} {'#' * (c // 4)}{mark}")
        if args.hosts == 1:
            per_s: dict[int, list[str]] = {}
            for t, v in data_states:
                per_s.setdefault(int(t), []).append(v)
            print("second: kstate samples (slots|backoff ms|error rate|queued|leased|delayed)")
            for k in range(len(counts)):
                print(f"{k:4d}s {counts[k]:4d}/s  " + " ".join(
                    "|".join(v.split("|")[i] for i in (0, 3, 5, 6, 7, 8)) for v in per_s.get(k, [])))
        print(f"base {base}/s; under half of it until {after_s} s after SIGCONT; "
              f"{len(arrivals)} pages")
        for node in nodes:
            node.proc.send_signal(15)
        for node in nodes:
            try:
                node.proc.wait(30)
            except Exception:
                node.stop()
        logs = {n.name: n.text()[-6000:] for n in nodes}
        data["stats_tail"] = {k: v[v.rfind("Dumping Scrapy stats"):] for k, v in logs.items()}
        path = args.out or results_dir("quick") / "freeze.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
        if args.items:
            import pymongo

            client = pymongo.MongoClient(mongo.uri, directConnection=True)
            seen = [d["first_seen"].replace(tzinfo=timezone.utc).timestamp()
                    for d in client["freeze"][SPIDER].find({}, {"first_seen": 1})
                    if d.get("first_seen")]
            data["items_per_second"] = per_second(seen, t0, end)
            print("items/s:", data["items_per_second"])
        print(f"written {path}; logs in {work}")
        return 0
    finally:
        for node in nodes:
            node.stop()
        mongo.stop()
        redis.stop()
        for s in locals().get("sites", []):
            s.server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
