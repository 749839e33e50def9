"""Cluster-wide politeness in real crawls: three `scrapy crawl hosts` nodes on one
Redis against ten sites on 127.0.0.2 … 127.0.0.11 that record every request's
arrival time (devtools.demo.hosts)."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from devtools.demo.hosts import DEFAULT_HOSTS, MultiHostSite, max_overlap
from crawlproject.keys import FrontierKeys, start_urls_key
from tests.crawl_helpers import ROOT, Node, kill_while_holding, node_env, partial_cluster

pytestmark = pytest.mark.slow
#: measures timing at the site: one such test at a time (tests/conftest.py, _serial_group)
SITE_TIMING = pytest.mark.xdist_group("site-timing")
BASE = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS": 16, "LOG_LEVEL": "INFO"}


def start_nodes(tmp_path, env, count, settings, prefix="n"):
    nodes = [Node(f"{prefix}{i}", tmp_path, env, spider="hosts", settings=settings)
             for i in range(1, count + 1)]
    for node in nodes:
        node.wait_for_log("Reading seeds from")
    return nodes


def finish(nodes, timeout=300):
    try:
        return [node.wait(timeout) for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def crawl(tmp_path, env, redis, site, settings, nodes=3, prefix="n"):
    running = start_nodes(tmp_path, env, nodes, settings, prefix)
    redis.lpush(start_urls_key("hosts"), *site.root_urls())
    codes = finish(running)
    assert codes == [0] * nodes, [n.tail() for n in running]
    return running


PARTITIONED = {**BASE, "FRONTIER_PARTITIONS": 12, "CONCURRENT_REQUESTS": 8,
               "DOWNLOAD_DELAY": 0.1}


def master_of_some_sites(cluster, client):
    """A master that serves the partitions of some of the sites (1 to 5 of 10),
    and the sites whose partitions the other masters serve."""
    from crawlproject.frontier.sitelimits import PolitenessConfig

    partitions = PARTITIONED["FRONTIER_PARTITIONS"]
    politeness = PolitenessConfig(partitions=partitions)
    master_of = {host: client.get_node_from_key(
        FrontierKeys("hosts", politeness.partition(host), partitions).ready).port
        for host in DEFAULT_HOSTS}
    ports = list(master_of.values())
    master = next(node for node in cluster.nodes if 0 < ports.count(node.port) < 6)
    return master, {host for host, port in master_of.items() if port != master.port}


def partitioned_node(name, cluster, mongo_uri, database, tmp_path):
    """A `scrapy crawl hosts` node with PARTITIONED settings on *cluster*."""
    env = {**node_env(cluster.url, mongo_uri, database.name), "REDIS_CLUSTER": "true"}
    return Node(name, tmp_path, env, spider="hosts", settings=PARTITIONED)


def assert_every_page_stored(database, hits, pages, most_fetches):
    """Every page of every site stored, each fetched at least once and at most
    *most_fetches* times."""
    stored = Counter(d["host"] for d in database["hosts"].find({}, {"host": 1}))
    assert stored == Counter({host: pages for host in DEFAULT_HOSTS})
    fetched = Counter((h.host, h.path) for h in hits if h.path.startswith("/p/"))
    assert len(fetched) == pages * len(DEFAULT_HOSTS)
    assert max(fetched.values()) <= most_fetches, fetched.most_common(3)


def crawl_mid_way(node, client, site, database, stored=60):
    """Seed *site* once *node* reads seeds; return when *stored* pages are stored."""
    node.wait_for_log("Reading seeds from")
    client.lpush(start_urls_key("hosts"), *site.root_urls())
    wait_stored(database["hosts"], stored, node)


def wait_stored(collection, count, node, timeout=90):
    """Wait until *collection* holds *count* documents (mid-crawl, for a fault)."""
    deadline = time.monotonic() + timeout
    while collection.count_documents({}) < count:
        assert time.monotonic() < deadline, node.tail()
        time.sleep(0.1)


@SITE_TIMING
def test_three_nodes_keep_every_site_under_its_rate_and_without_politeness_they_do_not(
        redis, redis_url, mongo_uri, database, tmp_path):
    """5 requests/s per site, across all nodes: no 2-second window holds more than
    11 requests of one site. The same crawl with the frontier's politeness off
    (each node applying the delay on its own) goes over: the test can fail."""
    env = node_env(redis_url, mongo_uri, database.name)
    pages = 60
    with MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=10) as site:
        polite = {**BASE, "DOWNLOAD_DELAY": 0.2, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
        crawl(tmp_path, env, redis, site, polite)
        hits = site.requests()
        peaks = {host: site.max_in_window(host, 2.0) for host in DEFAULT_HOSTS}
        assert max(peaks.values()) <= 11, peaks
        for host in DEFAULT_HOSTS:
            fetched = Counter(h.path for h in hits if h.host == host)
            assert set(fetched) == site.expected_paths(host) and set(fetched.values()) == {1}
        # Politeness off: every node delays on its own, three times the rate.
        redis.flushall()
        site.reset()
        rude = {**polite, "FRONTIER_POLITENESS": False}
        crawl(tmp_path, env, redis, site, rude, prefix="rude")
        rude_peaks = {host: site.max_in_window(host, 2.0) for host in DEFAULT_HOSTS}
    assert max(rude_peaks.values()) > 11, rude_peaks


def test_three_nodes_keep_every_site_under_its_concurrency_with_slots_handed_off(
        redis, redis_url, mongo_uri, database, tmp_path):
    """2 requests in flight per site, across all nodes, no interval: the nodes
    hand a finished download's slot to a request they hold in reserve (no
    round trip), and no site ever answers more than 2 at once. The same crawl
    with the frontier's politeness off (2 per node) goes over: the test can fail."""
    env = node_env(redis_url, mongo_uri, database.name)
    with MultiHostSite(DEFAULT_HOSTS, pages=60, latency_ms=40) as site:
        capped = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
        nodes = crawl(tmp_path, env, redis, site, capped)
        hits = site.requests()
        peaks = {host: site.max_in_flight(host) for host in DEFAULT_HOSTS}
        assert max(peaks.values()) <= 2, peaks
        assert sum(n.stat("scheduler/handoffs") for n in nodes) > 0
        fetched = Counter((h.host, h.path) for h in hits)
        assert set(fetched.values()) == {1}
        assert len(fetched) == sum(len(site.expected_paths(h)) for h in DEFAULT_HOSTS)
        redis.flushall()
        site.reset()
        rude = {**capped, "FRONTIER_POLITENESS": False}
        crawl(tmp_path, env, redis, site, rude, prefix="rude")
        rude_peaks = {host: site.max_in_flight(host) for host in DEFAULT_HOSTS}
    assert max(rude_peaks.values()) > 2, rude_peaks


