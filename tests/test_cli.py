"""The operator command line against a real Redis."""

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import time
import traceback

import pytest

from crawlproject.cli import main
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.keys import SeedKeys, start_urls_key


def cli(redis_url, *args):
    """crawlctl's own ``main()`` run in this process against the real Redis, its
    output captured as a process's would be. A Python start-up per call (dozens
    a test) made this file the suite's heaviest; the real process is run by
    ``test_seed_file_reports_bad_lines_by_number_and_pushes_the_rest`` (piped
    standard input) and by tests/test_control.py, test_proxy.py, test_acl.py."""
    out, err = io.StringIO(), io.StringIO()
    # What the process's logging prints (Python's last-resort handler: WARNING
    # and up, the bare message) goes to its stderr here too.
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    # Scrapy's get_project_settings() sets SCRAPY_SETTINGS_MODULE in os.environ:
    # a process would take that with it, here later tests' subprocesses would
    # inherit it (a user project in a temporary directory then ran ours).
    environ = dict(os.environ)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--redis-url", redis_url, *args])
        except SystemExit as exc:       # argparse: a usage error (2) or --help (0)
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except Exception:               # what the process would die of: its traceback
            traceback.print_exc()
            code = 1
        finally:
            logging.getLogger().removeHandler(handler)
            os.environ.clear()
            os.environ.update(environ)
    return subprocess.CompletedProcess(["crawlctl", *args], code, out.getvalue(), err.getvalue())


def test_seed_validates_and_pushes(redis, redis_url):
    out = cli(redis_url, "seed", "shop", "http://127.0.0.1/a", '{"url": "http://127.0.0.1/b"}')
    assert out.returncode == 0, out.stderr
    assert redis.lrange(start_urls_key("shop"), 0, -1) == [b'{"url": "http://127.0.0.1/b"}',
                                                      b"http://127.0.0.1/a"]
    bad = cli(redis_url, "seed", "shop", "not a url")
    assert bad.returncode == 2 and "bad" not in bad.stdout and "not an absolute" in bad.stderr
    assert redis.llen(start_urls_key("shop")) == 2


