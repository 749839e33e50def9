"""Helpers every command uses: text from Redis made safe for a terminal, the
Redis client, a spider's frontier, partitions and seed keys."""

from __future__ import annotations

import argparse
import os
import re
import time

from crawlproject.connection import redis_from_url
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import (
    SeedKeys,
    check_spider_name,
)
from crawlproject.ops.common import (UsageError, frontier_partitions, project_spider, seed_keys_of)


CONTROL_HINT = 1  # CONTROL_POLL_INTERVAL's default


# Terminal escape sequences: CSI (ESC [ ... or 0x9b), OSC (ESC ] ... BEL or
# ESC \, also unterminated), and any other ESC + one character.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?", re.DOTALL)


TERMINAL_TEXT_MAX = 200  # characters of one value read from Redis shown in a table


def terminal_text(value, limit: int = TERMINAL_TEXT_MAX) -> str:
    """*value* (read from Redis: untrusted) as rich markup that prints it as
    plain text: escape sequences removed, other control characters shown as
    ``?``, markup escaped, at most *limit* characters. Every value from Redis
    that the command line prints through rich goes through here."""
    from rich.markup import escape

    text = _ESCAPE_SEQUENCE.sub("", str(value))
    text = "".join(c if c.isprintable() else "?" for c in text)
    if len(text) > limit:
        text = text[:limit] + "…"
    return escape(text)


def resolve_redis(args) -> None:
    """Set ``args.redis_url``, ``args.cluster`` and ``args.redis_params`` by the
    one rule every component and tool follows: ``--redis-url`` (``--cluster``),
    else the project's setting (``REDIS_URL``, or scrapy-redis'
    ``REDIS_HOST``/``REDIS_PORT``; ``REDIS_CLUSTER``), else the environment
    variable of the same name, else the local default; ``REDIS_PARAMS`` from
    the project.

    The project is the one around the command (:func:`crawlproject.ops.common.current_project`:
    scrapy.cfg, ``SCRAPY_SETTINGS_MODULE``, else the installed package's
    settings). Its settings are read as a node reads them
    (:func:`crawlproject.defaults.setting`: the value of settings.py, else the
    environment, else the default, which is what the crawlproject add-on
    installs); other add-ons are not run (that would import the whole crawl
    stack for each command: 0.9 s).
    """
    from scrapy.utils.project import get_project_settings

    from crawlproject.connection import (redis_cluster_from_settings, redis_params,
                                         redis_url_from_settings)
    from crawlproject.project import use_package_settings

    module = use_package_settings()
    settings = get_project_settings()
    if args.redis_url:
        args.redis_source = "--redis-url"
    else:
        args.redis_url = redis_url_from_settings(settings)
        args.redis_source = _redis_source(settings, module)
    if not args.cluster:
        args.cluster = redis_cluster_from_settings(settings)
    args.redis_params = redis_params(settings)


def _redis_source(settings, module: str) -> str:
    """Where :func:`crawlproject.connection.redis_url_from_settings` found the URL,
    said with the Redis a command reports it used."""
    for names in (("REDIS_URL",), ("REDIS_HOST", "REDIS_PORT")):
        if any(settings.get(n) not in (None, "") and (settings.getpriority(n) or 0) > 0
               for n in names):
            return f"{'/'.join(names)} of {module}"
        if any(os.environ.get(n) for n in names):
            return f"${'/$'.join(names)}"
    return "the default"


def redis_where(args) -> str:
    """The Redis a command used, password redacted, and where that was decided."""
    from crawlproject.connection import redact_url

    source = getattr(args, "redis_source", None)
    return redact_url(args.redis_url) + (f" ({source})" if source else "")


def _client(args):
    return redis_from_url(args.redis_url, cluster=args.cluster,
                          **getattr(args, "redis_params", {}))


def _partitions(args) -> list[Frontier]:
    return frontier_partitions(_client(args), args.spider)


def _spider_class(args):
    return project_spider(args.spider)


def _seed_keys(args, settings=None, spidercls=None) -> SeedKeys:
    return seed_keys_of(args.spider, settings, spidercls)


def _ago(ms) -> str:
    try:
        seconds = max(0.0, time.time() - int(ms) / 1000)
    except (TypeError, ValueError):
        return "?"
    return f"{seconds:.0f}s ago"


def _spider_name(name: str) -> str:
    """A spider name whose keys cannot be another spider's (argparse type)."""
    try:
        return check_spider_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _in(at_ms, now_ms: int) -> str:
    if not at_ms or at_ms <= now_ms:
        return "now" if at_ms else ""
    return f"{(at_ms - now_ms) / 1000:.1f}s"


def _action(args) -> str:
    """The subcommand's action word (``list`` by default; ``--purge`` is ``purge``)."""
    if args.purge and args.action not in (None, "purge"):
        raise UsageError(f"--purge contradicts {args.action!r}")
    return "purge" if args.purge else (args.action or "list")