def test_two_nodes_on_one_site_share_its_slots_and_the_limit_holds(
        redis, redis_url, mongo_uri, database, tmp_path):
    """One site, 8 requests in flight across the cluster, two nodes that could
    each run 16. The first node holds all 8 slots when the second starts, and
    it takes each freed slot back in the call that reports it. Without
    sharing the second node would idle (it got 0 pages: checked). It asks for
    work it does not get, so the first takes back only its share: the second
    crawls a good part of what is left, the site never sees more than 8 at
    once, and every page is fetched once."""
    env = node_env(redis_url, mongo_uri, database.name)
    host = DEFAULT_HOSTS[0]
    with MultiHostSite([host], pages=600, latency_ms=150) as site:
        settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}
        first, = start_nodes(tmp_path, env, 1, settings, prefix="first")
        redis.lpush(start_urls_key("hosts"), *site.root_urls())
        deadline = time.monotonic() + 60
        while len(site.requests()) < 20:  # the first node holds the slots
            assert time.monotonic() < deadline, first.tail()
            time.sleep(0.05)
        second, = start_nodes(tmp_path, env, 1, settings, prefix="second")
        assert finish([first, second]) == [0, 0], [first.tail(), second.tail()]
        pages = [n.stat("response_received_count") for n in (first, second)]
        fetched = Counter(h.path for h in site.requests())
        assert site.max_in_flight(host) <= 8
    assert set(fetched.values()) == {1} and set(fetched) == site.expected_paths(host)
    # Without sharing the second node got 0; how much it gets of the rest
    # depends on how long it takes to start, seconds on a loaded machine.
    assert pages[1] >= 0.1 * sum(pages), pages


def test_a_node_killed_while_holding_a_reserve_loses_nothing_and_the_limit_holds(
        redis, redis_url, mongo_uri, database, tmp_path):
    """SIGKILL a node at a moment it holds entries in reserve: the survivor
    reclaims them with the rest of its leases once they expire; every page is
    stored, none fetched more than twice, and no site ever answers more than its
    2 at once (the dead node's reserve held no slot, its downloads' slots stay
    counted until its lease expires)."""
    env = node_env(redis_url, mongo_uri, database.name)
    pages = 40
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
                "CONCURRENT_REQUESTS": 8}
    with MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=100) as site:
        def kill(victim):
            wait_for_reserve(redis, holder="victim")
            victim.kill()
        survivor = crawl_killing_one(tmp_path, env, redis, site, settings, kill,
                                     database["hosts"], pages)
        hits = site.requests()
        peaks = {host: site.max_in_flight(host) for host in DEFAULT_HOSTS}
    assert_every_page_stored(database, hits, pages, most_fetches=2)
    assert survivor.stat("scheduler/reclaimed") >= 1
    assert max(peaks.values()) <= 2, peaks