def test_seed_file_reports_bad_lines_by_number_and_pushes_the_rest(redis, redis_url, tmp_path):
    lines = ["# seeds of the spring sale", "http://127.0.0.1/a", "", "not a url",
             '{"url": "http://127.0.0.1/b", "priority": 5}', '{"url": "http://127.0.0.1/c", '
             '"callback": "_set_crawler"}', "http://127.0.0.1/d", "ftp://127.0.0.1/e"]
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join(lines) + "\n")
    out = cli(redis_url, "seed", "products", "--file", str(seeds))
    assert out.returncode == 2, out.stderr
    reported = [line.split(":")[0] for line in out.stderr.splitlines() if line.startswith("line ")]
    assert reported == ["line 4", "line 6", "line 8"], out.stderr
    assert "pushed 3 seed(s)" in out.stdout and "3 invalid line(s)" in out.stdout
    assert sorted(redis.lrange(start_urls_key("products"), 0, -1)) == sorted(
        [b"http://127.0.0.1/a", b'{"url": "http://127.0.0.1/b", "priority": 5}',
         b"http://127.0.0.1/d"])
    # Standard input, all good: exit 0.
    piped = subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url,
                            "seed", "products", "--file", "-"], input="http://127.0.0.1/x\n"
                           "http://127.0.0.1/y\n", capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and "pushed 2 seed(s)" in piped.stdout, piped.stderr
    missing = cli(redis_url, "seed", "products", "--file", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: cannot read")
    assert redis.llen(start_urls_key("products")) == 5


def test_purge_lists_and_nodes(redis, redis_url):
    import time

    from crawlproject.control import node_reports_key
    from crawlproject.keys import FrontierKeys, SeedKeys

    keys = FrontierKeys("shop")
    redis.rpush(keys.dead, '{"url": "http://127.0.0.1/a", "reason": "x"}')
    redis.rpush(keys.invalid, '{"member": "m", "error": "bad"}', '{"member": "n"}')
    redis.rpush(SeedKeys(start_urls_key("shop")).invalid, '{"seed": "x"}')
    assert cli(redis_url, "dead", "shop", "--purge").returncode == 2      # needs --yes
    assert redis.llen(keys.dead) == 1
    out = cli(redis_url, "dead", "shop", "--purge", "--yes")
    assert out.returncode == 0 and "purged 1 dead letter(s)" in out.stdout
    assert "purged 2 invalid payload(s)" in cli(redis_url, "invalid", "shop", "--purge",
                                                 "--yes").stdout
    assert "purged 1 invalid seed(s)" in cli(redis_url, "invalid-seeds", "shop", "--purge",
                                             "--yes").stdout
    assert not redis.exists(keys.dead, keys.invalid, SeedKeys(start_urls_key("shop")).invalid)
    now = int(time.time() * 1000)
    redis.hset(node_reports_key("shop"), mapping={
        "n1-1-a": json.dumps({"at": now, "pages": 5, "pages_per_s": 1.5, "state": "run",
                              "errors_download": 2, "errors_callback": 1}),
        "old-1-b": json.dumps({"at": now - 3_600_000, "pages": 1}),   # stale: pruned
        "bad-1-c": "not json",                                         # unreadable: pruned
        "deep-1-d": "[" * 100_000})                                    # too deep: pruned
    out = cli(redis_url, "nodes", "shop", "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["node"], r["pages"], r["registered"], r["spider"]) for r in rows] == [
        ("n1-1-a", 5, False, "shop")]
    assert redis.hkeys(node_reports_key("shop")) == [b"n1-1-a"]
    # Issue 48: a table by default, and no spider needed (as `status`): the
    # project's spiders that have reports (here: none of this project's)
    table = cli(redis_url, "nodes", "shop")
    assert table.returncode == 0 and "n1-1-a" in table.stdout and "pages/s" in table.stdout
    assert not table.stdout.lstrip().startswith("{"), table.stdout
    redis.hset(node_reports_key("products"), "p1-1-a", json.dumps({"at": now, "pages": 7}))
    every = cli(redis_url, "nodes")
    assert every.returncode == 0, every.stderr
    assert "products: nodes" in every.stdout and "p1-1-a" in every.stdout, every.stdout
    assert "n1-1-a" not in every.stdout   # "shop" is no spider of this project
    assert json.loads(cli(redis_url, "nodes", "--json").stdout)["node"] == "p1-1-a"
    status = json.loads(cli(redis_url, "status", "shop", "--json").stdout)
    assert status["errors"] == {"download": 2, "callback": 1, "dead_letters": 0}
    assert status["rates"]["pages_per_s"] == 1.5


def test_status_dead_replay_and_reset(redis, redis_url):
    f = Frontier(redis, "shop", "n1")
    batch = Batch()
    batch.add('{"url": "http://127.0.0.1/x"}', b"x" * 20, 0)
    batch.take = 1
    member = f.sync(batch).taken[0][0]
    dead = Batch()
    dead.fail(member, "dead", {"payload": '{"url": "http://127.0.0.1/x"}', "priority": 0,
                               "url": "http://127.0.0.1/x", "reason": "HTTP 503", "attempts": 3})
    f.sync(dead)
    status = cli(redis_url, "status", "shop")
    assert status.returncode == 0 and "dead" in status.stdout and "bloom" in status.stdout
    listed = cli(redis_url, "dead", "shop")
    record = json.loads(listed.stdout.splitlines()[0])
    assert record["reason"] == "HTTP 503" and "payload" not in record
    assert "replayed 1" in cli(redis_url, "replay", "shop").stdout
    assert f.counts()["delayed"] == 1                             # due now: queued by the next call
    assert f.counts()["queued"] == 0 and f.sync(Batch()).queued == 1
    assert cli(redis_url, "reset", "shop").returncode == 2        # needs --yes
    assert f.counts()["queued"] == 1
    assert cli(redis_url, "reset", "shop", "--yes").returncode == 0
    assert not list(redis.scan_iter("{shop}:*"))


def test_password_is_not_printed(redis, redis_url):
    redis.lpush(start_urls_key("shop"), "http://127.0.0.1/")
    url = redis_url.replace("redis://", "redis://:topsecret@")
    out = cli(url, "status", "shop")
    assert out.returncode == 0 and "redis://***@" in out.stdout.replace("\n", "")
    assert "topsecret" not in out.stdout + out.stderr


def test_unreachable_redis_gives_a_clear_error():
    from devtools.services import free_port

    out = cli(f"redis://:topsecret@127.0.0.1:{free_port()}/0", "status", "shop")
    assert out.returncode == 1 and out.stderr.startswith("error: Redis at redis://***@127.0.0.1")
    assert "topsecret" not in out.stdout + out.stderr and "Traceback" not in out.stderr


def test_seed_checks_seeds_as_the_nodes_do(redis, redis_url):
    """Seeds that would be refused by a node are refused before they are pushed."""
    for bad in ['{"url": "http://[::1"}', "http://[::1",
                '{"url": "http://127.0.0.1/", "headers": {"X": [1]}}',
                '{"url": "http://127.0.0.1/", "callback": "__init__"}',
                '{"url": "http://127.0.0.1/", "callback": "_set_crawler"}',
                '{"url": "http://127.0.0.1/", "callback": "close"}',
                '{"url": "http://127.0.0.1/", "meta": {"proxy": "http://x:1"}}']:
        out = cli(redis_url, "seed", "products", bad)
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, bad
    assert redis.llen(start_urls_key("products")) == 0
    ok = cli(redis_url, "seed", "products", '{"url": "http://127.0.0.1/", "callback": '
             '"parse_product", "meta": {"campaign": "c"}}')
    assert ok.returncode == 0, ok.stderr
    assert redis.llen(start_urls_key("products")) == 1


def test_http_redis_url_is_a_one_line_error():
    out = cli("http://:topsecret@127.0.0.1:6379/0", "status", "products")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "not a Redis URL" in out.stderr
    assert "topsecret" not in out.stderr


def test_status_of_an_unknown_spider_says_so(redis_url):
    out = cli(redis_url, "status", "no_such_spider")
    assert out.returncode == 1 and "unknown spider 'no_such_spider'" in out.stderr
    known = cli(redis_url, "status", "products")        # a spider of this project, no state yet
    assert known.returncode == 0 and "no crawl state" in known.stdout


def test_invalid_seeds_are_listed(redis, redis_url):
    redis.lpush(SeedKeys(start_urls_key("products")).invalid, json.dumps(
        {"seed": "not a url", "reason": "bad_url", "error": "not an absolute http(s) URL"}))
    out = cli(redis_url, "invalid-seeds", "products")
    assert out.returncode == 0
    assert json.loads(out.stdout.splitlines()[0])["reason"] == "bad_url"


def test_reset_deletes_every_key_of_the_spider_and_only_those(redis, redis_url):
    """Seeds, seed claims, invalid seeds, the frontier, both Bloom filters."""
    import asyncio

    from redis import asyncio as aioredis

    from crawlproject.frontier.bloom import BloomConfig, BloomFilter
    from crawlproject.keys import FrontierKeys, ProxyKeys, SeedKeys, start_urls_key
    from crawlproject.seeds import SeedQueue

    redis.lpush(start_urls_key("shop"), "http://127.0.0.1/a", "http://127.0.0.1/b")
    redis.lpush(SeedKeys(start_urls_key("shop")).invalid, "{}")
    redis.lpush(start_urls_key("other"), "http://127.0.0.1/keep")

    async def claim():
        client = aioredis.Redis.from_url(redis_url)
        try:
            await SeedQueue(client, start_urls_key("shop")).claim(1)   # claimed, never released
        finally:
            await client.aclose()

    asyncio.run(claim())
    f = Frontier(redis, "shop", "n1", bloom=BloomConfig(capacity=1000))
    batch = Batch(take=1)
    batch.add('{"url": "http://127.0.0.1/x"}', b"x" * 20, 0)
    f.sync(batch)
    f.add_stats({"acked": 1})
    BloomFilter(redis, FrontierKeys("shop").dupefilter, BloomConfig(capacity=1000)).add(b"y" * 20)
    Frontier(redis, "other", "n1").sync(batch)
    spooled = FrontierKeys("shop").mongo_spool("crawl-0123456789")
    redis.rpush(spooled, "chunk of items")
    before = {k.decode() for k in redis.keys("*")}
    assert {SeedKeys(start_urls_key("shop")).claims, SeedKeys(start_urls_key("shop")).claims_due,
            SeedKeys(start_urls_key("shop")).claims_seq, "{shop}:bloom:0:0", "{shop}:dupefilter:0:0"} <= before
    pool = ProxyKeys("shop")
    redis.sadd(pool.pool, "http://u:p@127.0.0.9:3128")      # the operator's list: configuration
    redis.hset(pool.health, "127.0.0.9:3128", "1|0|0|0")      # crawl state
    before |= {pool.pool, pool.health}
    refused = cli(redis_url, "reset", "shop", "--yes")     # items not in MongoDB yet
    assert refused.returncode == 2 and "spool-replay --spider shop" in refused.stderr
    assert {k.decode() for k in redis.keys("*")} == before
    done = cli(redis_url, "reset", "shop", "--yes", "--drop-spooled-items")
    assert done.returncode == 0 and "kept the proxy list" in done.stdout
    after = {k.decode() for k in redis.keys("*")}
    assert [k for k in after if "shop" in k] == [pool.pool], after
    assert cli(redis_url, "reset", "shop", "--yes", "--drop-proxy-pool").returncode == 0
    after = {k.decode() for k in redis.keys("*")}
    assert not [k for k in after if "shop" in k], after
    assert {k for k in before if "other" in k} == after


def test_politeness_shows_hosts_and_changes_limits_at_run_time(redis, redis_url):
    from crawlproject.frontier.sitelimits import Limits, PolitenessConfig

    f = Frontier(redis, "shop", "n1",
                 politeness=PolitenessConfig(default=Limits(delay=60, concurrency=1)))
    batch = Batch(take=5)
    for i in range(3):
        batch.add(f'{{"url": "http://slow.example/{i}"}}', None, 0, 0, "slow.example")
    started = time.monotonic()
    taken = f.sync(batch).taken
    f.ack(*(m for m, _ in taken))
    shown = cli(redis_url, "politeness", "shop", "--json")
    state = json.loads(shown.stdout)["hosts"]["slow.example"]
    assert state["queued"] == 2 and state["inflight"] == 0
    assert state["ready_at_ms"] - state["last_start_ms"] >= 60_000
    # `status` shows the same, most queued hosts first.
    status = json.loads(cli(redis_url, "status", "shop", "--json").stdout)["politeness"]
    assert status["hosts"] == 1 and status["blocked"] == 0
    top = status["top"][0]
    assert (top["host"], top["queued"], top["inflight"]) == ("slow.example", 2, 0)
    # The interval (plus its safety margin) less the time the commands took: on a
    # loaded machine each crawlctl process may take seconds to start.
    assert 60 - (time.monotonic() - started) - 1 < top["next_start_in_s"] <= 60 * 1.1
    assert "slow.example" in cli(redis_url, "status", "shop").stdout
    changed = cli(redis_url, "politeness", "shop", "slow.example", "--delay", "0.5",
                  "--concurrency", "2")
    assert changed.returncode == 0, changed.stderr
    # In force at once: the next start is due 0.5 s after the last one, not 60 s.
    deadline = time.monotonic() + 10
    while not (taken := f.sync(Batch(take=5)).taken):
        assert time.monotonic() < deadline, "the new interval is not in force"
        time.sleep(0.05)
    assert len(taken) == 1                                  # concurrency 2: one more
    assert f.limits()["slow.example"] == {"delay": 0.5, "concurrency": 2, "source": "c"}
    table = cli(redis_url, "politeness", "shop")
    assert "slow.example" in table.stdout and "0.5s / 2 (cli)" in table.stdout
    assert cli(redis_url, "politeness", "shop", "--delay", "1").returncode == 2   # which host?
    for bad in ("1e308", "nan", "-1"):                      # a clear error, nothing changed
        refused = cli(redis_url, "politeness", "shop", "slow.example", "--delay", bad)
        assert refused.returncode == 2 and "delay must be 0 to 86400 s" in refused.stderr, bad
    assert f.limits()["slow.example"]["delay"] == 0.5
    # 0 is "no limit" in settings: typed by an operator it most likely means
    # "stop": refused, nothing changed.
    zero = cli(redis_url, "politeness", "shop", "slow.example", "--concurrency", "0")
    assert zero.returncode == 2 and "must be 1 or more" in zero.stderr, zero
    assert f.limits()["slow.example"]["concurrency"] == 2
    assert cli(redis_url, "politeness", "shop", "slow.example", "--clear").returncode == 0
    assert f.limits() == {}


def test_a_limit_changed_alone_keeps_the_other_and_hosts_are_named_as_nodes_key_them(
        redis, redis_url):
    """`--concurrency 2` alone used to store a delay of 0 (and `--delay` alone
    no concurrency limit), lifting the nodes' DOWNLOAD_DELAY for that site just
    as the operator tried to slow it down; a URL or host:port was stored as a
    key no request has."""
    from crawlproject.frontier.sitelimits import Limits, PolitenessConfig

    f = Frontier(redis, "shop", "n1",
                 politeness=PolitenessConfig(default=Limits(delay=60, concurrency=1)))
    batch = Batch()
    batch.add('{"url": "http://slow.example/1"}', None, 0, 0, "slow.example")
    f.sync(batch)
    done = cli(redis_url, "politeness", "shop", "slow.example", "--concurrency", "2")
    assert done.returncode == 0 and "the nodes' DOWNLOAD_DELAY" in done.stdout, done.stdout
    assert "no request" not in done.stderr                  # it has one queued
    assert f.limits()["slow.example"] == {"delay": None, "concurrency": 2, "source": "c"}
    assert "settings' / 2 (cli)" in cli(redis_url, "politeness", "shop").stdout
    assert cli(redis_url, "politeness", "shop", "slow.example", "--delay", "5").returncode == 0
    assert f.limits()["slow.example"] == {"delay": 5.0, "concurrency": 2, "source": "c"}
    # An override from the settings (FRONTIER_HOST_LIMITS) keeps its other limit too.
    f.set_limits({"fast.example": Limits(delay=1, concurrency=4)}, source="s")
    assert cli(redis_url, "politeness", "shop", "fast.example", "--delay", "2").returncode == 0
    assert f.limits()["fast.example"] == {"delay": 2.0, "concurrency": 4, "source": "c"}
    # Hosts as an operator may paste them.
    named = cli(redis_url, "politeness", "shop", "http://Slow.Example:8080/p?q=1", "--delay", "3")
    assert named.returncode == 0 and "politeness key 'slow.example'" in named.stderr
    assert cli(redis_url, "politeness", "shop", "SLOW.example:8080", "--delay", "4").returncode == 0
    assert f.limits()["slow.example"]["delay"] == 4.0
    assert not [k for k in f.limits() if ":" in k or "/" in k], f.limits()
    # One bad host: nothing changed, not even the good one before it.
    refused = cli(redis_url, "politeness", "shop", "ok.example", "", "--delay", "1")
    assert refused.returncode == 2 and "names no host" in refused.stderr
    assert "ok.example" not in f.limits()
    typo = cli(redis_url, "politeness", "shop", "slow.exmaple", "--delay", "1")
    assert typo.returncode == 0
    assert "no request of shop has had the politeness key 'slow.exmaple'" in typo.stderr


def test_politeness_clear_lifts_a_block_backoff_and_crawl_delay_whoever_wrote_them(
        redis, redis_url):
    """A node credential could block a site for 317 years (a raw script call with
    its own bound, or an HSET of the state) and no command cleared it. `--clear`
    clears everything about the host but its requests in flight: override,
    block, backoff, crawl delay; the host is crawled again at once."""
    from crawlproject.frontier.sitelimits import Limits, PolitenessConfig

    f = Frontier(redis, "shop", "n1",
                 politeness=PolitenessConfig(default=Limits(delay=0, concurrency=4)))
    batch = Batch()
    for host in ("raw.example", "hset.example"):
        for i in range(3):
            batch.add(f'{{"url": "http://{host}/{i}"}}', None, 0, 0, host)
    f.sync(batch)
    forger = Frontier(redis, "shop", "x", politeness=PolitenessConfig(
        default=Limits(delay=0, concurrency=4), retry_after_max=10**10, backoff_max=10**10))
    said = Batch()
    said.block("raw.example", 10**10)              # 317 years, as the call asks
    said.crawl_delay("raw.example", 10**10)
    forger.sync(said)
    now_ms = int(time.time() * 1000)
    far = now_ms + 317 * 365 * 86_400_000
    redis.hset(f.keys.kstate, "hset.example", f"0|{far}|{far}|{far}|{far}|999")
    redis.zadd(f.keys.ready, {"hset.example": far})
    assert f.sync(Batch(take=10)).taken == []
    assert cli(redis_url, "politeness", "shop", "hset.example", "--delay", "1").returncode == 0
    done = [cli(redis_url, "politeness", "shop", host, "--clear")
            for host in ("raw.example", "hset.example")]
    assert [d.returncode for d in done] == [0, 0]
    taken = f.sync(Batch(take=10)).taken
    assert sorted({m.partition("@")[2] for m, _ in taken}) == ["hset.example", "raw.example"]
    shown = json.loads(cli(redis_url, "politeness", "shop", "--json").stdout)["hosts"]
    for host in ("raw.example", "hset.example"):
        row = shown[host]
        assert (row["blocked_until_ms"], row["backoff_ms"], row["crawl_delay_ms"]) == (0, 0, 0)
        assert row["last_start_ms"] <= int(time.time() * 1000) and row["limits"] is None
    assert all("its block, backoff and crawl delay" in d.stdout for d in done)


def test_politeness_and_status_survive_malformed_records_in_redis(redis, redis_url):
    # Anyone who can write to Redis can leave junk in the state and limits
    # hashes: the other hosts are still shown, the junk is named on stderr.
    f = Frontier(redis, "shop", "n1")
    batch = Batch(take=1)
    batch.add('{"url": "http://good.example/1"}', None, 0, 0, "good.example")
    f.sync(batch)
    redis.hset(f.keys.kstate, "junk.example", "not|a|state")
    redis.hset(f.keys.limits, "junk.example", "5000")
    for args in (("politeness", "shop", "--json"), ("status", "shop", "--json")):
        shown = cli(redis_url, *args)
        assert shown.returncode == 0, shown.stderr
        assert "good.example" in shown.stdout and "junk.example" in shown.stderr
    assert "good.example" in cli(redis_url, "politeness", "shop").stdout
    # A value the scripts do not read as a limit is neither shown nor merged back.
    redis.hset(f.keys.limits, "odd.example", "-5|+1|c")
    assert "odd.example" not in json.loads(
        cli(redis_url, "politeness", "shop", "--json").stdout)["hosts"]
    assert cli(redis_url, "politeness", "shop", "odd.example", "--concurrency", "2").returncode == 0
    assert f.limits()["odd.example"] == {"delay": None, "concurrency": 2, "source": "c"}


def test_status_survives_junk_counters_and_node_deadlines(redis, redis_url):
    """A counter that is not a count, or a node registered with an infinite
    deadline (anyone who can write to Redis), made `crawlctl status` die with a
    traceback (int() of the value)."""
    f = Frontier(redis, "shop", "n1")
    f.sync(Batch())
    redis.hset(f.keys.stats, mapping={"dead_trimmed": "junk", "keys_pruned": "2"})
    redis.zadd(f.keys.nodes, {"ghost": float("inf")})
    for args in (("status", "shop", "--json"), ("status", "shop")):
        shown = cli(redis_url, *args)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    totals = json.loads(cli(redis_url, "status", "shop", "--json").stdout)["totals"]
    assert totals["keys_pruned"] == 2 and "dead_trimmed" not in totals


# Every subcommand that talks to Redis (spool-replay, which needs MongoDB first: below).
REDIS_COMMANDS = [
    ["status", "shop"], ["status", "shop", "--json"], ["status"],
    ["seed", "shop", "http://127.0.0.1/x"],
    ["dead", "shop"], ["dead", "list", "shop"], ["dead", "requeue", "shop"],
    ["dead", "purge", "shop", "--yes"], ["invalid", "shop"], ["invalid", "purge", "shop", "--yes"],
    ["invalid-seeds", "shop"], ["invalid-seeds", "purge", "shop", "--yes"], ["replay", "shop"],
    ["reset", "shop", "--yes"], ["politeness", "shop"], ["politeness", "shop", "h", "--delay", "1"],
    ["proxies", "shop"], ["proxies", "shop", "--revive", "127.0.0.1:1"], ["nodes", "shop"],
    ["pause", "shop"], ["resume", "shop"], ["drain", "shop"], ["stop", "shop"]]


def _all_commands(url, *extra):
    # One after the other: cli() captures this process's stdout and stderr.
    return [(args, cli(url, *extra, *args)) for args in REDIS_COMMANDS]


def _one_line_errors(results, expected: str):
    for args, out in results:
        lines = [line for line in out.stderr.strip().splitlines()
                 if not line.startswith("note: ")]  # `seed` of a spider not in this project
        assert out.returncode == 1 and len(lines) == 1, (args, out.stdout, out.stderr)
        assert lines[0].startswith("error: Redis at redis://") and expected in lines[0], args
        assert "topsecret" not in out.stdout + out.stderr, args


def test_every_subcommand_says_in_one_line_that_redis_refuses_the_password(tmp_path,
                                                                            mongo_uri):
    from devtools.services import RedisServer

    spool = ["spool-replay", "--spider", "shop", "--mongo-uri", mongo_uri, "--database",
             "cli_spool", "--spool-dir", str(tmp_path / "spool")]
    with RedisServer(password="rightpass", data_dir=tmp_path) as server:
        wrong = _all_commands(f"redis://:topsecret@127.0.0.1:{server.port}/0")
        missing = _all_commands(f"redis://127.0.0.1:{server.port}/0")
        wrong.append((spool, cli(f"redis://:topsecret@127.0.0.1:{server.port}/0", *spool)))
    _one_line_errors(wrong, "AuthenticationError: invalid username-password pair")
    _one_line_errors(missing, "AuthenticationError: Authentication required")


def test_every_subcommand_says_in_one_line_that_a_cluster_is_unreachable(tmp_path):
    """--cluster: redis-py's cluster errors are not RedisErrors (they were tracebacks)."""
    from devtools.services import RedisServer, free_port

    down = _all_commands(f"redis://:topsecret@127.0.0.1:{free_port()}/0", "--cluster")
    _one_line_errors(down, "Redis Cluster cannot be connected")
    with RedisServer(data_dir=tmp_path) as server:  # not a cluster node
        plain = _all_commands(f"redis://127.0.0.1:{server.port}/0", "--cluster")
    _one_line_errors(plain, "Cluster mode is not enabled on this node")


def test_every_subcommand_works_on_a_redis_cluster_across_partitions(redis_cluster):
    """A frontier of 3 partitions spread over 3 masters: the commands see all of them."""
    from crawlproject.keys import FrontierKeys

    client = redis_cluster.client()
    url = redis_cluster.url
    client.hset(FrontierKeys("shop").config, "partitions", 3)
    parts = [Frontier(client, "shop", "n1", partition=p, partitions=3) for p in range(3)]
    masters = {client.get_node_from_key(f.keys.dead).name for f in parts}
    assert len(masters) >= 2  # else this test would not show anything about a cluster
    from crawlproject.frontier.sitelimits import partition_of

    # one host of each partition (a replayed dead letter goes to its URL's own)
    hosts = {}
    for i in range(1, 255):
        hosts.setdefault(partition_of(f"127.0.0.{i}", 3), f"127.0.0.{i}")
    for p, f in enumerate(parts):
        batch = Batch()
        batch.add(json.dumps({"url": f"http://{hosts[p]}/x"}), bytes([p]) * 20, 0,
                  key=hosts[p])
        batch.take = 1
        member = f.sync(batch).taken[0][0]
        dead = Batch()
        dead.fail(member, "dead", {"payload": json.dumps({"url": f"http://{hosts[p]}/x"}),
                                   "priority": 0, "url": f"http://{hosts[p]}/x",
                                   "reason": f"HTTP 50{p}", "attempts": 3})
        f.sync(dead)
    try:
        status = json.loads(cli(url, "--cluster", "status", "shop", "--json").stdout)
        assert status["frontier"]["dead"] == 3, status["frontier"]
        listed = cli(url, "--cluster", "dead", "list", "shop")
        assert sorted(json.loads(line)["reason"] for line in listed.stdout.splitlines()) == [
            "HTTP 500", "HTTP 501", "HTTP 502"]
        assert "replayed 3 dead letter(s)" in cli(url, "--cluster", "dead", "requeue",
                                                  "shop").stdout
        assert sum(f.counts()["delayed"] + f.counts()["queued"] for f in parts) == 3
        assert cli(url, "--cluster", "seed", "shop", "http://127.0.0.1/s").returncode == 0
        for args in REDIS_COMMANDS:
            out = cli(url, "--cluster", *args)
            assert out.returncode == 0, (args, out.stdout, out.stderr)
        for args in (["seed", "shop", "http://127.0.0.1/t"], ["reset", "shop", "--yes"]):
            assert cli(url, "--cluster", *args).returncode == 0
        left = [k for node in client.get_primaries()
                for k in client.get_redis_connection(node).scan_iter("*shop*")]
        assert left == [], left
    finally:
        client.close()


def test_dead_and_invalid_take_list_requeue_purge_words(redis, redis_url):
    from crawlproject.keys import FrontierKeys

    keys = FrontierKeys("shop")
    record = {"payload": '{"url": "http://127.0.0.1/x"}', "priority": 0,
              "url": "http://127.0.0.1/x", "reason": "HTTP 503", "attempts": 3}
    redis.rpush(keys.dead, json.dumps({**record, "member": "m1"}))
    redis.rpush(keys.invalid, '{"member": "m", "error": "bad"}')
    assert json.loads(cli(redis_url, "dead", "list", "shop").stdout)["reason"] == "HTTP 503"
    assert cli(redis_url, "dead", "purge", "shop").returncode == 2          # needs --yes
    contradiction = cli(redis_url, "dead", "requeue", "shop", "--purge", "--yes")
    assert contradiction.returncode == 2 and "--purge contradicts 'requeue'" in contradiction.stderr
    assert redis.llen(keys.dead) == 1
    assert "replayed 1 dead letter(s)" in cli(redis_url, "dead", "requeue", "shop").stdout
    assert redis.llen(keys.dead) == 0
    assert json.loads(cli(redis_url, "invalid", "list", "shop").stdout)["error"] == "bad"
    assert "purged 1 invalid payload(s)" in cli(redis_url, "invalid", "purge", "shop",
                                                 "--yes").stdout
    bad = cli(redis_url, "dead", "requeu", "shop")
    assert bad.returncode == 2 and "invalid choice: 'requeu'" in bad.stderr


def test_status_without_a_spider_shows_every_spider_with_state(redis, redis_url):
    from crawlproject.keys import FrontierKeys

    empty = cli(redis_url, "status", "--json")
    assert empty.returncode == 0 and "no crawl state" in empty.stdout and "products" in empty.stdout
    redis.lpush(start_urls_key("products"), "http://127.0.0.1/")
    redis.rpush(FrontierKeys("products").dead, json.dumps({"url": "http://127.0.0.1/d"}))
    redis.rpush(FrontierKeys("not_in_project").dead, "{}")      # not a spider of this project
    out = cli(redis_url, "status", "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert out.returncode == 0 and [r["spider"] for r in rows] == ["products"], out.stdout
    assert rows[0]["seeds"]["waiting"] == 1 and rows[0]["frontier"]["dead"] == 1
    assert rows[0] == {**json.loads(cli(redis_url, "status", "products", "--json").stdout),
                       "at": rows[0]["at"]}
    table = cli(redis_url, "status")
    assert table.returncode == 0 and "products on redis://" in table.stdout


def test_status_and_politeness_read_many_hosts_without_one_command_over_them_all(
        redis, redis_url):
    """`status` (and the dashboard, which reads it every few seconds) counted
    hosts with HKEYS of the state hash, and `politeness` read it with HGETALL
    plus two round trips a host: at a million hosts each look blocked Redis,
    every node's calls included, for about 250 ms. Now the count is O(1) and
    the table is read in HSCAN windows keeping the most queued hosts; both are
    exact. Redis' slow log, set to log every command, shows what was sent."""
    from crawlproject.frontier.sitelimits import UNLIMITED, Limits, PolitenessConfig

    f = Frontier(redis, "shop", "n1",
                 politeness=PolitenessConfig(default=Limits(delay=60, concurrency=1)))
    hosts = [f"h{i}.example" for i in range(3000)]
    for start in range(0, len(hosts), 500):
        batch = Batch()
        for host in hosts[start:start + 500]:
            batch.add(f'{{"url": "http://{host}/"}}', None, 0, 0, host)
        f.sync(batch)
    big = Batch()
    for name, count in (("big1.example", 6), ("big2.example", 5), ("big3.example", 4)):
        for i in range(count):
            big.add(f'{{"url": "http://{name}/{i}"}}', None, 0, 0, name)
    f.sync(big)
    taken = 0
    while taken < 3003:                                   # a state per host: one lease each
        got = len(f.sync(Batch(take=500)).taken)
        assert got, taken
        taken += got
    f.set_limits({"h5.example": Limits(delay=2), "nostate.example": Limits(delay=3)})
    f.sync(Batch(maintenance=True))                       # bookkeeping fields written
    assert redis.hexists(f.keys.kstate, "|h5.example")    # a mirror: not a host
    assert f.host_count() == 3003

    redis.config_set("slowlog-log-slower-than", 0)
    redis.config_set("slowlog-max-len", 100_000)
    redis.slowlog_reset()
    status = json.loads(cli(redis_url, "status", "shop", "--json").stdout)
    assert status["frontier"]["hosts"] == 3003
    shown = cli(redis_url, "politeness", "shop", "--json", "-n", "3")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert list(data["hosts"]) == ["big1.example", "big2.example", "big3.example"]
    assert [r["queued"] for r in data["hosts"].values()] == [5, 4, 3]
    assert data["hosts_total"] == 3004                    # and the override with no state
    table = cli(redis_url, "politeness", "shop", "-n", "2").stdout
    assert "big2.example" in table and "big3.example" not in table and "3004" in table
    named = json.loads(cli(redis_url, "politeness", "shop", "nostate.example", "h5.example",
                           "--json").stdout)["hosts"]
    assert named["nostate.example"] == {"limits": {"delay": 3.0, "concurrency": UNLIMITED,
                                                   "source": "c"}}
    assert named["h5.example"]["inflight"] == 1 and named["h5.example"]["limits"]["delay"] == 2.0
    sent = [[_text(a) for a in entry["command"].split()[:2]]
            if isinstance(entry["command"], (str, bytes)) else entry["command"][:2]
            for entry in redis.slowlog_get(100_000)]
    redis.config_set("slowlog-log-slower-than", 10_000)
    whole = [c for c in sent if c and _text(c[0]).lower() in ("hkeys", "hgetall", "hvals")
             and _text(c[1]).endswith(":kstate")]
    assert not whole, whole[:3]
    assert any(_text(c[0]).lower() == "hscan" for c in sent if c)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize("stored", ["1000000000", "-3", "x"])
def test_a_junk_partition_count_in_redis_is_a_clear_error(redis, redis_url, stored):
    """Whoever can write to Redis could set the crawl's partition count to a
    billion: the command line would have built a billion partition objects."""
    from crawlproject.keys import FrontierKeys

    redis.hset(FrontierKeys("shop").config, "partitions", stored)
    for args in (("status", "shop", "--json"), ("politeness", "shop")):
        out = cli(redis_url, *args)
        assert out.returncode == 2 and "unreadable partition count" in out.stderr, out


def test_dead_requeue_of_a_full_list_keeps_every_redis_call_short(redis, redis_url):
    """10,000 of a 100,000-record dead list requeued in bounded calls: no Redis
    command (script call) slower than 50 ms in SLOWLOG. The old script removed
    each record with LREM from the head (records are taken from the tail): one
    call of ~1.9 s per 1,000 records, ~19 s for 10,000, past the lease TTL."""
    from crawlproject.keys import FrontierKeys

    keys = FrontierKeys("shop")
    pipe = redis.pipeline(transaction=False)
    for i in range(100_000):
        pipe.lpush(keys.dead, json.dumps({
            "payload": json.dumps({"url": f"http://127.0.0.1/p{i}"}), "priority": 0,
            "url": f"http://127.0.0.1/p{i}", "member": f"0:{i}@127.0.0.1",
            "reason": "HTTP 503", "attempts": 3}))
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    old = redis.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis.config_set("slowlog-log-slower-than", 50_000)   # microseconds
    # Up to three rounds of 10,000: a loaded machine may stall Redis itself for
    # one call now and then, but a slow script is slow in every round (the old
    # one in each of its calls).
    rounds = []
    try:
        for _ in range(3):
            redis.slowlog_reset()
            out = cli(redis_url, "dead", "requeue", "shop", "-n", "10000")
            assert "replayed 10000 dead letter(s)" in out.stdout, (out.stdout, out.stderr)
            rounds.append([(e["duration"], e["command"][:80]) for e in redis.slowlog_get(128)])
            if not rounds[-1]:
                break
    finally:
        redis.config_set("slowlog-log-slower-than", old)
    assert rounds[-1] == [], rounds
    assert redis.llen(keys.dead) == 100_000 - 10_000 * len(rounds)
    # the oldest (the tail) went first
    assert json.loads(redis.lindex(keys.dead, -1))["member"] == f"0:{10_000 * len(rounds)}@127.0.0.1"


NEIGHBOURS_REFUSED = ("shop:1", "shop:2024", "shop*", "sh{op}", "shop[1]", "shop\\x", "shop?")


def test_spider_names_that_collide_with_partition_tags_are_refused_and_reset_is_exact(
        redis, redis_url):
    """``reset shop`` deleted the state of spiders ``shop:1`` and ``shop:2024``: their
    keys ``{shop:1}:...`` are the keys of shop's partition 1. Names with ``:``,
    braces or glob characters are refused where keys are built (and by every
    command); neighbours with allowed names (``shop2``) keep their state, and so
    do keys a refused name left behind that no partition of shop can have."""
    from crawlproject.keys import FrontierKeys

    for name in NEIGHBOURS_REFUSED:
        with pytest.raises(ValueError, match="spider name"):
            FrontierKeys(name)
        for args in (["reset", name, "--yes"], ["seed", name, "http://127.0.0.1/a"],
                     ["status", name], ["pause", name]):
            out = cli(redis_url, *args)
            assert out.returncode == 2 and "spider name" in out.stderr, (args, out.stderr)
    assert redis.keys("*") == []          # nothing written for a refused name
    for name in ("shop", "shop2"):
        Frontier(redis, name, "n1").sync(_one_entry(name))
        redis.lpush(start_urls_key(name), "http://127.0.0.1/s")
    left_behind = [b"{shop*}:dead", b"{shop:1:2}:dead", b"{shop:x}:dead", b"{shop:1x}:dead"]
    for key in left_behind:            # as an older version let such spiders write them
        redis.rpush(key, "x")
    theirs = {k for k in redis.keys("*") if b"shop2" in k} | set(left_behind)
    out = cli(redis_url, "reset", "shop", "--yes")
    assert out.returncode == 0, out.stderr
    assert set(redis.keys("*")) == theirs


def _one_entry(name: str) -> Batch:
    batch = Batch()
    batch.add(json.dumps({"url": f"http://127.0.0.1/{name}"}), b"\x01" * 20, 0, key="127.0.0.1")
    return batch


HOSTILE = ("[/]", "[bold red]x", "\x1b[2J", "\x07", "a[/b]\x1b]0;title\x07")


def test_status_and_politeness_print_redis_strings_as_plain_text(redis, redis_url):
    """A node id or host holding ``[/]`` crashed `status` and `politeness` with a
    rich MarkupError; other markup was interpreted and escape sequences reached
    the terminal raw. Now every string read from Redis is shown as text, with no
    control character, through one helper (``terminal_text``)."""
    import time

    from crawlproject.control import node_reports_key
    from crawlproject.keys import FrontierKeys

    f = Frontier(redis, "shop", "n1")
    batch = Batch()
    for i, bad in enumerate(HOSTILE):
        batch.add(json.dumps({"url": f"http://127.0.0.1/{i}"}), bytes([i + 1]) * 20, 0,
                  key=f"h{bad}")
    batch.take = len(HOSTILE)   # each host gets its politeness state
    f.sync(batch)
    now = int(time.time() * 1000)
    redis.hset(node_reports_key("shop"), mapping={
        f"n{bad}": json.dumps({"at": now, "pages": 1, "state": f"run{bad}"}) for bad in HOSTILE})
    redis.hset(FrontierKeys("shop").stats, "x[/]\x1b[31m", 1)
    redis.hset(FrontierKeys("shop").config, "partitions", 1)
    for args in (["status", "shop"], ["politeness", "shop"]):
        out = cli(redis_url, *args)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr)
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout, (args, out.stdout)
        assert "[/]" in out.stdout and "[bold red]x" in out.stdout, (args, out.stdout)
    status = cli(redis_url, "status", "shop").stdout
    assert "n[/]" in status and "x[/]" in status


def test_terminal_text_removes_sequences_and_escapes_markup():
    from rich.console import Console

    from crawlproject.cli.common import terminal_text

    console = Console(record=True, width=200, force_terminal=False)
    for bad in HOSTILE:
        console.print(terminal_text(bad))
    shown = console.export_text()
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown.splitlines()[:2] == ["[/]", "[bold red]x"]
    assert "0;title" not in shown                        # the OSC sequence went whole
    assert len(terminal_text("x" * 10_000)) < 300         # bounded


# -- dead letters read back: keys from the URL, junk shown or skipped (issue 45) ----

def _key_of():
    from crawlproject.ops.actions import politeness_key_function
    from crawlproject.ops.common import current_project

    return politeness_key_function(current_project()[0])


def test_a_requeued_dead_letter_is_keyed_by_its_url_not_by_its_record(redis, redis_url):
    """A dead letter whose ``key`` said ``|127.0.0.1`` was requeued under it: its
    state went into kstate's field ``|127.0.0.1``, the mirror of that host's
    override, and the nodes applied it (while crawlctl politeness showed the
    old limits). The key is the one the nodes compute from the payload's URL;
    a record without a usable URL is reported and kept; a signed payload goes
    back byte for byte (its proof covers its attempt counters)."""
    from crawlproject.frontier.sitelimits import Limits, PolitenessConfig
    from crawlproject.keys import FrontierKeys
    from crawlproject.signing import Signer

    keys = FrontierKeys("shop")
    assert cli(redis_url, "politeness", "shop", "127.0.0.1", "--delay", "5",
               "--concurrency", "1").returncode == 0
    mirror = redis.hget(keys.kstate, "|127.0.0.1")
    signed = Signer([b"s" * 16], "shop").sign(json.dumps(
        {"url": "http://127.0.0.1/signed", "meta": {"retry_times": 2}}))
    records = [
        {"payload": json.dumps({"url": "http://127.0.0.1/x"}), "key": "|127.0.0.1",
         "member": "0:1@|127.0.0.1", "priority": 0, "reason": "HTTP 503"},
        {"payload": signed, "key": "|127.0.0.1", "priority": 2},
        {"payload": json.dumps({"url": "file:///etc/passwd"}), "key": "127.0.0.1"},
        {"payload": json.dumps({"no": "url"}), "key": "127.0.0.1"},
    ]
    redis.lpush(keys.dead, *(json.dumps(r) for r in records))
    out = cli(redis_url, "dead", "requeue", "shop")
    assert out.returncode == 0, out.stderr
    assert "replayed 2 dead letter(s)" in out.stdout
    assert "kept 2 dead letter(s)" in out.stderr and "2 × payload has no usable URL" in out.stderr
    members = [m.decode() for m in redis.zrange(keys.delayed, 0, -1)]
    assert sorted(m.partition("@")[2] for m in members) == ["127.0.0.1", "127.0.0.1"]
    stored = {redis.hget(keys.payloads, m).decode() for m in members}
    assert signed in stored                                     # byte for byte
    assert json.dumps({"url": "http://127.0.0.1/x"}) in stored
    assert redis.llen(keys.dead) == 2
    # A node's next call queues them: the host's override is untouched.
    f = Frontier(redis, "shop", "n1", politeness=PolitenessConfig(default=Limits(0, 8)))
    taken = f.sync(Batch(take=10)).taken
    assert len(taken) == 1                                       # concurrency 1, delay 5 s
    assert redis.hget(keys.kstate, "|127.0.0.1") == mirror
    assert f.limits()["127.0.0.1"] == {"delay": 5.0, "concurrency": 1, "source": "c"}
    mirrors = [k for k in redis.hkeys(keys.kstate) if k[:1] == b"|" and k[:2] != b"||"]
    assert mirrors == [b"|127.0.0.1"]


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)
_urls = st.one_of(st.sampled_from([
    "http://127.0.0.1/a", "https://Shop.Example:8443/p?q=1", "http://|127.0.0.1/",
    "http://[::1]/", "http://[::1/", "file:///etc/passwd", "http://", "javascript:x", "",
    "http://xn--bcher-kva.example/", "http://bücher.example/"]), st.text(max_size=20))


