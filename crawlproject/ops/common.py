"""What every operator tool needs: the project's spider classes and seed keys,
a spider's frontier partitions, bad-input errors, Redis values as text."""

from __future__ import annotations


from crawlproject.frontier.queue import Frontier
from crawlproject.keys import (
    FrontierKeys,
    SeedKeys,
)
from crawlproject.seeds import seed_key


class UsageError(Exception):
    """Bad input from the command line (exit 2)."""


def frontier_partitions(client, spider: str) -> list[Frontier]:
    """Every partition of the spider's frontier (the count the crawl started with)."""
    from crawlproject.frontier.sitelimits import MAX_PARTITIONS

    stored = client.hget(FrontierKeys(spider).config, "partitions")
    try:
        count = int(stored) if stored else 1
    except ValueError:
        count = -1
    if not 1 <= count <= MAX_PARTITIONS:
        # Read from Redis: a junk count must not make this process build a
        # billion partition objects (nodes refuse it too: see the scheduler).
        raise UsageError(f"{FrontierKeys(spider).config} holds an unreadable partition count "
                         f"({stored!r:.40}): expected 1 to {MAX_PARTITIONS}")
    return [Frontier(client, spider, node="cli", partition=p, partitions=count)
            for p in range(count)]


def current_project():
    """(settings, spider loader) of the Scrapy project around us, else of the
    installed package (:func:`crawlproject.project.use_package_settings`)."""
    from scrapy.spiderloader import get_spider_loader
    from scrapy.utils.project import get_project_settings

    from crawlproject.project import use_package_settings

    use_package_settings()
    settings = get_project_settings()
    try:
        return settings, get_spider_loader(settings)
    except Exception:  # noqa: BLE001 - no project here: checks without it
        return settings, None


def project_spider(spider: str):
    """(project settings, the spider's class or None if the project has no such spider)."""
    settings, loader = current_project()
    try:
        return settings, loader.load(spider) if loader is not None else None
    except KeyError:
        return settings, None


def seed_keys_of(spider: str, settings=None, spidercls=None) -> SeedKeys:
    """The seed keys of *spider*: its class' ``redis_key``, else ``REDIS_START_URLS_KEY``."""
    return SeedKeys(seed_key(spider, settings, getattr(spidercls, "redis_key", None)))


def redis_time_ms(client) -> int:
    """Redis' clock in milliseconds (the time leases and backoffs are kept in)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000




def seed_count(client, key: str) -> int:
    """How many seeds wait at *key* (a list, set or sorted set; 0 if absent)."""
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    return {"list": client.llen, "set": client.scard, "zset": client.zcard}.get(
        kind, lambda _k: 0)(key)
