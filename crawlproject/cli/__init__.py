"""``crawlctl`` (``python -m crawlproject.cli``): the operator's tool to seed,
inspect, control and reset a crawl's shared state, and to deploy to scrapyd.

This module holds the parser and :func:`main`; one module per command group,
what they read and do in :mod:`crawlproject.ops`. Commands, exit codes and where
the project and credentials come from: docs/frontier.md, "The command line".
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys

from crawlproject.cli.common import _spider_name, resolve_redis
from crawlproject.cli.control import cmd_control
from crawlproject.cli.dashboard import cmd_dashboard
from crawlproject.cli.functions import cmd_functions
from crawlproject.cli.dead import cmd_dead, cmd_invalid, cmd_invalid_seeds, cmd_replay
from crawlproject.cli.politeness import cmd_politeness
from crawlproject.cli.proxies import cmd_proxies
from crawlproject.cli.reset import cmd_reset
from crawlproject.cli.scrapyd import _add_target_options, cmd_deploy, cmd_jobs, cmd_schedule
from crawlproject.cli.seed import cmd_seed
from crawlproject.cli.status import cmd_nodes, cmd_status
from crawlproject.cli.storage import cmd_recrawl, cmd_spool_replay
from crawlproject.connection import redact_url
from crawlproject.ops.actions import CONTROL_COMMANDS
from crawlproject.ops.common import UsageError


#: action words of the list commands (the first is the default)
ACTIONS = {"dead": ("list", "requeue", "purge"), "invalid": ("list", "purge"),
           "invalid-seeds": ("list", "purge")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crawlctl",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="default: the project's REDIS_URL setting, else "
                        "$REDIS_URL, else redis://127.0.0.1:6379/0 (as the nodes read it)")
    parser.add_argument("--cluster", action="store_true",
                        help="REDIS_URL is a Redis Cluster (default: REDIS_CLUSTER, as for "
                             "REDIS_URL)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in [
        ("status", cmd_status, "queue, in-flight, delayed, dead, nodes, Bloom filter"),
        ("seed", cmd_seed, "check seeds as the nodes do, then push them to <spider>:start_urls"),
        ("dead", cmd_dead, "dead letters: list (reason, attempts), requeue (fresh retries) "
                           "or purge (with --yes)"),
        ("invalid", cmd_invalid, "payloads that were moved aside: list or purge (with --yes)"),
        ("invalid-seeds", cmd_invalid_seeds, "seeds that were moved aside, with the reason: "
                                             "list or purge (with --yes)"),
        ("replay", cmd_replay, "move dead letters back into the queue (= dead requeue)"),
        ("reset", cmd_reset, "delete the spider's queue, filter, seeds and seed claims"),
        ("politeness", cmd_politeness, "per-host politeness (limits, in flight, blocks); "
                                       "--delay/--concurrency HOST... change limits now"),
        ("proxies", cmd_proxies, "proxy pool: health, bans per domain, retired proxies "
                                 "(credentials masked); --revive ID brings one back"),
        ("nodes", cmd_nodes, "nodes' last reports: pages/s, items/s, errors, leases, state "
                             "(a table; --json: one object a line)"),
        ("pause", cmd_control, "every node stops taking requests and seeds (leases kept)"),
        ("resume", cmd_control, "undo pause / drain / stop"),
        ("drain", cmd_control, "take no more seeds, finish the frontier, then nodes close "
                               "(--then-clear: then back to run)"),
        ("stop", cmd_control, "nodes close now (leases back to the queue); nodes started "
                              "later wait until resume"),
    ]:
        p = sub.add_parser(name, help=help_)
        if name in ACTIONS:  # `dead [list|requeue|purge] SPIDER`
            p.add_argument("action", nargs="?", choices=ACTIONS[name],
                           help=f"default: list ({' | '.join(ACTIONS[name])})")
        if name in ("status", "nodes"):
            p.add_argument("spider", nargs="?", type=_spider_name,
                           help="default: every spider of this project with crawl state")
        else:
            p.add_argument("spider", type=_spider_name)
        p.set_defaults(func=func)
        if name == "seed":
            p.add_argument("seeds", nargs="*")
            p.add_argument("--file", help="one seed a line (URL or JSON); - reads standard "
                                          "input; bad lines are reported, the others pushed")
        if name == "status":
            p.add_argument("--json", action="store_true", help="one JSON object (stable keys; "
                                                               "with --watch, one a line)")
            p.add_argument("--watch", action="store_true",
                           help="refresh until Ctrl-C (not on a terminal: one frame after "
                                "another, each under a line with the time)")
            p.add_argument("--interval", type=float, default=2.0, help="--watch period (s)")
            p.add_argument("--count", type=int, help="--watch: stop after this many frames")
        if name == "nodes":
            p.add_argument("--json", action="store_true",
                           help="one JSON object a line (a node's report) instead of a table")
        if name in ("dead", "invalid", "invalid-seeds", "replay"):
            p.add_argument("-n", type=int, default=20 if name in ("invalid", "invalid-seeds")
                           else None, help="records shown (default 20) or requeued (1000)")
        if name in ("dead", "invalid", "invalid-seeds"):
            p.add_argument("--purge", action="store_true", help="delete them all (with --yes)")
            p.add_argument("--yes", action="store_true")
        if name == "politeness":
            p.add_argument("hosts", nargs="*", help="politeness keys (hosts) to show or change")
            p.add_argument("--delay", type=float, help="seconds between request starts")
            p.add_argument("--concurrency", type=int, help="most requests in flight")
            p.add_argument("--budget", type=int,
                           help="most new pages the host may queue from now on (0: none)")
            p.add_argument("--clear", action="store_true", help="back to the settings' limits")
            p.add_argument("--json", action="store_true")
            p.add_argument("-n", type=int, default=50, help="hosts shown (most queued first)")
        if name == "proxies":
            p.add_argument("--json", action="store_true")
            p.add_argument("--limit", type=int, default=50,
                           help="proxies shown, most troubled first (default 50)")
            p.add_argument("--all", action="store_true", help="show every proxy")
            p.add_argument("--revive", nargs="+", metavar="HOST:PORT",
                           help="take these retired proxies back into the pool")
        if name in CONTROL_COMMANDS:
            p.add_argument("--force", action="store_true", help="replace a control key of "
                           "the wrong type (nodes treat one as pause)")
        if name == "drain":
            p.add_argument("--then-clear", action="store_true",
                           help="once the drain is complete (nothing queued or leased, the "
                                "draining nodes closed), the state goes back to run by itself")
        if name == "reset":
            p.add_argument("--yes", action="store_true")
            p.add_argument("--keep-seeds", action="store_true")
            p.add_argument("--drop-spooled-items", action="store_true",
                           help="also delete items handed to Redis that are not in MongoDB yet")
            p.add_argument("--drop-proxy-pool", action="store_true",
                           help="also delete the operator's proxy list {spider}:proxies")
            p.add_argument("--mongo-uri", help="the frontier backlog's MongoDB (default: "
                           "MONGO_URI, setting then environment); given, its documents of "
                           "the spider are deleted even when Redis has no trace of them")
            p.add_argument("--database", help="default: MONGO_DATABASE (setting, then "
                           "environment)")
            p.add_argument("--keep-backlog", action="store_true",
                           help="reset Redis even when MongoDB does not answer, leaving the "
                                "spider's frontier backlog documents there (reset again "
                                "before the spider crawls again: they would meet its new "
                                "entries)")
    p = sub.add_parser("recrawl", help="make known pages due for a revisit now (conditional "
                       "requests; unchanged pages are not parsed again)")
    p.add_argument("spider")
    p.add_argument("--pattern", help="only pages whose URL this regular expression finds")
    p.add_argument("--now", action="store_true",
                   help="nodes look for due pages at once (else at their next check)")
    p.add_argument("--mongo-uri", help="default: MONGO_URI (setting, then environment)")
    p.add_argument("--database", help="default: MONGO_DATABASE (setting, then environment)")
    p.set_defaults(func=cmd_recrawl)
    p = sub.add_parser("functions", help="load this version's Redis functions library (Redis "
                       "7; the scripts on 6.2) on every master: nodes call only that code")
    p.add_argument("action", choices=("load",))
    p.set_defaults(func=cmd_functions)
    p = sub.add_parser("dashboard", help="live dashboard in the browser (127.0.0.1; any other "
                       "address needs DASHBOARD_TOKEN or DASHBOARD_USERNAME/_PASSWORD)")
    p.add_argument("spiders", nargs="*", help="spiders to show (default: the project's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9420, help="port (0: a free one, printed)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between reads of Redis")
    p.add_argument("--window", type=float, default=600.0, help="seconds the charts show")
    p.add_argument("--token-file", help="read the access token from this file "
                                        "(else $DASHBOARD_TOKEN; never on the command line)")
    p.set_defaults(func=cmd_dashboard)
    p = sub.add_parser("spool-replay", help="store the items a node left in its MongoDB spool "
                       "(no crawl); exit 0 when none is left")
    p.add_argument("--mongo-uri", help="default: MONGO_URI (setting, then environment)")
    p.add_argument("--database", help="default: MONGO_DATABASE (setting, then environment)")
    p.add_argument("--spool-dir", help="MONGO_SPOOL_DIR of the node (setting, then environment)")
    p.add_argument("--spider", help="also store the items nodes of this spider handed to Redis")
    p.set_defaults(func=cmd_spool_replay)
    p = sub.add_parser("deploy", help="build the project egg once and upload it to every "
                       "scrapyd target; exit 1 naming each target that refused")
    _add_target_options(p)
    p.add_argument("--version", help="default: <unix time>-<git commit>")
    p.add_argument("--egg", help="upload this egg instead of building one")
    p.set_defaults(func=cmd_deploy)
    p = sub.add_parser("schedule", help="start SPIDER on every scrapyd target")
    p.add_argument("spider")
    _add_target_options(p)
    p.add_argument("-s", "--set", action="append", metavar="NAME=VALUE",
                   help="a Scrapy setting for the job (repeatable)")
    p.add_argument("-a", "--arg", action="append", metavar="NAME=VALUE",
                   help="a spider argument (repeatable)")
    p.set_defaults(func=cmd_schedule)
    p = sub.add_parser("secret", help="print a new FRONTIER_SECRET: give the same one to "
                       "every node of a crawl, never to seeders")
    p.set_defaults(func=cmd_secret)
    p = sub.add_parser("jobs", help="pending, running and finished jobs of every scrapyd target")
    _add_target_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object per target")
    p.set_defaults(func=cmd_jobs)
    return parser


def cmd_secret(args) -> int:
    """A new random FRONTIER_SECRET (256 bits), on standard output only."""
    import secrets

    print(secrets.token_urlsafe(32))
    return 0


#: commands that never connect to Redis (no project settings read for it)
NO_REDIS = frozenset({"secret", "deploy", "schedule", "jobs"})

# crawlctl's optional packages (tables, scrapyd, dashboard), imported lazily.
OPS_PACKAGES = frozenset({"rich", "requests", "aiohttp"})


@contextlib.contextmanager
def _project_notice():
    """Show the INFO line of :mod:`crawlproject.project` (a command that needs a
    project and finds none uses the installed package's) on this call's stderr."""
    logger = logging.getLogger("crawlproject.project")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    from redis.exceptions import RedisClusterException, RedisError

    try:
        from crawlproject.scrapyd import ScrapydError
    except ModuleNotFoundError as exc:  # requests: the "ops" extra
        if exc.name not in OPS_PACKAGES:
            raise
        ScrapydError = type("ScrapydError", (Exception,), {})  # noqa: N806

    args = build_parser().parse_args(argv)
    where = args.redis_url = args.redis_url or ""
    try:
        with _project_notice():
            if args.command not in NO_REDIS:
                resolve_redis(args)
                where = redact_url(args.redis_url)
            return args.func(args)
    except ModuleNotFoundError as exc:
        if exc.name not in OPS_PACKAGES:
            raise
        print(f"error: crawlctl needs the ops extra ({exc.name} is missing): "
              "pip install '/path/to/checkout[ops]' (this package's checkout or wheel)",
              file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ScrapydError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # e.g. an http:// REDIS_URL
        print(f"error: {_redacted(str(exc), args.redis_url, where)}", file=sys.stderr)
        return 2
    except (RedisError, RedisClusterException) as exc:  # the cluster's is not a RedisError
        message = _redacted(str(exc), args.redis_url, where)
        print(f"error: Redis at {where}: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1


def _redacted(text: str, url: str, where: str) -> str:
    """*text* with the Redis URL (and its password) replaced by its redacted form."""
    return text.replace(url, where) if url else text
