"""The shared proxy pool in real crawls: two `scrapy crawl hosts` nodes on one Redis,
three sites (127.0.0.2-4, devtools.demo.hosts) and real forward proxies on
127.0.0.1 (devtools/demo/proxy.py) that require Basic auth: one answers a 403
captcha page for one host only, one refuses connections, one is healthy; a
fourth is added to the Redis pool key while the crawl runs."""

import base64
import json
import subprocess
import sys
import time
from collections import Counter

import pytest

from devtools.demo.hosts import MultiHostSite
from crawlproject.keys import FrontierKeys, ProxyKeys, start_urls_key
from tests.crawl_helpers import ROOT, Node, assert_written_once, crawl_until_done, node_env
from devtools.demo.proxy import ForwardProxy, closed_port

pytestmark = pytest.mark.slow
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
BANNED_HOST = HOSTS[0]
PASSWORD = "Pr0xy-S3cret-Wombat"
PAGES = 120
BASE = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 8, "LOG_LEVEL": "DEBUG",
        "DOWNLOAD_DELAY": 0.1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "PROXY_POOL_ENABLED": True, "PROXY_RETIRE_AFTER": 3, "RETRY_BACKOFF_BASE": 0.1}


def secrets(usernames):
    """Every form a credential could leak in: the password, user:password, its base64."""
    out = {PASSWORD}
    for user in usernames:
        pair = f"{user}:{PASSWORD}"
        out |= {pair, base64.b64encode(pair.encode()).decode()}
    return out


def redis_values(redis, skip: str) -> str:
    """Every key and value in Redis (but the operator's pool key *skip*), as text."""
    parts = []
    for key in redis.scan_iter(count=1000):
        if key.decode() == skip:
            continue
        kind = redis.type(key).decode()
        value = {"string": redis.get, "list": lambda k: redis.lrange(k, 0, -1),
                 "hash": redis.hgetall, "set": redis.smembers,
                 "zset": lambda k: redis.zrange(k, 0, -1, withscores=True)}[kind](key)
        parts.append(f"{key!r} {value!r}")
    return "\n".join(parts)