def _signed(data):
    from crawlproject.signing import Signer
    return Signer([b"k" * 16], "shop").sign(data)


_payloads = st.one_of(
    st.builds(lambda url, meta: json.dumps({"url": url, "meta": meta}), _urls, _json),
    st.builds(lambda url: _signed(json.dumps({"url": url, "meta": {"retry_times": 1}})), _urls),
    st.builds(lambda junk: "~1" + "A" * 22 + ":" + junk, st.text(max_size=20)),
    _json.map(json.dumps), st.text(max_size=30), _json,
    st.just(json.dumps({"url": "http://127.0.0.1/big", "pad": "x" * 2_000_000})))
_records = st.one_of(
    st.binary(max_size=40), st.text(max_size=40).map(lambda t: t.encode("utf-8", "replace")),
    _json.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda d: json.dumps(d).encode(), st.fixed_dictionaries({}, optional={
        "payload": _payloads, "priority": _json | st.integers(min_value=-10**30,
                                                               max_value=10**30),
        "key": st.sampled_from(["|127.0.0.1", "127.0.0.1", ""]) | _json,
        "member": st.text(max_size=20) | _json, "url": _urls | _json, "reason": _json,
        "attempts": _json, "huge": st.just("y" * 300_000)})),
    st.just(b"[" * 100_000 + b"]" * 100_000), st.just(b"1" * 5000))


@hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=st.lists(_records, min_size=1, max_size=6))
def test_dead_and_requeue_show_or_skip_every_record_and_never_crash(redis, redis_url, records):
    """Fuzz: any record in the dead list (not JSON, JSON of any shape, wrong
    types, huge values). `crawlctl dead` prints one JSON line per record, shown
    or `unreadable` with the reason; `dead requeue` never crashes, replays only
    records with a usable URL, each under the key the nodes compute from it,
    signed payloads byte for byte, and keeps (and names) every other one."""
    from crawlproject.keys import FrontierKeys

    redis.flushall()
    keys = FrontierKeys("shop")
    redis.rpush(keys.dead, *records)
    listed = cli(redis_url, "dead", "shop", "-n", "100")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(lines) == len(records) and all(isinstance(line, dict) for line in lines)
    assert max(len(line) for line in listed.stdout.splitlines()) < 100_000
    out = cli(redis_url, "dead", "requeue", "shop")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    from crawlproject.frontier.deadletters import read_record

    key_of = _key_of()
    expected = {}
    for raw in records:
        letter = read_record(raw)
        if letter.problem is None:
            try:
                key = key_of(letter.url, letter.data)
            except Exception:  # noqa: BLE001
                continue
            if key:
                expected.setdefault(raw, []).append((key, letter.payload))
    left = redis.lrange(keys.dead, 0, -1)
    assert sorted(left) == sorted(r for r in records if r not in expected)
    members = [m.decode() for m in redis.zrange(keys.delayed, 0, -1)]
    assert len(members) == sum(len(v) for v in expected.values())
    want = sorted(k for v in expected.values() for k, _ in v)
    assert sorted(m.partition("@")[2] for m in members) == want
    assert not any(m.partition("@")[2].startswith("|") for m in members)
    stored = [redis.hget(keys.payloads, m).decode() for m in members]
    for v in expected.values():
        for _, payload in v:
            if payload.startswith("~1"):
                assert payload in stored
    assert f"replayed {len(members)} dead letter(s)" in out.stdout