@SITE_TIMING
def test_a_big_slow_site_does_not_hold_the_small_ones_back(redis, redis_url, mongo_uri,
                                                            database, tmp_path):
    """One site with 2,000 pages and nine with 60, all at 4 requests/s: the small
    sites are done within their own time (longer than the 10 s lease), not after
    the big one; no lease expires while requests wait for their site's turn."""
    env = node_env(redis_url, mongo_uri, database.name)
    big, small = DEFAULT_HOSTS[0], DEFAULT_HOSTS[1:]
    pages = {big: 2000, **{host: 60 for host in small}}
    settings = {**BASE, "DOWNLOAD_DELAY": 0.25, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    with MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=10) as site:
        nodes = start_nodes(tmp_path, env, 3, settings)
        try:
            started = site.now()
            redis.lpush(start_urls_key("hosts"), *site.root_urls())
            # 60 pages + 2 listings at 4/s each = 15.5 s; slack for a loaded machine.
            own_time = (60 + 2) * 0.25 * 1.05
            deadline = time.monotonic() + own_time + 60
            done = {}
            while len(done) < len(small):
                assert time.monotonic() < deadline, (done, [n.tail() for n in nodes])
                for host in small:
                    if host not in done and {h.path for h in site.requests(host)} >= \
                            site.expected_paths(host):
                        done[host] = max(h.t for h in site.requests(host)) - started
                time.sleep(0.5)
            big_fetched = len(site.requests(big))
        finally:
            for node in nodes:
                node.stop()
    # Far below the big site's own time (2,000 pages at 4/s: over 500 s): about
    # their own (the nodes were reading seeds before the push).
    assert max(done.values()) <= own_time * 1.25 + 4, done  # seen: 18.0 s
    assert big_fetched < 2000                      # the big site is far from done
    assert not any(n.stat("scheduler/reclaimed") for n in nodes)
    assert not any("Reclaimed" in n.text() for n in nodes)


@pytest.mark.parametrize("delay", [0.1, 0], ids=["interval", "slots-handed-off"])
def test_retry_after_blocks_a_site_for_every_node_and_the_others_go_on(
        redis, redis_url, mongo_uri, database, tmp_path, delay):
    """With an interval, and without one (then nodes hand finished downloads'
    slots to their reserve, which a block from any node must stop)."""
    env = node_env(redis_url, mongo_uri, database.name)
    blocked = DEFAULT_HOSTS[0]
    settings = {**BASE, "DOWNLOAD_DELAY": delay, "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
                "RETRY_BACKOFF_BASE": 0.1}
    with MultiHostSite(DEFAULT_HOSTS, pages=200, latency_ms=10) as site:
        nodes = start_nodes(tmp_path, env, 3, settings)
        try:
            redis.lpush(start_urls_key("hosts"), *site.root_urls())
            site.wait_for_requests(20, host=blocked, timeout=60)
            if not delay:  # nodes hold reserves (leases flagged '|r') when the 429 comes
                wait_for_reserve(redis, blocked)
            site.throttle(blocked, status=429, retry_after=5, count=1)
            deadline = time.monotonic() + 60
            # The 429 arrived and its answer went out (done is set when it is sent).
            while not site.blocks(blocked) or site.blocks(blocked)[0].done is None:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            block = site.blocks(blocked)[0]
            landed = block_landed(redis, blocked, retry_after=5)
            deadline = time.monotonic() + 60
            while not site.served_after(blocked, block.t + 5.5):
                assert time.monotonic() < deadline, [n.tail() for n in nodes]
                time.sleep(0.1)
            during = [h for h in site.requests(blocked) if block.done < h.t < block.t + 5]
            others = [h for h in site.requests() if h.host != blocked
                      and block.t < h.t < block.t + 5]
        finally:
            for node in nodes:
                node.stop()
    # Until the block is stored, no node knows of it: requests go on. Once it
    # is, only entries leased before it may still start: the site's 2 slots,
    # and without an interval one reserved entry per node (its share of 2 over
    # 3 nodes). Nothing starts after the first second.
    ahead = 2 + (3 if not delay else 0)
    late = [h for h in during if h.t > landed]
    seen = [(round(h.t - block.done, 3), h.path) for h in during]
    assert len(late) <= ahead, (round(landed - block.done, 3), seen)
    # (a second, not half: on a loaded CI run a request leased before the block
    # started 0.73 s after it; none ever starts in the block's remaining 4 s)
    assert not [h for h in during if h.t > block.done + 1.0], seen
    assert len(others) >= 9 * 5 * 5 * 0.5          # the nine other sites went on


def crawl_killing_one(tmp_path, env, client, site, settings, kill, collection, pages):
    """Nodes "victim" and "survivor" crawl *site*; *kill(victim)* kills the
    victim mid-crawl (before every page is stored) and the survivor must finish
    alone. Returns the survivor (its log has the stats)."""
    victim, survivor = (Node(name, tmp_path, env, spider="hosts", settings=settings)
                        for name in ("victim", "survivor"))
    try:
        for node in (victim, survivor):
            node.wait_for_log("Reading seeds from")
        client.lpush(start_urls_key("hosts"), *site.root_urls())
        kill(victim)
        assert collection.count_documents({}) < pages * len(DEFAULT_HOSTS)
        assert survivor.wait(240) == 0, survivor.tail()
    finally:
        victim.stop()
        survivor.stop()
    return survivor