def test_bans_move_traffic_per_host_and_nothing_is_lost_or_leaked(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    keys = ProxyKeys("hosts")
    with MultiHostSite(HOSTS, pages=PAGES, latency_ms=5) as site, \
            ForwardProxy("bad", PASSWORD, ban_host=BANNED_HOST) as bad, \
            ForwardProxy("good", PASSWORD) as good, ForwardProxy("late", PASSWORD) as late:
        refused = f"http://dead:{PASSWORD}@127.0.0.1:{closed_port()}"
        pool_file = tmp_path / "proxies.txt"
        pool_file.write_text(f"# pool\n{bad.url}\n{good.url}\n{refused}\n")
        # An entry Scrapy cannot use, in the operator's key: refused, never a crash.
        redis.sadd(keys.pool, f"socks5://sock:{PASSWORD}@127.0.0.1:1080")
        settings = {**BASE, "PROXY_POOL_FILE": str(pool_file)}
        nodes = [Node(f"p{i}", tmp_path, env, spider="hosts", settings=settings)
                 for i in (1, 2)]
        try:
            for node in nodes:
                node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("hosts"), *site.root_urls(),
                        site.url(HOSTS[1], "/missing"))
            assert bad.wait_for(lambda rs: any(r.status == 403 for r in rs), 60)
            first_ban = bad.relayed(BANNED_HOST)[0].t
            # A proxy added to the Redis key mid-crawl gets traffic within seconds.
            added = time.monotonic()
            redis.sadd(keys.pool, late.url)
            assert late.wait_for(lambda rs: len(rs) > 0, 15), [n.tail() for n in nodes]
            late_after = late.records[0].t - added
            codes = [node.wait(300) for node in nodes]
        finally:
            for node in nodes:
                node.stop()
        assert codes == [0, 0], [n.tail() for n in nodes]
        hits = site.requests()
        cli = [subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url,
                               "proxies", "hosts", *extra], cwd=ROOT, capture_output=True,
                              text=True, timeout=60) for extra in ([], ["--json"])]
        state = json.loads(cli[1].stdout)
        bans = {k.decode(): v.decode() for k, v in redis.hgetall(keys.bans).items()}
        stored = redis_values(redis, skip=keys.pool)
        dead = redis.lrange(FrontierKeys("hosts").dead, 0, -1)
        missing_via = [p.id for p in (bad, good, late) if p.relayed(HOSTS[1]) and
                       any(r.path == "/missing" for r in p.relayed(HOSTS[1]))]

    # Every page fetched from the site once and stored once.
    fetched = Counter((h.host, h.path) for h in hits)
    for host in HOSTS:
        assert {p for (h, p) in fetched if h == host} >= site.expected_paths(host)
    assert set(fetched.values()) == {1}, [k for k, v in fetched.items() if v > 1]
    assert_written_once(nodes, PAGES * len(HOSTS))
    assert not dead
    # Off the bad proxy for the host that banned it (a few in flight at the ban, and a
    # revival probe or two), but not for the other hosts.
    banned_after = [r for r in bad.relayed(BANNED_HOST) if r.t > first_ban + 2]
    assert len(bad.relayed(BANNED_HOST)) <= 8 and len(banned_after) <= 3, bad.relayed(BANNED_HOST)
    assert [r for r in bad.relayed() if r.host != BANNED_HOST and r.t > first_ban + 2]
    assert len(good.relayed(BANNED_HOST)) + len(late.relayed(BANNED_HOST)) >= PAGES
    # The refusing proxy was retired, with its reason in the CLI (masked).
    refused_id = refused.rsplit("@", 1)[1]
    assert "connection failures in a row" in state["proxies"][refused_id]["retired"]
    assert refused_id in cli[0].stdout and "retired" in cli[0].stdout.lower()
    assert late_after < 10
    # A 404 is not a ban: the proxy that fetched /missing is not banned for that host.
    assert missing_via and not [p for p in missing_via if f"{p}|{HOSTS[1]}" in bans], bans
    assert sum(n.stat("proxy/invalid/unsupported_scheme") for n in nodes) >= 1
    assert not [e for n in nodes for e in n.errors() if "refused: socks5://" not in e]
    # No credential anywhere: logs (with stats), Redis, CLI output; no 407 either.
    texts = {n.name: n.text() for n in nodes} | {"redis": stored,
                                                  "cli": cli[0].stdout + cli[1].stdout}
    leaks = {where: s for where, text in texts.items()
             for s in secrets(["bad", "good", "late", "dead", "sock"])
             if s in text}
    assert not leaks, leaks
    assert bad.unauthorised == good.unauthorised == late.unauthorised == 0