def test_crawlctl_uses_the_redis_the_projects_settings_name(redis, redis_url, tmp_path):
    """Issue 48: `crawlctl seed` went to $REDIS_URL (or 127.0.0.1:6379) while the
    project's settings.py named another Redis. Now one rule, as the nodes have it:
    --redis-url, else the project's setting, else the environment, else the default.
    Two user projects (the README's block pasted), crawlctl run in each directory as a
    process: one names the session's Redis (a free port, not 6379) only in settings.py,
    under an environment that names a dead port; the other sets nothing, and the
    environment names the session's Redis."""
    from tests.crawl_helpers import ROOT, user_project

    pinned = user_project(tmp_path / "pinned", "pinnedproj", "",
                          f"REDIS_URL = {redis_url!r}\n")
    plain = user_project(tmp_path / "plain", "plainproj", "")
    base = {k: v for k, v in os.environ.items() if k not in ("SCRAPY_SETTINGS_MODULE",
                                                              "REDIS_URL", "REDIS_HOST",
                                                              "REDIS_PORT")}
    base["PYTHONPATH"] = str(ROOT)
    runs = [subprocess.Popen([sys.executable, "-m", "crawlproject.cli", "seed", spider,
                              f"http://127.0.0.1/{spider}"], cwd=project,
                             env={**base, "REDIS_URL": env_url}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for project, spider, env_url in ((pinned, "pinned", "redis://127.0.0.1:1/0"),
                                             (plain, "plain", redis_url))]
    said = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, out + err
        said.append(out)
    # each says which Redis it used and why
    assert f"pushed 1 seed(s) to pinned:start_urls on {redis_url} (REDIS_URL of " \
           "pinnedproj.settings)" in said[0], said[0]
    assert f"pushed 1 seed(s) to plain:start_urls on {redis_url} ($REDIS_URL)" in said[1], said
    assert redis.lrange(start_urls_key("pinned"), 0, -1) == [b"http://127.0.0.1/pinned"]
    assert redis.lrange(start_urls_key("plain"), 0, -1) == [b"http://127.0.0.1/plain"]
    # --redis-url wins over both (here: a dead port, and the command says where it went)
    flag = subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url",
                           "redis://127.0.0.1:1/0", "seed", "pinned", "http://127.0.0.1/x"],
                          cwd=pinned, env=base, capture_output=True, text=True, timeout=120)
    assert flag.returncode == 1 and "Redis at redis://127.0.0.1:1/0" in flag.stderr, flag.stderr
    assert redis.llen(start_urls_key("pinned")) == 1