def block_landed(redis, host, retry_after, timeout=30):
    """When the frontier stored *host*'s block of *retry_after* seconds, on
    the site's clock (``time.monotonic()``, one clock for the machine): the
    block ends *retry_after* after it was stored, in Redis server time."""
    kstate = FrontierKeys("hosts").kstate
    deadline = time.monotonic() + timeout
    while True:
        state = redis.hget(kstate, host)
        until = int(state.split(b"|")[2]) if state else 0
        if until:
            break
        assert time.monotonic() < deadline, "no block stored"
        time.sleep(0.005)
    return until / 1000 - retry_after - (time.time() - time.monotonic())


def wait_for_reserve(redis, host=None, holder=None, timeout=30):
    """Wait until a node (started as *holder*, if given) holds an entry (of
    *host*, if given) in reserve: a lease flagged '|r' (the slot hand-off)."""
    inflight = FrontierKeys("hosts").inflight
    deadline = time.monotonic() + timeout
    while not any((host is None or m.endswith(f"@{host}".encode())) and v.endswith(b"|r")
                  and (holder is None or v.startswith(f"{holder}-".encode()))
                  for m, v in redis.hgetall(inflight).items()):
        assert time.monotonic() < deadline, "no reserve held"
        time.sleep(0.01)


@SITE_TIMING
def test_a_limit_changed_from_the_command_line_is_in_force_within_2_seconds(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    host = DEFAULT_HOSTS[0]
    settings = {**BASE, "DOWNLOAD_DELAY": 2.0, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    with MultiHostSite([host], pages=300, latency_ms=5) as site:
        nodes = start_nodes(tmp_path, env, 2, settings)
        try:
            redis.lpush(start_urls_key("hosts"), *site.root_urls())
            site.wait_for_requests(3, host=host, timeout=60)
            out = subprocess.run(
                [sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url,
                 "politeness", "hosts", host, "--delay", "0.1", "--concurrency", "2"],
                cwd=ROOT, capture_output=True, text=True, timeout=60)
            changed = site.now()   # in force by now at the latest
            assert out.returncode == 0, out.stderr
            # Until the site saw the whole window below (not a count of
            # requests: on a loaded machine the command itself may take
            # seconds, and the fast requests start before it returns).
            deadline = time.monotonic() + 60
            while (times := [h.t for h in site.requests(host)])[-1] <= changed + 4.0:
                assert time.monotonic() < deadline, times[-5:]
                time.sleep(0.1)
        finally:
            for node in nodes:
                node.stop()
    after = [t for t in times if t > changed]
    assert after and after[0] - changed <= 2.0, after[:3]
    # From 2 s to 0.1 s between starts (20x the rate) within 2 s of the change.
    window = [t for t in after if changed + 2.0 <= t <= changed + 4.0]
    assert len(window) >= 10, len(window)
    assert FrontierKeys("hosts").limits


def test_twelve_partitions_on_a_three_master_cluster_survive_a_sigkill(
        redis_cluster, mongo_uri, database, tmp_path):
    """FRONTIER_PARTITIONS=12 on a real 3-master Redis Cluster: the frontier's keys
    land on every master, and a node killed mid-crawl loses nothing."""
    from crawlproject.keys import reset_spider

    client = redis_cluster.client()
    reset_spider(client, "hosts")
    pages = 40
    settings = {**BASE, "FRONTIER_PARTITIONS": 12, "DOWNLOAD_DELAY": 0.05,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 2, "CONCURRENT_REQUESTS": 4}
    env = {**node_env(redis_cluster.url, mongo_uri, database.name), "REDIS_CLUSTER": "true"}
    with MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=100) as site:
        def kill(victim):
            wait_stored(database["hosts"], 60, victim)
            kill_while_holding(victim, client)
        survivor = crawl_killing_one(tmp_path, env, client, site, settings, kill,
                                     database["hosts"], pages)
        hits = site.requests()
    # Every page of every site stored (exactly once: one document per URL, and
    # each page fetched at least once, at most twice when the victim held it).
    stored = Counter(d["host"] for d in database["hosts"].find({}, {"host": 1}))
    assert stored == Counter({host: pages for host in DEFAULT_HOSTS})
    fetched = Counter((h.host, h.path) for h in hits if h.path.startswith("/p/"))
    assert len(fetched) == pages * len(DEFAULT_HOSTS) and max(fetched.values()) <= 2
    assert survivor.stat("scheduler/reclaimed") >= 1
    # The partitions' keys are spread over every master.
    per_master = Counter()
    for node in client.get_primaries():
        conn = client.get_redis_connection(node)
        per_master[node.name] = sum(1 for _ in conn.scan_iter(match="{hosts:[0-9]*}:*", count=1000))
    assert len(per_master) == 3 and all(per_master.values()), per_master


@pytest.mark.parametrize("stored", ["3", "not-a-count"])
def test_a_node_refuses_a_crawl_with_another_partition_count(redis, redis_url, mongo_uri,
                                                              database, tmp_path, stored):
    """The crawl's partition count is kept in Redis (untrusted): another count, or
    a value that is not a count, closes the node with a clear error, not a
    traceback, and at once (the close was awaited inside the frontier loop that the
    close waits for: the node hung until killed); exit code 1, the crawl did not
    end as asked. An unparseable count used to be skipped: the node crawled on."""
    keys = FrontierKeys("hosts", 0, 2)
    redis.hset(keys.config, "partitions", stored)
    node = Node("odd", tmp_path, node_env(redis_url, mongo_uri, database.name), spider="hosts",
                settings={**BASE, "FRONTIER_PARTITIONS": 2})
    try:
        assert node.wait(120) == 1
    finally:
        node.stop()
    text = node.text()
    assert "'finish_reason': 'frontier_partitions_mismatch'" in text, node.tail()
    assert "FRONTIER_PARTITIONS is 2 here" in text
    assert "Traceback" not in text


def test_a_node_started_before_its_redis_cluster_crawls_once_the_cluster_is_up(
        mongo_uri, database, tmp_path):
    """Nodes started before the cluster (a deploy, a reboot): each call fails with
    redis-py's RedisClusterException, which is not a RedisError. The node must wait
    (an outage, not an idle crawl), then crawl everything once the cluster is up.
    It used to stay paused for good: its first control read raised, the watcher
    went on without ever saying "ready", and the frontier took nothing."""
    from devtools.services import RedisCluster

    pages = 10
    with RedisCluster(data_dir=tmp_path / "cluster") as cluster:
        url = cluster.url
    env = {**node_env(url, mongo_uri, database.name), "REDIS_CLUSTER": "true"}
    settings = {**BASE, "FRONTIER_PARTITIONS": 3, "CONCURRENT_REQUESTS": 8}
    with MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=20) as site:
        node = Node("early", tmp_path, env, spider="hosts", settings=settings)
        try:
            node.wait_for_log("is unreachable")
            cluster.start()                         # same ports, nodes.conf kept
            try:
                client = cluster.client()
                client.lpush(start_urls_key("hosts"), *site.root_urls())
                assert node.wait(180) == 0, node.tail()
            finally:
                cluster.stop()
        finally:
            node.stop()
            cluster.cleanup()
    stored = Counter(d["host"] for d in database["hosts"].find({}, {"host": 1}))
    assert stored == Counter({host: pages for host in DEFAULT_HOSTS})
    assert node.stat("scheduler/loop_errors") == 0
    assert "Control watcher error" not in node.text()


