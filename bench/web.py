"""Benchmark: a user's crawl of the synthetic web (issue 46), judged by its ground truth.

The synthetic web (:mod:`devtools.synthweb`) serves one site per behaviour on
127.0.0.40+ (robots.txt redirected, chained, looping, 4xx, 5xx then back,
slow, huge, gzip; host aliases and http → https; redirect chains and loops
between sites; traps; bombs; 404/410; 429 with ``Retry-After``; meta robots
and ``X-Robots-Tag``; a crawl delay; cookies; sitemaps; ...), each logging
every request it gets. A *user project* (:func:`tests.crawl_helpers.user_project`:
the README's settings block pasted whole, ``ROBOTSTXT_OBEY = True``) with the
spider a user writes (a ``RedisSpider`` that stores every page and follows
every link) runs as 3 ``scrapy crawl`` nodes against a real redis-server and a
MongoDB-wire server; the seeds (every site's home page) are pushed once all
nodes read seeds. The crawl ends when the nodes idle-close
(``max_idle_time = 3``), or at the deadline (then the nodes are stopped and
the run is marked unfinished).

Checks, from the sites' own log and the items in MongoDB:

==============================================  ======
allowed pages fetched ÷ ground truth             = 1.00
disallowed or trap pages fetched (past allowance)  0
duplicates (a page answered twice)                 0
required pages stored ÷ ground truth             = 1.00
items that must not exist (noindex, bombs, ...)    0
per-site peak ÷ limit (every request counted)    ≤ 1.0
wait after 429 ÷ Retry-After                     ≥ 1.0
time ÷ ideal (the slowest site's politeness)     ≤ 1.25
node peak RSS                                    reported
==============================================  ======

    python -m bench.web [--quick | --smallest] [--sites N] [--timeout S] [--keep] [--addresses]
        [--spider redis|crawl|redis-crawl]

Run as root (with ``unshare``, ``ip``), the sites have host names
(``<site>.synth.test``, in an ``/etc/hosts`` of a network namespace the run
makes for itself), so that a link's trailing dot, capitals or ``user:secret@``
is a spelling of the same host; ``--addresses`` (and any non-root run) names
them by address (no trailing-dot link then).

``--quick`` (the QUICK table, < 90 s) and ``--smallest`` write to
``bench/results/<mode>/web.json``; a full run to ``bench/results/web.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pymongo
import redis as redis_lib

from bench.common import base_parser, finish, fmt, mode_of, table
from devtools.services import MongoServer, RedisServer
from devtools.synthweb import table as synth_table
from devtools.synthweb.check import score
from devtools.synthweb.server import SyntheticWeb
from devtools.synthweb.truth import ideal_seconds, site_ideal_seconds, site_must
from tests.crawl_helpers import node_env, readme_settings, user_project

NAME = "web"
ROOT = Path(__file__).resolve().parents[1]
#: set in the environment of the run inside its network namespace
NETNS_ENV = "BENCH_WEB_NETNS"
NODES = 3
DATABASE = "synthweb"
FLOOR_TIME = 1.25
SMALLEST = ("control", "robots-redirect-same", "robots-404", "meta", "sessionid")
#: the crawl's deadline: DEADLINE_FACTOR × ideal + DEADLINE_GRACE_S (quick: at most QUICK_CAP_S)
DEADLINE_FACTOR, DEADLINE_GRACE_S, QUICK_CAP_S = 3.0, 30.0, 50.0

SPIDER = '''
from scrapy.http import TextResponse
from scrapy.linkextractors import LinkExtractor

from crawlproject.spiders import RedisSpider


class WebSpider(RedisSpider):
    """Store every page, follow every link (any host)."""

    name = "web"
    max_idle_time = 3          # a finite crawl: close when the cluster has nothing left
    links = LinkExtractor()

    def parse(self, response):
        if not isinstance(response, TextResponse):
            return
        yield {"url": response.url, "title": response.css("title::text").get()}
        for link in self.links.extract_links(response):
            yield response.follow(link, self.parse)
'''

#: the spiders users bring (``--spider``): every one stores each page it gets
#: and follows every link, judged by the same ground truth
SPIDERS = {
    "redis": SPIDER,
    # Scrapy's CrawlSpider, its seeds in start_urls (no Redis seed list)
    "crawl": '''
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class WebSpider(CrawlSpider):
    name = "web"
    start_urls = START_URLS
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)

    def parse_start_url(self, response):
        return self.parse_item(response)

    def parse_item(self, response):
        if hasattr(response, "css"):
            yield {"url": response.url, "title": response.css("title::text").get()}
''',
    # scrapy-redis' example project's RedisCrawlSpider (mycrawler_redis.py)
    "redis-crawl": '''
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider


class WebSpider(RedisCrawlSpider):
    name = "web"
    redis_key = "web:start_urls"
    max_idle_time = 3
    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

    def parse_start_url(self, response):
        return self.parse_page(response)

    def parse_page(self, response):
        if hasattr(response, "css"):
            yield {"url": response.url, "title": response.css("title::text").get()}
''',
}


def readme_limits() -> dict:
    """DOWNLOAD_DELAY, CONCURRENT_REQUESTS_PER_DOMAIN and the delay jitter the
    README block gives a node (Scrapy's defaults where it is silent)."""
    from crawlproject.scheduling.sitepoliteness import delay_jitter

    settings = readme_settings()   # the block with its add-ons applied, as a node gets it
    return {"delay": settings.getfloat("DOWNLOAD_DELAY"),
            "concurrency": settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
            "jitter": delay_jitter(settings),
            "timeout": settings.getfloat("DOWNLOAD_TIMEOUT")}


class Nodes:
    """The crawl's ``scrapy crawl web`` processes, with their peak RSS."""

    def __init__(self, project: Path, logs: Path, env: dict, count: int):
        self.logs = [logs / f"node-{i + 1}.log" for i in range(count)]
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "scrapy", "crawl", "web", "-s", f"LOG_FILE={log}",
             "-s", "LOG_LEVEL=INFO", "-s", f"NODE_ID=node-{i + 1}"],
            cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True) for i, log in enumerate(self.logs)]
        self.peak_rss = [0] * count
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            for i, proc in enumerate(self.procs):
                try:
                    self.peak_rss[i] = max(self.peak_rss[i], psutil.Process(proc.pid).memory_info().rss)
                except psutil.Error:
                    pass
            self._stop.wait(0.2)

    def text(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace") if self.logs[i].exists() else ""

    def wait_ready(self, timeout: float, line: str = "Reading seeds from") -> None:
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            while line not in self.text(i):
                if proc.poll() is not None:
                    raise SystemExit(f"node-{i + 1} exited early:\n{self.tail(i)}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"node-{i + 1} not ready in {timeout}s:\n{self.tail(i)}")
                time.sleep(0.1)

    def wait_done(self, deadline: float) -> bool:
        """Wait until every node exits or *deadline* (monotonic); True if they all exited."""
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs):
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._stop.set()
        self._sampler.join(5)

    def tail(self, i: int, lines: int = 20) -> str:
        return "\n".join(self.text(i).splitlines()[-lines:])

    def stats(self, name: str) -> int:
        return sum(int(m.group(1)) for i in range(len(self.procs))
                   for m in [re.search(rf"'{re.escape(name)}': (\d+)", self.text(i))] if m)

    def errors(self) -> list[str]:
        return [line for i in range(len(self.procs)) for line in self.text(i).splitlines()
                if "] ERROR:" in line][:10]


def namespaces_available() -> bool:
    """Whether this process can make a network namespace of its own (root, unshare, ip)."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("unshare", "ip", "mount"))


def run_in_namespace(specs, argv: list[str]) -> int:
    """Run this benchmark again inside ``unshare -n -m``: only ``lo``, and an
    ``/etc/hosts`` naming every site (what resolves ``<site>.synth.test`` and
    ``<site>.synth.test.``). Every server and node starts inside."""
    hosts = Path(tempfile.mkdtemp(prefix="bench-web-hosts-")) / "hosts"
    hosts.write_text(SyntheticWeb(specs, hostnames=True).hosts_file())
    script = (f"mount --bind {hosts} /etc/hosts && ip link set lo up && "
              'exec "$@"')
    try:
        return subprocess.run(["unshare", "-n", "-m", "bash", "-c", script, "netns",
                               sys.executable, "-m", "bench.web", *argv], cwd=ROOT,
                              env={**os.environ, NETNS_ENV: "1"}).returncode
    finally:
        shutil.rmtree(hosts.parent, ignore_errors=True)


def run(specs, mode: str, timeout: float | None, keep: bool, hostnames: bool = False,
        spider: str = "redis") -> dict:
    limits = readme_limits()
    work = Path(tempfile.mkdtemp(prefix="bench-web-"))
    redis = RedisServer(data_dir=work / "redis")
    mongo = MongoServer(storage_path=work / "mongo")
    t0 = time.monotonic()
    try:
        redis.start()
        mongo.start()
        with SyntheticWeb(specs, hostnames=hostnames) as synth:
            ideal, slowest = ideal_seconds(synth, limits["delay"], limits["concurrency"],
                                           limits["jitter"], limits["timeout"])
            budget = timeout or DEADLINE_FACTOR * ideal + DEADLINE_GRACE_S
            if mode != "full" and timeout is None:
                budget = min(budget, QUICK_CAP_S)
            print(f"  {len(synth.sites)} sites, {len(synth.seeds())} seeds; README limits "
                  f"{limits}; ideal {ideal:.1f}s ({slowest}); deadline {budget:.0f}s", flush=True)
            code = SPIDERS[spider].replace("START_URLS", repr(synth.seeds()))
            project = user_project(work / "project", "synthproj", code,
                                   extra_settings=f"REDIS_URL = {redis.url!r}\n"
                                   f"MONGO_URI = {mongo.uri!r}\nMONGO_DATABASE = {DATABASE!r}\n"
                                   # What ends an infinite calendar is the site budget; the
                                   # default (100,000 new pages a site) is a broad crawl's,
                                   # here every site has fewer real pages than the allowance.
                                   f"FRONTIER_SITE_BUDGET = {synth_table.TRAP_ALLOWANCE}\n")
            nodes = Nodes(project, work, node_env(redis.url, mongo.uri, DATABASE), NODES)
            try:
                client = redis_lib.Redis.from_url(redis.url)
                if spider != "crawl":     # (a CrawlSpider's seeds are its start_urls)
                    # (scrapy-redis' spiders read seeds themselves, from the start)
                    nodes.wait_ready(90, "Spider opened" if spider == "redis-crawl"
                                     else "Reading seeds from")
                    client.lpush("web:start_urls", *synth.seeds())
                pushed = time.monotonic()
                finished = nodes.wait_done(pushed + budget)
            finally:
                nodes.stop()
            dead = dead_letters(client, synth)
            with pymongo.MongoClient(mongo.uri) as mclient:
                urls = [d["url"] for d in mclient[DATABASE]["web"].find({}, {"url": 1})]
            hits = synth.hits()
            figures = score(synth, hits, urls, limits["delay"], limits["concurrency"])
            if keep:   # every request the sites saw, for a closer look
                with open(work / "hits.jsonl", "w") as out:
                    for hit in hits:
                        out.write(json.dumps(dataclasses.asdict(hit)) + "\n")
            per_site_ideal = {s.name: site_ideal_seconds(s, limits["delay"], limits["concurrency"],
                                                         limits["jitter"], limits["timeout"])
                              for s in synth.sites.values()}
            musts = {s.name: len(site_must(s)) for s in synth.sites.values()}
            behaviours = {s.name: describe(s.spec) for s in synth.sites.values()}
        elapsed = figures["elapsed_s"] if finished else max(figures["elapsed_s"] or 0, budget)
        data = {
            "mode": mode, "spider": spider, "nodes": NODES, "sites": len(specs), "limits": limits,
            "hostnames": hostnames,
            "ideal_s": ideal, "slowest_site": slowest, "deadline_s": budget,
            "finished": finished, "elapsed_s": elapsed,
            "time_over_ideal": elapsed / ideal if ideal else None,
            "node_peak_rss_mb": [round(r / 2**20, 1) for r in nodes.peak_rss],
            "exit_codes": [p.returncode for p in nodes.procs],
            "items": len(urls), "errors": nodes.errors(), "dead_letters": dead,
            "per_site_ideal_s": per_site_ideal, "must": musts, "behaviours": behaviours,
            **figures,
        }
        data["checks"] = checks(data)
        data["duration_s"] = time.monotonic() - t0
        if keep:
            print(f"  kept {work} (node logs, hits.jsonl)")
        return data
    finally:
        mongo.stop()
        redis.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def dead_letters(client, synth) -> dict[str, dict[str, int]]:
    """The frontier's dead letters: per site, how many for each reason (its
    first words: a reason names the URL it is about)."""
    out: dict[str, dict[str, int]] = {}
    for key in client.scan_iter(match="*:dead"):
        for raw in client.lrange(key, 0, -1):
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            url = str(record.get("url") or "")
            site = synth.site_of(urlsplit(url).netloc) if url else None
            reason = re.sub(r"\S+://\S+", "<url>", str(record.get("reason")))[:80]
            bucket = out.setdefault(site.name if site else "?", {})
            bucket[reason] = bucket.get(reason, 0) + 1
    return out


def describe(spec) -> str:
    return ", ".join(filter(None, [
        f"robots {spec.robots}" if spec.robots != "direct" else "",
        *spec.features, f"→ {spec.redirect_all_to}" if spec.redirect_all_to else "",
        "http → https" if spec.http_to_https else "",
        f"Crawl-delay {spec.crawl_delay:g}" if spec.crawl_delay else ""])) or "plain"


def checks(d: dict) -> list[dict]:
    row = lambda check, value, floor, ok: {"check": check, "value": value, "floor": floor,  # noqa: E731
                                           "pass": bool(ok)}
    ra = d["retry_after_ratio"]
    out = [
        row("allowed pages fetched ÷ ground truth", d["fetched_ratio"], "= 1.00",
            d["fetched_ratio"] >= 1.0),
        row("disallowed pages fetched", d["forbidden"], "0", d["forbidden"] == 0),
        row("trap pages fetched past the allowance", d["trap_over"], "0", d["trap_over"] == 0),
        row(f"duplicates ({d['seed_refetches']} a seed's page again through a link)",
            d["duplicates"], "0", d["duplicates"] == 0),
        row("requests with credentials / items with them", d["credentials_sent"] + d["credentials_stored"],
            "0", d["credentials_sent"] + d["credentials_stored"] == 0),
        row("required pages stored ÷ ground truth", d["stored_ratio"], "= 1.00",
            d["stored_ratio"] >= 1.0),
        row("items that must not exist", d["wrongly_stored"], "0", d["wrongly_stored"] == 0),
        row(f"per-site peak ÷ limit (worst: {d['worst_site']})", d["peak_over_limit"], "≤ 1.0",
            d["peak_over_limit"] <= 1.0),
        row("wait after 429 ÷ Retry-After", ra, "≥ 1.0", ra is None or ra >= 1.0),
        row("time ÷ ideal" + ("" if d["finished"] else " (deadline hit)"), d["time_over_ideal"],
            f"≤ {FLOOR_TIME}", d["finished"] and (d["time_over_ideal"] or 99) <= FLOOR_TIME),
        row("node peak RSS, MB (max of nodes)", max(d["node_peak_rss_mb"]), "reported", True),
    ]
    return out


def render(d: dict) -> str:
    out = table(["check", "value", "floor", "result"],
                [[c["check"], c["value"], c["floor"], c["pass"]] for c in d["checks"]])
    rows = []
    for name, s in d["per_site"].items():
        # (a Crawl-delay binds from when its robots.txt was served: check.politeness)
        ratio = f"{s['gap_ratio']:.2f}" if s["min_gap_s"] else "n/a"
        rows.append([name, d["behaviours"][name], f"{s['answered']}/{s['must']}", s["trap"],
                     s["requests"], s["interval_s"], s["min_gap_s"], ratio,
                     f"{s['in_flight']}/{s['concurrency']}", s["retry_after_ratio"],
                     round(d["per_site_ideal_s"][name], 1)])
    out += "\n\n" + table(["site", "behaviour", "answered/must", "trap", "requests",
                           "interval s", "min gap s", "interval ÷ gap", "in flight",
                           "429 wait ÷ asked", "ideal s"], rows)
    notes = [f"sites {d['sites']}, nodes {d['nodes']}, README limits {d['limits']}, "
             f"ideal {fmt(d['ideal_s'])} s ({d['slowest_site']}), elapsed "
             f"{fmt(d['elapsed_s'])} s, finished {d['finished']}, items {d['items']}, "
             f"requests {d['requests']}, node peak RSS MB {d['node_peak_rss_mb']}"]
    for key in ("missing", "forbidden_examples", "duplicate_examples", "wrongly_stored_examples",
                "not_stored", "dead_letters", "errors"):
        if d.get(key):
            notes.append(f"{key}: {d[key] if not isinstance(d[key], list) else d[key][:8]}")
    return out + "\n\n" + "\n".join(notes)


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=None,
                        help="sites of the catalogue (padded with plain sites); default all")
    parser.add_argument("--timeout", type=float, default=None, help="crawl deadline, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' logs and data")
    parser.add_argument("--addresses", action="store_true",
                        help="sites by address only (default where this process may make a "
                             "network namespace: by host name, <site>.synth.test, in one)")
    parser.add_argument("--spider", choices=sorted(SPIDERS), default="redis",
                        help="the user's spider: our RedisSpider (default), Scrapy's "
                             "CrawlSpider with start_urls, scrapy-redis' RedisCrawlSpider")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    mode = mode_of(args)
    if args.sites is not None:
        specs = synth_table.web(args.sites)
    elif mode == "quick":
        specs = synth_table.web(names=synth_table.QUICK)
    elif mode == "smallest":
        specs = synth_table.web(names=SMALLEST)
    else:
        specs = synth_table.web()
    hostnames = not args.addresses and (bool(os.environ.get(NETNS_ENV)) or namespaces_available())
    if hostnames and not os.environ.get(NETNS_ENV):
        code = run_in_namespace(specs, argv)
        if code:
            raise SystemExit(code)
        return {}
    data = run(specs, mode, args.timeout, args.keep, hostnames, args.spider)
    return finish(NAME, data, args.out, render)


if __name__ == "__main__":
    main()