def test_status_watch_without_a_terminal_prints_frames(redis, redis_url):
    """Issue 48: `status --watch` printed nothing into a pipe (rich's live display
    draws only on a terminal). Each frame under a line with the time; with
    --json one object a line; --count stops it."""
    redis.lpush(start_urls_key("shop"), "http://127.0.0.1/a")
    out = cli(redis_url, "status", "shop", "--watch", "--interval", "0.01", "--count", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("--- shop at ") == 3, out.stdout
    assert out.stdout.count("seeds waiting") == 3, out.stdout
    lines = cli(redis_url, "status", "shop", "--watch", "--json", "--interval", "0.01",
                "--count", "2").stdout.splitlines()
    assert [json.loads(line)["seeds"]["waiting"] for line in lines] == [1, 1]
    assert cli(redis_url, "status", "shop", "--watch", "--count", "0").returncode == 2


def test_status_shows_both_tiers_per_partition_and_the_largest_backlogs(redis, redis_url):
    """Issue 49: queued in Redis (``||qlen``, through a real SYNC) and in
    MongoDB (``||backlog``), the moves waiting and the oldest one's wait, per
    partition, and the ten largest backlogs over all partitions, read from
    Redis' bookkeeping alone (no MongoDB runs here: none is counted)."""
    from crawlproject.keys import FrontierKeys
    from crawlproject.dashboard import render

    redis.hset(FrontierKeys("shop").config, "partitions", 2)
    parts = [Frontier(redis, "shop", "n1", partition=p, partitions=2) for p in range(2)]
    batch = Batch()
    for i in range(3):
        batch.add(json.dumps({"url": f"http://a.example/{i}"}), f"a{i}".encode(), 0,
                  key="a.example")
    assert parts[0].sync(batch).added == 3
    sec, usec = redis.time()
    now_ms = sec * 1000 + usec // 1000
    k0, k1 = parts[0].keys, parts[1].keys
    redis.hset(k0.kstate, "||backlog", 500)
    redis.zadd(k0.backlog, {"a.example": 300, "b.example": 200})
    redis.zadd(k0.moves, {"a.example": now_ms - 42_000, "c.example": now_ms - 1000})
    redis.hset(k1.kstate, "||backlog", 1200)
    redis.zadd(k1.backlog, {f"h{i}.example": 50 + i * 10 for i in range(12)})
    redis.zadd(k1.backlog, {"<b>big</b>.example": 400})
    data = json.loads(cli(redis_url, "status", "shop", "--json").stdout)
    b = data["backlog"]
    assert (b["queued_redis"], b["queued_mongodb"], b["moves_waiting"]) == (3, 1700, 2)
    assert 41 <= b["oldest_move_age_s"] <= 60
    assert [(r["partition"], r["queued_redis"], r["queued_mongodb"], r["moves_waiting"])
            for r in b["partitions"]] == [(0, 3, 500, 2), (1, 0, 1200, 0)]
    assert b["partitions"][1]["oldest_move_age_s"] is None
    assert [(r["key"], r["queued_mongodb"]) for r in b["largest"]] == [
        ("<b>big</b>.example", 400), ("a.example", 300), ("b.example", 200),
        *((f"h{i}.example", 50 + i * 10) for i in range(11, 4, -1))]
    # work in MongoDB alone is work left: not "finished" with nothing in Redis
    redis.delete(*redis.keys("{shop:0}:*"))
    assert json.loads(cli(redis_url, "status", "shop", "--json").stdout)["crawl"]["state"] \
        == "stopped"
    text = cli(redis_url, "status", "shop")
    assert text.returncode == 0, text.stderr
    assert "in MongoDB" in text.stdout and "largest backlogs" in text.stdout
    assert "0 / 1200" in text.stdout and "<b>big</b>.example" in text.stdout
    html = render.backlog_fragment(data)
    assert "&lt;b&gt;big&lt;/b&gt;.example" in html and "<b>big" not in html
    assert 'data-field="backlog.queued_mongodb">1,700<' in html


def test_reset_deletes_the_backlog_documents_and_refuses_when_mongodb_is_down(
        redis, redis_url, mongo_uri, mongo_db, monkeypatch):
    """Issue 49: entries spilled to the MongoDB-wire server by the real mover
    (status counts them from Redis) are deleted by ``reset``, another spider's
    kept. MongoDB not answering: reset says so and deletes nothing (Redis
    kept too), unless ``--keep-backlog``."""
    import asyncio

    from crawlproject import defaults
    from crawlproject.frontier.backlog import Backlog, BacklogConfig
    from devtools.services import free_port
    from tests.test_backlog_mover import KEY, fill, run

    fill(redis, 30)

    async def spill(movers):
        return (await (await movers.mover("n1")).spill(KEY, window=10)).spilled

    assert run(redis_url, mongo_uri, mongo_db.name, spill) == 20

    async def other_spider():
        backlog = Backlog.from_config(BacklogConfig(uri=mongo_uri, database=mongo_db.name),
                                      "other")
        await backlog.spill(0, KEY, [("0:1@" + KEY, 1, b"x")], epoch=1)
        await backlog.close()

    asyncio.run(other_spider())
    docs = mongo_db["frontier_backlog"]
    status = json.loads(cli(redis_url, "status", "shop", "--json").stdout)["backlog"]
    assert (status["queued_redis"], status["queued_mongodb"]) == (10, 20)
    assert status["largest"] == [{"key": KEY, "partition": 0, "queued_mongodb": 20}]
    # MongoDB does not answer (a closed port; the call's timeout made short)
    monkeypatch.setitem(defaults.DEFAULTS, "FRONTIER_BACKLOG_TIMEOUT", 1.0)
    down = f"mongodb://127.0.0.1:{free_port()}/"
    monkeypatch.setenv("MONGO_URI", down)      # (Redis' bookkeeping says: look there)
    monkeypatch.setenv("MONGO_DATABASE", mongo_db.name)
    refused = cli(redis_url, "reset", "shop", "--yes")
    assert refused.returncode == 1 and "does not answer" in refused.stderr, refused.stderr
    assert "--keep-backlog" in refused.stderr and "nothing deleted" in refused.stderr
    assert redis.exists("{shop}:backlog") and docs.count_documents({"s": "shop"}) == 20
    monkeypatch.setenv("MONGO_URI", mongo_uri)
    out = cli(redis_url, "reset", "shop", "--yes")
    assert out.returncode == 0, out.stderr
    assert "deleted 20 backlog document(s) of shop from MongoDB" in out.stdout, out.stdout
    assert docs.count_documents({"s": "shop"}) == 0 and docs.count_documents({}) == 1
    assert not list(redis.scan_iter("{shop}:*"))
    # no trace in Redis: MongoDB is not asked (it is down here) unless named
    fill(redis, 2)
    monkeypatch.setenv("MONGO_URI", down)
    assert cli(redis_url, "reset", "shop", "--yes", "--keep-seeds").returncode == 0
    assert cli(redis_url, "reset", "shop", "--yes", "--mongo-uri", down).returncode == 1
    # told to: Redis reset, the documents (here: none) left, said on stderr
    fill(redis, 2)
    kept = cli(redis_url, "reset", "shop", "--yes", "--mongo-uri", down, "--keep-backlog")
    assert kept.returncode == 0 and "left in MongoDB (--keep-backlog)" in kept.stderr
    assert not list(redis.scan_iter("{shop}:*"))