def test_a_stalled_master_mid_crawl_holds_up_only_the_sites_it_serves(
        mongo_uri, database, tmp_path):
    """One node, FRONTIER_PARTITIONS=12 on a 3-master cluster; mid-crawl one master
    is stopped (SIGSTOP: what a fork or a slow command does to a master, for
    longer). The sites whose partitions live on the other masters go on being
    crawled while it is stopped; once it resumes every page of every site is
    stored, each fetched once. The node's socket timeout is 30 s and the wait
    20 s: a node whose calls to all partitions wait for each other sends
    nothing to any site while the master is stopped."""
    pages = 40
    with partial_cluster(tmp_path) as cluster, \
            MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=20) as site:
        client = cluster.client()
        stalled, healthy = master_of_some_sites(cluster, client)
        node = partitioned_node("stall", cluster, mongo_uri, database, tmp_path)
        try:
            crawl_mid_way(node, client, site, database)
            os.kill(stalled.pid, signal.SIGSTOP)
            try:
                before = sum(h.host in healthy for h in site.requests())
                deadline = time.monotonic() + 20
                while sum(h.host in healthy for h in site.requests()) < before + 30:
                    assert time.monotonic() < deadline, "no site crawled while stopped"
                    time.sleep(0.1)
            finally:
                os.kill(stalled.pid, signal.SIGCONT)
            assert node.wait(240) == 0, node.tail()
        finally:
            node.stop()
        hits = site.requests()
    assert_every_page_stored(database, hits, pages, most_fetches=1)
    assert node.stat("scheduler/loop_errors") == 0