def test_a_request_banned_through_every_try_is_dead_lettered_as_banned(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Only one proxy, banned by the only host: each request tries it
    PROXY_BAN_MAX_TRIES times (waiting in the frontier while it is banned), then is
    dead-lettered with reason "banned"; the captcha page never reaches the spider
    and the dead letter holds no credential."""
    env = node_env(redis_url, mongo_uri, database.name)
    host = HOSTS[0]
    with MultiHostSite([host], pages=3, latency_ms=5) as site, \
            ForwardProxy("bad", PASSWORD, ban_host=host) as bad:
        settings = {**BASE, "PROXY_POOL": bad.url, "PROXY_BAN_MAX_TRIES": 2,
                    "PROXY_BAN_BACKOFF_BASE": 2.0, "PROXY_BAN_BACKOFF_MAX": 3.0}
        node = Node("d1", tmp_path, env, spider="hosts", settings=settings)
        try:
            node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("hosts"), site.url(host, "/"), site.url(host, "/p/1"))
            assert node.wait(120) == 0, node.tail()
        finally:
            node.stop()
        hits = site.requests()
        relayed = bad.relayed(host, 403)
    dead = [json.loads(r) for r in redis.lrange(FrontierKeys("hosts").dead, 0, -1)]
    assert sorted(d["url"] for d in dead) == sorted([site.url(host, "/"), site.url(host, "/p/1")])
    assert {d["reason"] for d in dead} == {"banned"}
    assert len(relayed) == 4 and not hits                     # 2 tries each, none got through
    assert node.stat("item_scraped_count") == 0 and node.stat("proxy/dead/banned") == 2
    assert node.stat("proxy/waits") >= 1                      # waited while the proxy was banned
    text = json.dumps(dead) + node.text()
    assert not [s for s in secrets(["bad"]) if s in text]


def test_bad_health_values_in_redis_never_lose_a_request(
        redis, redis_url, mongo_uri, database, tmp_path):
    """A latency of inf (and other garbage) in the shared health hash before the
    crawl: one WARNING per value, every page fetched and stored once, the
    pool refreshed all along (the values are repaired by the nodes' flushes)."""
    env = node_env(redis_url, mongo_uri, database.name)
    keys = ProxyKeys("hosts")
    host = HOSTS[1]
    with MultiHostSite([host], pages=20, latency_ms=5) as site, \
            ForwardProxy("good", PASSWORD) as good:
        redis.sadd(keys.pool, good.url)  # the pool comes only from Redis: read it or wait
        redis.hset(keys.health, mapping={f"{good.id}|lat": "inf", "10.9.9.9:1|ok": "nan",
                                         f"{good.id}|consec": "1e400"})
        node = Node("h1", tmp_path, env, spider="hosts", settings=BASE)
        codes = crawl_until_done([node], lambda: redis.lpush(start_urls_key("hosts"),
                                                             site.url(host, "/")), 90)
        hits = site.requests()
    assert codes == [0], node.tail()
    assert {h.path for h in hits} >= site.expected_paths(host)
    assert_written_once([node], 20)
    assert not redis.lrange(FrontierKeys("hosts").dead, 0, -1)
    warnings = [line for line in node.text().splitlines() if "Proxy pool: ignored" in line]
    assert len(warnings) == 3 and all("WARNING" in line for line in warnings), warnings
    assert not node.errors(), node.errors()
    assert float(redis.hget(keys.health, f"{good.id}|lat")) < 10_000    # repaired


def test_with_every_proxy_retired_requests_are_dead_lettered_as_no_proxy(
        redis, redis_url, mongo_uri, database, tmp_path):
    """The only proxy refuses connections and is retired at once: the node says
    so (log, `crawlctl status` and `proxies`), requests wait
    PROXY_POOL_EMPTY_MAX_WAIT, then are dead-lettered with reason no_proxy and
    the node closes when idle (before: they cycled in the delayed set for ever)."""
    env = node_env(redis_url, mongo_uri, database.name)
    host = HOSTS[0]
    refused = f"http://dead:{PASSWORD}@127.0.0.1:{closed_port()}"
    with MultiHostSite([host], pages=3, latency_ms=5) as site:
        seeds = [site.url(host, "/"), site.url(host, "/p/1"), site.url(host, "/p/2")]
        node = Node("e1", tmp_path, env, spider="hosts",
                    settings={**BASE, "PROXY_POOL": refused, "PROXY_RETIRE_AFTER": 1,
                              "PROXY_POOL_EMPTY_MAX_WAIT": 12})
        try:
            node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("hosts"), *seeds)
            node.wait_for_log(r"WARNING: No usable proxy for \d+s \(pool of 1, 1 retired", 60)
            deadline, status, proxies = time.monotonic() + 20, {}, {}
            while time.monotonic() < deadline and not (
                    status.get("proxy_pool", {}).get("since") and proxies.get("no_usable_proxy")):
                status, proxies = (json.loads(subprocess.run(
                    [sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url, *cmd,
                     "hosts", "--json"], cwd=ROOT, capture_output=True, text=True,
                    timeout=60).stdout) for cmd in (["status"], ["proxies"]))
            code = node.wait(120)
        finally:
            node.stop()
        hits = site.requests()
    assert status["proxy_pool"]["since"] and status["proxy_pool"]["nodes"] == 1, status
    assert [n.split("-")[0] for n in proxies["no_usable_proxy"]] == ["e1"], proxies
    assert code == 0, node.tail()
    dead = [json.loads(r) for r in redis.lrange(FrontierKeys("hosts").dead, 0, -1)]
    assert sorted(d["url"] for d in dead) == sorted(seeds) and not hits
    assert {d["reason"] for d in dead} == {"no_proxy"}, dead
    assert node.stat("proxy/dead/no_proxy") == 3
    assert len([e for e in node.errors() if "no usable proxy" in e]) == 1   # not one a request
    assert not [s for s in secrets(["dead"]) if s in node.text() + json.dumps(dead)]
