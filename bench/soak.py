"""Fault soak (issue 36): three nodes of a user project crawl while faults hit.

A temporary *user project* is made whose ``settings.py`` is the README's
settings block ("Use it in your own Scrapy project") pasted whole, followed
only by the addresses of the local servers (``REDIS_URL``, ``MONGO_URI``,
``MONGO_DATABASE``); its spider is the demo ``products`` spider. The soak
starts on 127.0.0.1:

* a ``redis-server`` with the append-only file on (a restart keeps the data);
* a MongoDB-wire server (SecantusDB, :class:`devtools.services.MongoServer`);
* the demo shop (:func:`devtools.demo.site.build_site`, 503-once faults on)
  served on ``--hosts`` loopback addresses 127.0.0.2, 127.0.0.3, ... in one
  process, one port: each address is one site for the frontier's politeness,
  which the README block sets to ``DOWNLOAD_DELAY = 1`` per site for the whole
  cluster (one site alone would crawl at ~1 page/s).

It pushes one seed per host (``LPUSH products:start_urls``), runs three
``scrapy crawl products`` nodes, and every 15-25 s (``--seed``) after the
previous fault ended injects one fault, chosen at random:

``node_kill``   a node SIGKILLed (its process group), restarted 1-3 s later
``node_stop``   a node SIGSTOPped for 5-20 s, then SIGCONT
``redis_kill``  redis-server SIGKILLed, restarted 1-8 s later (same port, same AOF)
``mongo_stop``  the MongoDB-wire server stopped for 5-30 s (same port, same data)
``site_down``   the site process stopped (connections refused) for 2-6 s
``pause``       ``crawlctl pause products``, ``resume`` 3-15 s later

Faults stop after ``--duration`` s; the crawl is then given ``--finish-timeout``
s without faults to finish (all product pages stored, or the frontier empty for
20 s). Nodes are stopped with SIGTERM (SIGKILL after 60 s), then checked:

* every product page of every host stored exactly once in MongoDB: documents
  are counted per product URL taken from the ``url`` field (else ``_id``),
  query string dropped, so a second document for a page is seen whatever its
  ``_id`` (``self_check``: a duplicate is inserted on purpose, the detector
  must report it, then it is removed);
* items left in a spool (Redis ``mongo_spool`` lists, spool files on disk);
* dead letters (``{products}:dead``) by reason; invalid payloads;
* ERROR lines and tracebacks of every node log, grouped by pattern;
* per fault, the time from the fault to the crawl rate recovering: items per
  5 s bucket (by the documents' ``first_seen``, the time the item went through
  the node's pipeline) back to >= 50 % of the median of the 30 s before the
  fault, after a bucket below it (no such dip: 0).

Run::

    .venv/bin/python -m bench.soak [--duration 600] [--hosts 45] [--products 500]
        [--latency-ms 50] [--seed 36] [--keep] [--faults node_stop,...] [--stop-s 7]
        [--setting NAME=VALUE ...]

Issue 47's case (one site at 24 in flight cluster-wide, a node stopped 7 s)::

    .venv/bin/python -m bench.soak --hosts 1 --products 40000 --faults node_stop \
        --stop-s 7 --setting CONCURRENT_REQUESTS_PER_DOMAIN=24 --setting DOWNLOAD_DELAY=0

(``bench.freeze`` measures the same per second at the site, in under 2 minutes.)

Writes ``bench/results/soak-<date>.json`` (``--duration`` < 600:
``bench/results/quick/``) and prints a summary. Not part of the test suite.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import pymongo
import redis as redis_lib

from bench.common import ROOT, base_parser, fmt, machine_info, results_dir, table
from crawlproject.keys import FrontierKeys, reset_spider, start_urls_key
from devtools.services import MongoServer, RedisServer, free_port

SPIDER = "products"
DATABASE = "soak"
NODES = 3
FAULTS = ("node_kill", "node_stop", "redis_kill", "mongo_stop", "site_down", "pause")
BUCKET_S = 5.0
PRE_FAULT_S = 30.0
RECOVERED_FRACTION = 0.5
RECOVERY_WINDOW_S = 60.0
SITE_LINE = "SOAK_SITE_READY"


# -- the user project ------------------------------------------------------------
def readme_settings_block(readme: Path = ROOT / "README.md") -> str:
    """The first ```python block of README's "Use it in your own Scrapy project"."""
    text = readme.read_text()
    section = text.split("## Use it in your own Scrapy project", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    if not match or "crawlproject.addon.Addon" not in match.group(1):
        raise SystemExit("README settings block not found")
    return match.group(1)


def make_project(where: Path, redis_url: str, mongo_uri: str) -> Path:
    """A Scrapy project: README block + local addresses; spider ``products``."""
    project = where / "project"
    pkg = project / "soakproject"
    (pkg / "spiders").mkdir(parents=True)
    (project / "scrapy.cfg").write_text("[settings]\ndefault = soakproject.settings\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text(
        'BOT_NAME = "soakproject"\nSPIDER_MODULES = ["soakproject.spiders"]\n\n'
        "# --- README.md, 'Use it in your own Scrapy project', pasted whole ---\n"
        + readme_settings_block()
        + "# --- this machine's servers (and the sites, on loopback) ---\n"
        'DOWNLOAD_ALLOWED_NETWORKS = ["loopback"]\n'
        f"REDIS_URL = {redis_url!r}\nMONGO_URI = {mongo_uri!r}\nMONGO_DATABASE = {DATABASE!r}\n")
    (pkg / "spiders" / "__init__.py").write_text("")
    (pkg / "spiders" / "products.py").write_text(
        "from crawlproject.spiders.products import ProductsSpider as _Base\n\n\n"
        "class ProductsSpider(_Base):\n    name = 'products'\n")
    return project


# -- the site: the demo shop on several loopback addresses --------------------------
def serve_site(argv: list[str]) -> int:
    """``--serve-site HOSTS PORT PRODUCTS LATENCY``: the demo shop on every host."""
    hosts, port, products, latency = argv[0].split(","), int(argv[1]), int(argv[2]), int(argv[3])
    from twisted.internet import asyncioreactor  # noqa: F401  (any reactor works)
    from twisted.internet import reactor

    from devtools.demo.site import SiteConfig, _install_stop_triggers, build_site

    site = build_site(SiteConfig(products=products, latency_ms=latency), reactor)
    for host in hosts:
        reactor.listenTCP(port, site, backlog=1024, interface=host)
    print(SITE_LINE, flush=True)
    _install_stop_triggers(reactor, True)
    reactor.run(installSignalHandlers=False)
    return 0


class Site:
    def __init__(self, hosts: list[str], products: int, latency_ms: int, log: Path):
        self.hosts, self.products, self.latency_ms, self.log = hosts, products, latency_ms, log
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        for _ in range(5):
            port = self.port or free_port()
            cmd = [sys.executable, "-m", "bench.soak", "--serve-site", ",".join(self.hosts),
                   str(port), str(self.products), str(self.latency_ms)]
            with open(self.log, "ab") as err:
                self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=err,
                                             start_new_session=True)
            line = self.proc.stdout.readline().decode(errors="replace")
            if SITE_LINE in line:
                self.port = port
                return
            self.proc.wait(10)
            if self.port:  # fixed port: retry a little (a socket in the way)
                time.sleep(0.5)
        raise RuntimeError(f"site did not start; see {self.log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def urls(self) -> list[str]:
        return [f"http://{h}:{self.port}/" for h in self.hosts]


# -- nodes --------------------------------------------------------------------------
class SoakNode:
    def __init__(self, index: int, project: Path, logs: Path, env: dict,
                 settings: list[str] = ()):
        self.name = f"node-{index}"
        self.settings = list(settings)
        self.project, self.log, self.env = project, logs / f"{self.name}.log", env
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: list[dict] = []
        self.expected_exit = False

    def start(self) -> None:
        cmd = [sys.executable, "-m", "scrapy", "crawl", SPIDER, "-s", f"LOG_FILE={self.log}",
               "-s", "LOG_LEVEL=INFO", "-s", f"NODE_ID={self.name}",
               "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=60"]
        for setting in self.settings:
            cmd += ["-s", setting]
        self.proc = subprocess.Popen(cmd, cwd=self.project, env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(30)

    def terminate(self, timeout: float, sent: bool = False) -> int | None:
        """SIGTERM (unless *sent*), wait; SIGKILL after *timeout*. Returns the exit code."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        if not sent:  # a second SIGTERM is Scrapy's "forced unclean shutdown"
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


# -- the soak -----------------------------------------------------------------------
class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.kinds = [k for k in args.faults.split(",") if k]
        if not self.kinds or set(self.kinds) - set(FAULTS):
            raise SystemExit(f"--faults: choose among {', '.join(FAULTS)}")
        self.work = Path(tempfile.mkdtemp(prefix="soak-"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.redis = RedisServer(data_dir=self.work / "redis", appendonly=True)
        self.mongo = MongoServer(storage_path=self.work / "mongo")
        hosts = [f"127.0.0.{i + 2}" for i in range(args.hosts)]
        self.site = Site(hosts, args.products, args.latency_ms, self.logs / "site.log")
        self.nodes: list[SoakNode] = []
        self.t0 = time.time()
        self.faults: list[dict] = []
        self.events: list[dict] = []
        self.samples: list[dict] = []
        self.load: list[tuple[float, float]] = []
        self.paused = False

    def now(self) -> float:
        return round(time.time() - self.t0, 2)

    def event(self, what: str, **info) -> None:
        row = {"t": self.now(), "event": what, **info}
        self.events.append(row)
        print(f"  [{row['t']:7.1f}s] {what} {info if info else ''}", flush=True)

    # -- probes (never raise) --
    def rclient(self) -> redis_lib.Redis:
        return redis_lib.Redis.from_url(self.redis.url, socket_timeout=5,
                                        socket_connect_timeout=2)

    def mclient(self) -> pymongo.MongoClient:
        return pymongo.MongoClient(self.mongo.uri, serverSelectionTimeoutMS=2000,
                                   socketTimeoutMS=20000, directConnection=True)

    def collection(self, client):
        return client[DATABASE][SPIDER]

    def frontier(self) -> dict | None:
        keys = FrontierKeys(SPIDER)
        try:
            r = self.rclient()
            try:
                return {"queued": int(r.hget(keys.kstate, "||qlen") or r.get(keys.qlen) or 0),
                        "inflight": r.hlen(keys.inflight), "delayed": r.zcard(keys.delayed),
                        "dead": r.llen(keys.dead), "seeds": r.llen(start_urls_key(SPIDER)),
                        "claims": r.hlen(f"{{{start_urls_key(SPIDER)}}}:claims"),
                        # issue 49: entries in MongoDB, keys waiting for a move or held
                        "backlog": int(r.hget(keys.kstate, "||backlog") or 0),
                        "moves": r.zcard(keys.moves) + r.hlen(keys.mover)}
            finally:
                r.close()
        except redis_lib.RedisError:
            return None

    def stored(self) -> int | None:
        try:
            client = self.mclient()
            try:
                return self.collection(client).estimated_document_count()
            finally:
                client.close()
        except pymongo.errors.PyMongoError:
            return None

    def sample(self) -> dict:
        row = {"t": self.now(), "stored": self.stored(), "frontier": self.frontier(),
               "alive": sum(n.alive() for n in self.nodes)}
        self.samples.append(row)
        if not self.load or time.time() - self.load[-1][0] >= 10:
            self.load.append((time.time(), os.getloadavg()[0]))
        return row

    def watch_nodes(self, finishing: bool) -> None:
        """A node that exited on its own is a finding; restart it (as systemd would),
        unless the crawl is finishing and it closed normally."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None and not node.expected_exit:
                code = node.proc.returncode
                node.exits.append({"t": self.now(), "code": code, "finishing": finishing})
                self.event("node_exited_on_its_own", node=node.name, code=code,
                           finishing=finishing, stored=self.stored())
                if finishing and code == 0:
                    node.proc = None
                    continue
                node.start()

    def wait(self, seconds: float, finishing: bool = False) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(1.0, left))
            self.watch_nodes(finishing)

    # -- faults --
    def inject(self, kind: str) -> dict:
        rng = self.rng
        fault = {"kind": kind, "start": self.now()}
        if kind == "node_kill":
            node = rng.choice(self.nodes)
            node.expected_exit = True
            node.kill()
            fault["node"] = node.name
            self.wait(rng.uniform(1, 3))
            node.start()
            node.expected_exit = False
        elif kind == "node_stop":
            node = rng.choice([n for n in self.nodes if n.alive()] or self.nodes)
            hold = rng.uniform(5, 20)
            hold = self.args.stop_s or hold  # (drawn either way: the same faults follow)
            node.signal(signal.SIGSTOP)
            fault.update(node=node.name, held_s=round(hold, 1))
            time.sleep(hold)  # no node watching: the stopped node is alive
            node.signal(signal.SIGCONT)
        elif kind == "redis_kill":
            down = rng.uniform(1, 8)
            self.redis.kill()
            fault["down_s"] = round(down, 1)
            self.wait(down)
            self.redis.start()
        elif kind == "mongo_stop":
            down = rng.uniform(5, 30)
            self.mongo.stop()
            fault["down_s"] = round(down, 1)
            self.wait(down)
            self.mongo.start()
        elif kind == "site_down":
            down = rng.uniform(2, 6)
            self.site.stop()
            fault["down_s"] = round(down, 1)
            self.wait(down)
            self.site.start()
        elif kind == "pause":
            hold = rng.uniform(3, 15)
            fault["paused_s"] = round(hold, 1)
            fault["pause"] = self.crawlctl("pause")
            self.wait(hold)
            fault["resume"] = self.crawlctl("resume")
        fault["end"] = self.now()
        self.faults.append(fault)
        self.event("fault", **{k: v for k, v in fault.items() if k not in ("start",)})
        return fault

    def crawlctl(self, command: str) -> str:
        done = subprocess.run([sys.executable, "-m", "crawlproject.cli", command, SPIDER],
                              cwd=ROOT, env=dict(os.environ, REDIS_URL=self.redis.url),
                              capture_output=True, text=True, timeout=60)
        return (done.stdout + done.stderr).strip()[-200:] + f" (exit {done.returncode})"

    # -- run --
    def run(self) -> dict:
        args = self.args
        self.redis.start()
        self.mongo.start()
        self.site.start()
        self.event("servers", redis=self.redis.url, mongo=self.mongo.uri,
                   site=f"{len(self.site.hosts)} hosts on port {self.site.port}")
        r = self.rclient()
        reset_spider(r, SPIDER)
        client = self.mclient()
        self.collection(client).drop()
        client.close()
        project = make_project(self.work, self.redis.url, self.mongo.uri)
        env = {k: v for k, v in os.environ.items()
               if k not in ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT", "REDIS_URL", "MONGO_URI",
                            "MONGO_DATABASE")}
        env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
        # the README's deployment gives every node the crawl's secret (without
        # it, requests with the identity's headers are kept on their node: a
        # node's retries then give up during a site outage, dead-lettered)
        env.setdefault("FRONTIER_SECRET", secrets.token_urlsafe(32))
        r.lpush(start_urls_key(SPIDER), *self.site.urls())
        r.close()
        self.nodes = [SoakNode(i + 1, project, self.logs, env, self.args.setting) for i in range(self.args.nodes)]
        self.t0 = time.time()
        for node in self.nodes:
            node.start()
        self.event("started", nodes=self.args.nodes, seeds=len(self.site.hosts))
        expected = len(self.site.hosts) * args.products
        fault_end = time.monotonic() + args.duration
        next_fault = time.monotonic() + self.rng.uniform(15, 25) + args.warmup
        done_reason = None
        while time.monotonic() < fault_end:
            self.wait(1)
            row = self.sample()
            if row["stored"] is not None and row["stored"] >= expected:
                done_reason = "all products stored during the fault phase"
                break
            if time.monotonic() >= next_fault:
                kind = self.rng.choice(self.kinds)
                self.inject(kind)
                next_fault = time.monotonic() + self.rng.uniform(15, 25)
        self.fault_phase_end = self.now()
        self.event("faults over", stored=self.stored())
        empty_since = None
        finish_end = time.monotonic() + args.finish_timeout
        while done_reason is None:
            row = self.sample()
            if row["stored"] is not None and row["stored"] >= expected:
                done_reason = "all products stored"
                break
            f = row["frontier"]
            busy = f is None or any(f[k] for k in ("queued", "inflight", "delayed", "seeds",
                                                   "claims", "backlog"))
            empty_since = None if busy else (empty_since or time.monotonic())
            if empty_since and time.monotonic() - empty_since > 20:
                done_reason = "frontier empty for 20 s (not every product stored)"
                break
            if not any(n.alive() for n in self.nodes):
                done_reason = "every node exited"
                break
            if time.monotonic() > finish_end:
                done_reason = f"finish timeout ({args.finish_timeout:.0f} s)"
                break
            self.wait(1, finishing=True)
        self.crawl_end = self.now()
        self.event("crawl end", reason=done_reason, stored=self.stored())
        # the last buffered items: give the pipelines a moment, then stop the nodes
        time.sleep(2)
        stops = {}
        for node in self.nodes:
            node.expected_exit = True
            node.signal(signal.SIGCONT)
            if node.alive():
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            began = time.monotonic()
            code = node.terminate(60, sent=True)
            stops[node.name] = {"code": code, "seconds": round(time.monotonic() - began, 1)}
        self.event("nodes stopped", stops=stops)
        return {"done_reason": done_reason, "expected_products": expected, "stops": stops}

    # -- checks --
    def check(self) -> dict:
        expected = {f"{h}:{self.site.port}/product/{i}"
                    for h in self.site.hosts for i in range(1, self.args.products + 1)}
        client = self.mclient()
        coll = self.collection(client)
        docs = list(coll.find({}, {"_id": 1, "url": 1, "first_seen": 1}))
        found = find_duplicates(docs)
        missing = sorted(expected - set(found["per_page"]))
        unexpected = sorted(set(found["per_page"]) - expected)
        # the detector must be able to fail: a second document for a stored page
        self_check = {"ok": None}
        if docs:
            victim = docs[0].get("url") or docs[0]["_id"]
            extra = coll.insert_one({"url": victim + "?soak-dup=1", "title": "planted"})
            again = find_duplicates(list(coll.find({}, {"_id": 1, "url": 1})))
            self_check = {"planted_for": victim, "detected": page_key(victim) in again["duplicated"],
                          "duplicates_reported": len(again["duplicated"])}
            self_check["ok"] = self_check["detected"] and not found["duplicated"] and \
                self_check["duplicates_reported"] == 1
            coll.delete_one({"_id": extra.inserted_id})
        first_seen = sorted(to_epoch(d["first_seen"]) - self.t0 for d in docs
                            if d.get("first_seen") is not None)
        client.close()
        r = self.rclient()
        keys = FrontierKeys(SPIDER)
        dead = [json.loads(x) for x in r.lrange(keys.dead, 0, -1)]
        dead_reasons = Counter(str(d.get("reason")) for d in dead)
        dead_products = sorted({page_key(d.get("url") or "") for d in dead} & set(missing))
        spools = {k.decode(): r.llen(k) for k in r.scan_iter(match="{products}:mongo_spool:*")}
        result = {
            "expected_products": len(expected),
            "documents": len(docs),
            "stored_once": sum(1 for k, n in found["per_page"].items() if n == 1 and k in expected),
            "missing": len(missing), "missing_urls": missing[:200],
            "missing_dead_lettered": len(dead_products),
            "missing_unexplained": sorted(set(missing) - set(dead_products))[:200],
            "duplicated": len(found["duplicated"]),
            "duplicated_urls": dict(list(found["duplicated"].items())[:200]),
            "unexpected_pages": unexpected[:50],
            "self_check": self_check,
            "dead_letters": len(dead), "dead_reasons": dict(dead_reasons),
            "dead_examples": [{k: d.get(k) for k in ("url", "reason", "attempts", "node")}
                              for d in dead[:10]],
            "invalid_payloads": r.llen(keys.invalid),
            "frontier_left": self.frontier(),
            "cluster_stats": {k.decode(): v.decode() for k, v in
                              r.hgetall(keys.cluster_stats).items()},
            "redis_spools": spools,
            "spool_files": spool_files(self.work / "project"),
        }
        # issue 49: nothing left in the backlog (Redis's count, MongoDB's live documents)
        result["backlog_left"] = {
            "t_backlog_keys": r.zcard(keys.backlog),
            "kstate_backlog": int(r.hget(keys.kstate, "||backlog") or 0)}
        r.close()
        client = self.mclient()
        try:
            result["backlog_left"]["mongo_live"] = client[DATABASE]["frontier_backlog"] \
                .count_documents({"pl": {"$exists": True}})
        finally:
            client.close()
        result["backlog_peak"] = max((s["frontier"] or {}).get("backlog", 0)
                                     for s in self.samples) if self.samples else 0
        result["errors"] = log_errors(sorted(self.logs.glob("node-*.log")))
        # from the final stats dumps only: a SIGKILLed process writes none (an undercount)
        result["items_scraped_final_stats"] = sum(
            int(m) for log in self.logs.glob("node-*.log")
            for m in re.findall(r"'item_scraped_count': (\d+)", log.read_text(errors="replace")))
        # the tier's moves, summed over the final stats dumps (an undercount too)
        result["backlog_stats"] = {
            name: sum(int(m) for log in self.logs.glob("node-*.log")
                      for m in re.findall(rf"'backlog/{name}': (\d+)",
                                          log.read_text(errors="replace")))
            for name in ("spilled", "refilled", "leftovers", "mongo_errors", "mover_errors")}
        result["rate"] = rates(first_seen)
        result["recovery"] = recovery(self.faults, first_seen, self.crawl_end)
        return result

    def close(self) -> None:
        for node in self.nodes:
            node.signal(signal.SIGCONT)
            node.kill()
        self.site.stop()
        self.mongo.stop()
        self.redis.stop()


def to_epoch(value) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    return float(value)


def page_key(url: str) -> str:
    """``host:port/path`` of a URL: the query string and scheme dropped."""
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}"


def find_duplicates(docs: list[dict]) -> dict:
    """Documents per page (``url`` field, else ``_id``): not the ``_id`` itself, so
    two documents of one page under different ``_id``s are counted twice."""
    per_page = Counter(page_key(str(d.get("url") or d["_id"])) for d in docs)
    return {"per_page": per_page, "duplicated": {k: n for k, n in per_page.items() if n > 1}}


def spool_files(project: Path) -> dict:
    out = {}
    for path in project.rglob("*"):
        if path.is_file() and "spool" in str(path.relative_to(project)):
            out[str(path.relative_to(project))] = path.stat().st_size
    return out


_NORMALIZE = [(re.compile(r"https?://\S+"), "<url>"), (re.compile(r"0x[0-9a-f]+"), "<hex>"),
              (re.compile(r"node-\d+-\d+-[0-9a-f]{6}"), "<node>"),
              (re.compile(r"\d+(\.\d+)?"), "<n>")]


def normalize(message: str) -> str:
    for pattern, repl in _NORMALIZE:
        message = pattern.sub(repl, message)
    return message.strip()[:200]


def log_errors(logs: list[Path]) -> dict:
    """ERROR lines grouped by pattern, tracebacks grouped by their exception line."""
    errors, tracebacks, warnings = Counter(), Counter(), Counter()
    examples = {}
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        in_tb = False
        for line in lines:
            m = re.search(r"\[([^\]]+)\] (ERROR|CRITICAL|WARNING): (.*)", line)
            if m:
                in_tb = False
                key = f"[{m.group(1)}] {normalize(m.group(3))}"
                if m.group(2) == "WARNING":
                    warnings[key] += 1
                else:
                    errors[key] += 1
                    examples.setdefault(key, f"{log.name}: {line[:300]}")
                continue
            if line.startswith("Traceback (most recent call last)"):
                in_tb = True
                continue
            if in_tb and line and not line.startswith((" ", "\t")) and not line.startswith(
                    ("During handling", "The above exception")):
                tracebacks[normalize(line)] += 1
                in_tb = False
    return {"error_lines": sum(errors.values()), "error_groups": dict(errors.most_common(40)),
            "error_examples": {k: examples[k] for k, _ in errors.most_common(40)},
            "tracebacks": dict(tracebacks.most_common(20)),
            "warning_lines": sum(warnings.values()),
            "warning_groups": dict(warnings.most_common(25))}


def rates(times: list[float]) -> dict:
    """Items per 5 s bucket from t=0 (by first_seen)."""
    if not times:
        return {"buckets": []}
    n = int(max(times) // BUCKET_S) + 1
    counts = [0] * n
    for t in times:
        if t >= 0:
            counts[int(t // BUCKET_S)] += 1
    return {"bucket_s": BUCKET_S, "buckets": counts,
            "median_per_s": statistics.median(counts) / BUCKET_S if counts else None}


def recovery(faults: list[dict], times: list[float], crawl_end: float) -> list[dict]:
    """Per fault: median items/s of the 30 s before it; then, in 5 s buckets from
    its start, the first bucket below 50 % of it (the dip) and the first one back
    at >= 50 % after the dip. Recovery is measured up to the next fault."""
    out = []
    for i, fault in enumerate(faults):
        start = fault["start"]
        # up to the next fault, at most 60 s after this one ended (a later slowdown,
        # e.g. the crawl's tail, is not this fault's)
        limit = min(faults[i + 1]["start"] if i + 1 < len(faults) else crawl_end,
                    fault["end"] + RECOVERY_WINDOW_S)
        pre = [sum(1 for t in times if a <= t < a + BUCKET_S) / BUCKET_S
               for a in [start - PRE_FAULT_S + k * BUCKET_S for k in range(int(PRE_FAULT_S / BUCKET_S))]]
        base = statistics.median(pre) if pre else 0
        row = {"kind": fault["kind"], "start": start, "end": fault["end"],
               "fault_s": round(fault["end"] - start, 1), "pre_rate": round(base, 1),
               "min_rate": None, "dip": False, "recovered_s": None, "after_end_s": None}
        if base <= 0:
            row["note"] = "no rate before the fault"
            out.append(row)
            continue
        k, low_seen, rates_seen = 0, False, []
        while start + (k + 1) * BUCKET_S <= limit:
            a = start + k * BUCKET_S
            rate = sum(1 for t in times if a <= t < a + BUCKET_S) / BUCKET_S
            rates_seen.append(rate)
            if rate < RECOVERED_FRACTION * base:
                low_seen = True
            elif low_seen:
                row["recovered_s"] = round(a - start, 1)
                row["after_end_s"] = round(max(0.0, a - fault["end"]), 1)
                break
            k += 1
        row["min_rate"] = round(min(rates_seen), 1) if rates_seen else None
        row["dip"] = low_seen
        if not low_seen:
            row["recovered_s"] = 0.0
            row["after_end_s"] = 0.0
        elif row["recovered_s"] is None:
            row["note"] = f"not back to {RECOVERED_FRACTION:.0%} before {limit:.0f} s"
        out.append(row)
    return out


def render(data: dict) -> str:
    c = data["check"]
    lines = [f"fault soak: {data['nodes']} nodes, {data['config']['hosts']} hosts x "
             f"{data['config']['products']} products, {len(data['faults'])} faults in "
             f"{data['config']['duration']} s; crawl ended at {data['crawl_end_s']:.0f} s "
             f"({data['run']['done_reason']})",
             table(["expected", "documents", "stored once", "missing", "missing, dead-lettered",
                    "duplicated", "self-check (planted dup caught)", "dead letters",
                    "ERROR lines", "tracebacks"],
                   [[c["expected_products"], c["documents"], c["stored_once"], c["missing"],
                     c["missing_dead_lettered"], c["duplicated"], c["self_check"].get("ok"),
                     c["dead_letters"], c["errors"]["error_lines"],
                     sum(c["errors"]["tracebacks"].values())]]),
             "",
             "backlog (final stats dumps): " + ", ".join(f"{k} {v}" for k, v in
                                                         c["backlog_stats"].items())
             + f"; peak in MongoDB {c['backlog_peak']}; left: {c['backlog_left']}",
             "",
             table(["fault", "at s", "lasted s", "items/s before", "lowest", "recovered after s",
                    "after its end s"],
                   [[r["kind"], r["start"], r["fault_s"], r["pre_rate"], r["min_rate"],
                     r["recovered_s"] if r["recovered_s"] is not None else r.get("note"),
                     r["after_end_s"]] for r in c["recovery"]])]
    if c["dead_reasons"]:
        lines += ["", "dead letters: " + ", ".join(f"{k}: {v}" for k, v in
                                                     c["dead_reasons"].items())]
    if c["errors"]["error_groups"]:
        lines += ["", table(["ERROR pattern", "count"],
                            [[k[:110], v] for k, v in c["errors"]["error_groups"].items()][:15])]
    if c["errors"]["tracebacks"]:
        lines += ["", table(["traceback", "count"],
                            [[k[:110], v] for k, v in c["errors"]["tracebacks"].items()])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-site"]:
        return serve_site(argv[1:])
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of faults")
    parser.add_argument("--finish-timeout", type=float, default=300,
                        help="seconds without faults for the crawl to finish")
    parser.add_argument("--warmup", type=float, default=15,
                        help="extra seconds before the first fault")
    parser.add_argument("--nodes", type=int, default=NODES, help="scrapy crawl nodes")
    parser.add_argument("--hosts", type=int, default=45, help="sites (127.0.0.2, ...)")
    parser.add_argument("--products", type=int, default=500, help="products per site")
    parser.add_argument("--latency-ms", type=int, default=50)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of every node (-s), over the README block's")
    parser.add_argument("--stop-s", type=float, default=None,
                        help="node_stop: SIGSTOPped this long (default: 5-20 s, drawn)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="comma-separated kinds to draw from (default: all)")
    args = parser.parse_args(argv)
    if args.hosts > 250:
        parser.error("--hosts: at most 250")
    soak = Soak(args)
    started = time.time()
    print(f"soak: work directory {soak.work}", flush=True)
    try:
        run = soak.run()
        check = soak.check()
    finally:
        soak.close()
    mode = "full" if args.duration >= 600 else "quick"
    data = {"benchmark": "soak", "created": time.strftime("%Y-%m-%d %H:%M:%S"), "mode": mode,
            "machine": machine_info(), "command": "python -m bench.soak " + " ".join(argv),
            "config": {"duration": args.duration, "hosts": args.hosts, "products": args.products,
                       "latency_ms": args.latency_ms, "seed": args.seed,
                       "finish_timeout": args.finish_timeout,
                       "settings": "README block + REDIS_URL/MONGO_URI/MONGO_DATABASE; "
                                   "-s LOG_LEVEL=INFO NODE_ID MAX_IDLE_TIME_BEFORE_CLOSE=60"},
            "nodes": args.nodes, "run": run, "faults": soak.faults, "events": soak.events,
            "fault_phase_end_s": soak.fault_phase_end, "crawl_end_s": soak.crawl_end,
            "node_starts": {n.name: n.starts for n in soak.nodes},
            "node_unexpected_exits": {n.name: n.exits for n in soak.nodes if n.exits},
            "load_avg": {"samples": [(round(t - soak.t0), l) for t, l in soak.load],
                         "max": max((l for _, l in soak.load), default=None),
                         "at_end": os.getloadavg()},
            "check": check,
            "samples": soak.samples[::5],
            "work_dir": str(soak.work) if args.keep else None,
            "duration_s": time.time() - started}
    stamp = time.strftime("%Y%m%d-%H%M")
    path = args.out or results_dir(mode) / f"soak-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    print(render(data))
    print(f"\nwritten {path}")
    if not args.keep:
        shutil.rmtree(soak.work, ignore_errors=True)
    ok = not check["missing"] and not check["duplicated"] and not any(
        check["backlog_left"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