def test_a_master_killed_mid_crawl_and_back_after_the_lease_time_loses_nothing(
        mongo_uri, database, tmp_path):
    """One node, FRONTIER_PARTITIONS=12 on a 3-master cluster; mid-crawl one master
    is killed (SIGKILL), and comes back from its append-only file once the node's
    lease there has expired. Meanwhile the sites of the other masters are crawled
    to the end and the node does not close as idle (work is waiting on the dead
    master). Afterwards every page of every site is stored, none fetched more than
    twice (a lease that expired may be fetched again), no loop error, and the
    node's log tells one outage, not one per call that reached a healthy master."""
    pages = 30
    with partial_cluster(tmp_path) as cluster, \
            MultiHostSite(DEFAULT_HOSTS, pages=pages, latency_ms=20) as site:
        client = cluster.client()
        victim, healthy = master_of_some_sites(cluster, client)
        with victim.client() as direct:                # every write on disk before the kill
            direct.config_set("appendfsync", "always")
            direct.config_set("appendonly", "yes")
            deadline = time.monotonic() + 30
            while direct.info("persistence")["aof_rewrite_in_progress"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        node = partitioned_node("outage", cluster, mongo_uri, database, tmp_path)
        try:
            crawl_mid_way(node, client, site, database)
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            victim._proc.wait(10)
            deadline = killed + 90
            while database["hosts"].count_documents({"host": {"$in": sorted(healthy)}}) < (
                    pages * len(healthy)):
                assert time.monotonic() < deadline and node.proc.poll() is None, node.tail()
                time.sleep(0.1)
            while time.monotonic() - killed < 12:       # the lease (10 s) runs out first
                assert node.proc.poll() is None, node.tail()
                time.sleep(0.1)
            victim.appendonly = True
            victim.extra_args = [*victim.extra_args, "--appendfsync", "always"]
            victim.start()
            assert node.wait(240) == 0, node.tail()
        finally:
            node.stop()
        hits = site.requests()
    assert_every_page_stored(database, hits, pages, most_fetches=2)
    assert node.stat("scheduler/loop_errors") == 0
    assert node.stat("scheduler/redis_errors") >= 1
    # One outage (two if the master's first answers, back, are CLUSTERDOWN), not
    # one per successful call of the seeds reader to a healthy master.
    assert 1 <= node.stat("redis/outages") <= 2, node.text().count("answers again")


@pytest.mark.parametrize("setting", ["FRONTIER_HOST_LIMITS", "DOWNLOAD_SLOTS"])
def test_host_limits_from_the_settings_apply_and_come_back_after_a_clear(
        redis, redis_url, mongo_uri, database, tmp_path, setting):
    """FRONTIER_HOST_LIMITS reaches Redis when a node starts and spaces out that
    site's requests; `crawlctl politeness --clear` of it is undone by the
    running node within HOST_LIMITS_REFRESH (the operator returns to the
    settings' limits, and that entry is one). Before: the node's first call
    raised (a coroutine given to int()), the loop retried it with growing
    pauses, and the entry never reached Redis."""
    from crawlproject.frontier.queue import Frontier
    from crawlproject.scheduler import HOST_LIMITS_REFRESH

    env = node_env(redis_url, mongo_uri, database.name)
    slow, fast = DEFAULT_HOSTS[:2]
    delay = 0.5
    # The node never idle-closes (it must outlive the clear by a refresh
    # interval however fast it crawls): it is stopped once the site is crawled.
    settings = {**BASE, "MAX_IDLE_TIME_BEFORE_CLOSE": 0,
                setting: f'{{"{slow}": {{"delay": {delay}}}}}'}
    limits = Frontier(redis, "hosts", "test").limits
    with MultiHostSite([slow, fast], pages=24, latency_ms=5) as site:
        node, = start_nodes(tmp_path, env, 1, settings)
        try:
            redis.lpush(start_urls_key("hosts"), *site.root_urls())
            site.wait_for_requests(25, host=fast, timeout=60)   # the other site: not held
            early = [h.t for h in site.wait_for_requests(6, host=slow, timeout=60)][:6]
            published = limits()[slow]
            assert (published["delay"], published["source"]) == (delay, "s"), published
            out = subprocess.run(
                [sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url,
                 "politeness", "hosts", slow, "--clear"],
                cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0 and "FRONTIER_HOST_LIMITS entry" in out.stdout, out
            cleared = time.monotonic()
            # Not `assert slow not in limits()` here: on a loaded machine the node's
            # refresh may already have put it back; the CLI said it removed it.
            while slow not in limits():
                assert time.monotonic() - cleared < HOST_LIMITS_REFRESH + 10, node.tail()
                time.sleep(0.1)
            assert limits()[slow]["source"] == "s"
            while not site.expected_paths(slow) <= {h.path for h in site.requests(slow)}:
                assert time.monotonic() - cleared < 120, node.tail()
                time.sleep(0.1)
            node.proc.send_signal(signal.SIGTERM)
            assert node.wait(120) == 0, node.tail()
            hits = Counter(h.path for h in site.requests(slow))
        finally:
            node.stop()
    assert set(hits) == site.expected_paths(slow) and set(hits.values()) == {1}
    # The setting's interval held from the start (Redis time, arrivals may
    # bunch by a few ms), and the node's loop never failed.
    # Measured at the site: on average the setting's interval from the first
    # request. (Each single gap holds at lease time; at the site one may be
    # shorter when a node's start lags on a loaded machine: issue 38, limits
    # held at send time.)
    gaps = [b - a for a, b in zip(early, early[1:])]
    assert (early[-1] - early[0]) / len(gaps) >= delay - 0.05, gaps
    assert node.stat("scheduler/loop_errors") == 0 and not node.errors(), node.errors()


@SITE_TIMING
def test_robots_crawl_delay_spaces_a_site_out_for_every_node(
        redis, redis_url, mongo_uri, database, tmp_path):
    """With ROBOTSTXT_OBEY, a site whose robots.txt asks for `Crawl-delay: 1`
    gets one request a second from the two nodes together; its neighbour,
    without one, is crawled at full speed meanwhile."""
    env = node_env(redis_url, mongo_uri, database.name)
    slow, fast = DEFAULT_HOSTS[:2]
    settings = {**BASE, "ROBOTSTXT_OBEY": True, "DOWNLOAD_DELAY": 0}
    with MultiHostSite([slow, fast], pages={slow: 8, fast: 60}, latency_ms=5,
                       crawl_delay={slow: 1}) as site:
        crawl(tmp_path, env, redis, site, settings, nodes=2)
        hits = site.requests()
    pages = [h for h in hits if h.host == slow and h.path != "/robots.txt"]
    assert sorted(h.path for h in pages) == sorted(site.expected_paths(slow))
    # Spaced from the first page on: the delay reaches the frontier in the call
    # that stores the home page's links (arrivals may lag their lease a little).
    # On average a second apart at the site. (Each start is a second apart at
    # lease; at the site one may come close behind a request a loaded node
    # sent late: issue 38, limits held at send time.)
    gaps = [b.t - a.t for a, b in zip(pages, pages[1:])]
    assert (pages[-1].t - pages[0].t) / len(gaps) >= 0.95, gaps
    fast_pages = [h for h in hits if h.host == fast and h.path != "/robots.txt"]
    assert fast_pages[-1].t < pages[3].t, "the site without a crawl delay waited"


@pytest.mark.parametrize("key,resolver", [
    ("ip", "scrapy.resolver.CachingThreadedResolver"),
    ("ip", "scrapy.resolver.CachingHostnameResolver"),
    ("domain", "scrapy.resolver.CachingThreadedResolver")])
def test_keyed_by_ip_with_either_of_scrapys_resolvers_every_page_is_crawled(
        redis, redis_url, mongo_uri, database, tmp_path, key, resolver):
    """FRONTIER_POLITENESS_KEY = "ip" keys a request by the address this node
    resolved its host to. Scrapy's CachingHostnameResolver (its choice for
    IPv6) caches a list of addresses, not a string: that list was taken for
    the key and every request after the first page failed to enqueue. (And
    "domain", through tldextract's bundled list, in a real node.)"""
    env = node_env(redis_url, mongo_uri, database.name)
    hosts = DEFAULT_HOSTS[:2]
    settings = {**BASE, "FRONTIER_POLITENESS_KEY": key, "DNS_RESOLVER": resolver,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    with MultiHostSite(hosts, pages=30, latency_ms=5) as site:
        nodes = crawl(tmp_path, env, redis, site, settings, nodes=1)
        hits = site.requests()
    for host in hosts:
        fetched = Counter(h.path for h in hits if h.host == host)
        assert set(fetched) == site.expected_paths(host) and set(fetched.values()) == {1}
    assert not nodes[0].errors(), nodes[0].errors()[:5]
    assert nodes[0].stat("scheduler/enqueue_errors") == 0
    # a state per host (the sites are addresses: their own domain and address)
    states = redis.hkeys(FrontierKeys("hosts").kstate)
    assert {h.encode() for h in hosts} <= set(states), states


@SITE_TIMING
def test_a_503_without_retry_after_backs_a_site_off_for_every_node_then_it_recovers(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Five 503 answers in a row without Retry-After: the site's recent error
    rate passes FRONTIER_BACKOFF_TOLERANCE at the third and its interval grows
    (1 s, 2 s, 4 s) for both nodes, the other site goes on, successes relax it
    back to DOWNLOAD_DELAY, and every page is fetched (the 503s retried) once."""
    env = node_env(redis_url, mongo_uri, database.name)
    slow, other = DEFAULT_HOSTS[:2]
    settings = {**BASE, "DOWNLOAD_DELAY": 0.1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                "RETRY_BACKOFF_BASE": 0.1, "RETRY_TIMES": 8}
    with MultiHostSite([slow, other], pages={slow: 40, other: 80}, latency_ms=5) as site:
        nodes = start_nodes(tmp_path, env, 2, settings)
        try:
            redis.lpush(start_urls_key("hosts"), *site.root_urls())
            site.wait_for_requests(5, host=slow, timeout=60)
            site.throttle(slow, status=503, retry_after=None, count=5)
            codes = finish(nodes)
            assert codes == [0, 0], [n.tail() for n in nodes]
            hits = site.requests()
        finally:
            for node in nodes:
                node.stop()
    mine = [h for h in hits if h.host == slow]
    blocks = [h for h in mine if h.status == 503]
    assert len(blocks) == 5
    after = [h for h in mine if h.t > blocks[-1].t]
    waited = round(after[0].t - blocks[-1].t, 3)
    assert waited >= 1.0, (waited, [(round(h.t - blocks[0].t, 3), h.status) for h in mine])
    assert [h for h in hits if h.host == other and blocks[-1].t < h.t < after[0].t]
    # relaxed by the successes: back to about DOWNLOAD_DELAY at the end
    tail = sorted(b.t - a.t for a, b in zip(after[-10:], after[-9:]))
    assert tail[len(tail) // 2] < 0.5, tail
    fetched = Counter(h.path for h in mine if h.status == 200)
    assert set(fetched) == site.expected_paths(slow) and set(fetched.values()) == {1}


@SITE_TIMING
def test_three_nodes_hold_each_site_s_interval_at_the_site_not_only_at_lease(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Limits held at send time: three nodes, three sites with DOWNLOAD_DELAY
    0.5 and 2 in flight, one node sending each request 200 ms after it leased
    it (``HOSTS_SEND_LAG_MS``: a slow downloader middleware, without blocking its
    loop). Measured at the site (its own clock): no two starts closer than the
    interval (less a little measurement), never more than 2 in flight. A node
    that held intervals at lease time only lets the site see a lagging request
    followed by another node's on time, 200 ms closer than the interval
    (FRONTIER_DELAY_MARGIN = 0, which turns the send-time check off: gaps of
    0.30 s at the site); ours reports the late send and the site's next start
    counts from it."""
    env = node_env(redis_url, mongo_uri, database.name)
    hosts = DEFAULT_HOSTS[:3]
    settings = {**BASE, "DOWNLOAD_DELAY": 0.5, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    with MultiHostSite(hosts, pages=20, latency_ms=20) as site:
        nodes = [Node("lag1", tmp_path, env, spider="hosts",
                      settings={**settings, "HOSTS_SEND_LAG_MS": 200}),
                 *(Node(f"n{i}", tmp_path, env, spider="hosts", settings=settings)
                   for i in (2, 3))]
        for node in nodes:
            node.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key("hosts"), *site.root_urls())
        assert finish(nodes) == [0, 0, 0], [n.tail() for n in nodes]
        hits = site.requests()
    late = nodes[0].stat("politeness/sent_late")
    for host in hosts:
        mine = sorted(h.t for h in hits if h.host == host)
        gaps = [b - a for a, b in zip(mine, mine[1:])]
        # 80 ms of measurement (the site's and the nodes' processes waking up):
        # under half of what a lease-time-only node loses. Seen: 0.51-0.53 s at
        # least on an idle machine, 0.432 once with the suite and two more
        # test runs on its 2 cores (load 9.5); 0.30 with the margin off, 0.33
        # with the late-send report removed (scheduling/sitefeedback.py,
        # on_reached_downloader).
        assert min(gaps) >= 0.5 - 0.08, sorted(gaps)[:5]
        assert max_overlap((h.t, h.done) for h in hits if h.host == host) <= 2
    assert late >= 5, late  # the lagging node did send (and report) requests late


def test_a_site_budget_caps_the_pages_crawled_for_the_cluster_and_counts_the_rest(
        redis, redis_url, mongo_uri, database, tmp_path):
    """FRONTIER_SITE_BUDGET = 25 with two nodes: the big site (120 pages and
    listings, like an endless calendar) gets exactly 25 pages fetched between
    the nodes, the small one all of its 12; what the big site's pages linked
    to beyond the budget is refused and counted (node stats, crawlctl status),
    and the crawl ends normally."""
    from crawlproject.cli import main as crawlctl
    import contextlib
    import io
    import json

    env = node_env(redis_url, mongo_uri, database.name)
    big, small = DEFAULT_HOSTS[:2]
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
                "FRONTIER_SITE_BUDGET": 25}
    with MultiHostSite([big, small], pages={big: 120, small: 10}, per_page=10,
                       latency_ms=5) as site:
        nodes = crawl(tmp_path, env, redis, site, settings, nodes=2)
        hits = site.requests()
        small_paths = site.expected_paths(small)
    fetched = Counter(h.path for h in hits if h.host == big)
    assert sum(fetched.values()) == 25 and set(fetched.values()) == {1}
    assert Counter(h.path for h in hits if h.host == small) == Counter(small_paths)
    logs = "".join(n.log.read_text() for n in nodes)
    assert "'scheduler/budget_refused'" in logs
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert crawlctl(["--redis-url", redis_url, "status", "hosts", "--json"]) == 0
    assert json.loads(out.getvalue())["totals"]["budget_refused"] > 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert crawlctl(["--redis-url", redis_url, "politeness", "hosts", big, "--json"]) == 0
    pages = json.loads(out.getvalue())["hosts"][big]["pages"]
    assert pages["admitted"] == 25 and pages["refused"] > 0
