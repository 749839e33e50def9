"""What a node checks when its scheduler opens: the engine internals the
acknowledgements rely on (refused, loudly, on a Scrapy without them),
Scrapy's own per-process politeness and remote control server taken off,
and what weakens the crawl said (per-node robots.txt, no ``FRONTIER_SECRET``).
"""

from __future__ import annotations

import logging

import scrapy
from scrapy import signals
from scrapy.settings import SETTINGS_PRIORITIES

# The scheduler's own lines: they keep its logger's name.
logger = logging.getLogger("crawlproject.scheduler")

#: Scrapy versions whose engine internals the acknowledgements were checked on.
SUPPORTED_SCRAPY = ((2, 13), (2, 19))


def check_engine(crawler) -> None:
    """Fail at open, loudly, if the engine lacks what acknowledgements need.

    A request is acknowledged once it leaves the engine's slot
    (``engine._slot.inprogress``, private to Scrapy); without it nothing
    would ever be acknowledged, silently.
    """
    slot = getattr(crawler.engine, "_slot", None)
    inprogress = getattr(slot, "inprogress", None)
    nextcall = getattr(slot, "nextcall", None)
    if not isinstance(inprogress, set) or not callable(getattr(nextcall, "schedule", None)):
        raise RuntimeError(unsupported("its engine has no _slot.inprogress set / "
                                       "_slot.nextcall, which tell when a request "
                                       "is done"))


def unsupported(what: str) -> str:
    """The error of a Scrapy whose engine lacks *what*."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_SCRAPY
    return (f"crawlproject.scheduler.RedisScheduler cannot run on Scrapy "
            f"{scrapy.__version__}: {what} (supported: Scrapy {lo_major}.{lo_minor} to "
            f"{hi_major}.{hi_minor}; see requirements.txt)")


def no_local_politeness(crawler, politeness, log_extra: dict) -> None:
    """Keep Scrapy's per-process download slots from delaying or limiting a
    second time what the frontier (*politeness*, a
    :class:`~crawlproject.scheduling.sitepoliteness.SitePoliteness`) already
    spaced out for all nodes."""
    downloader = getattr(crawler.engine, "downloader", None)
    if not all(hasattr(downloader, a) for a in ("_delay", "domain_concurrency",
                                                 "ip_concurrency", "per_slot_settings")):
        raise RuntimeError(unsupported("its downloader has no _delay / "
                                       "domain_concurrency / per_slot_settings"))
    downloader._delay = 0.0
    downloader._jitter = 0.0
    downloader.domain_concurrency = max(1, downloader.total_concurrency or 1_000_000)
    downloader.ip_concurrency = 0
    if downloader.per_slot_settings:
        logger.info("DOWNLOAD_SLOTS %s: enforced by the frontier for all nodes together "
                    "(FRONTIER_HOST_LIMITS wins for a site both name)",
                    sorted(downloader.per_slot_settings)[:10], extra=log_extra)
    downloader.per_slot_settings = {}
    for slot in downloader.slots.values():
        slot.delay, slot.concurrency = 0.0, downloader.domain_concurrency
    per_ip = crawler.settings.getint("CONCURRENT_REQUESTS_PER_IP")
    if per_ip > 0:
        logger.warning("CONCURRENT_REQUESTS_PER_IP = %d is not applied: Scrapy's limit is per "
                       "process (and deprecated); for a limit per server across all nodes "
                       "set FRONTIER_POLITENESS_KEY = 'ip' and CONCURRENT_REQUESTS_PER_DOMAIN",
                       per_ip, extra=log_extra)
    if crawler.settings.getbool("AUTOTHROTTLE_ENABLED"):
        logger.warning("AUTOTHROTTLE_ENABLED adds a per-process delay on top of the "
                       "frontier's cluster-wide politeness: turn it off (the frontier "
                       "slows a site down for every node when it answers %s)",
                       sorted(politeness.backoff_codes), extra=log_extra)


def no_remote_control(crawler, log_extra: dict) -> None:
    """Keep Scrapy's remote control server from starting unless the user
    asked for it.

    Scrapy 2.19 turns it on by default: an HTTP endpoint on localhost that
    runs the Python code posted to it (with a token in a job file). A
    crawl node has no use for it, and it is one more way to run code on
    every node; a user project that pasted the README block without
    ``REMOTE_CONTROL_ENABLED = False`` would have it. It is taken off the
    ``engine_started`` signal before the engine starts (the scheduler is
    opened first); a user who set the setting keeps it, with a warning.
    """
    settings = crawler.settings
    if not settings.getbool("REMOTE_CONTROL_ENABLED"):
        return
    extensions = getattr(getattr(crawler, "extensions", None), "middlewares", ())
    for ext in extensions:
        if type(ext).__name__ != "RemoteControl":
            continue
        if settings.getpriority("REMOTE_CONTROL_ENABLED") > SETTINGS_PRIORITIES["default"]:
            logger.warning("Scrapy's remote control (runs Python code posted to it over "
                           "HTTP on localhost) is on, as REMOTE_CONTROL_ENABLED says",
                           extra=log_extra)
            return
        crawler.signals.disconnect(ext.start, signal=signals.engine_started)
        logger.info("Scrapy's remote control server is not started on a shared-frontier "
                    "node (it runs code posted to it); set REMOTE_CONTROL_ENABLED = True "
                    "to keep it", extra=log_extra)


def per_node_robots(crawler, log_extra: dict) -> None:
    """Say so when Scrapy's own robots.txt middleware runs on this node:
    each node then fetches each site's robots.txt itself, outside the
    site's limits (crawlproject.robots fetches one for the cluster)."""
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware

    downloader = getattr(getattr(crawler, "engine", None), "downloader", None)
    middlewares = getattr(getattr(downloader, "middleware", None), "middlewares", ())
    if any(type(mw) is RobotsTxtMiddleware for mw in middlewares):
        crawler.stats.set_value("robotstxt/per_node", 1)
        logger.warning(
            "ROBOTSTXT_OBEY with Scrapy's RobotsTxtMiddleware: every node fetches each "
            "site's robots.txt itself, outside the site's limits; use "
            "crawlproject.robots.ClusterRobotsTxtMiddleware (see README's settings block)",
            extra=log_extra)


def log_trust(signer, stats, log_extra: dict) -> None:
    """Say whether this node's stored requests are signed (*signer*, None
    without ``FRONTIER_SECRET``), and what an unsigned crawl cannot share."""
    if signer is not None:
        logger.info("Requests are stored signed (FRONTIER_SECRET): what this crawl's nodes "
                    "stored comes back whole; anything else read from Redis gets the seed "
                    "policy", extra=log_extra)
        return
    stats.set_value("scheduler/unsigned", 1)
    logger.warning(
        "FRONTIER_SECRET is not set: nodes cannot prove which requests in Redis they wrote, "
        "so every request read back gets the seed policy (published callbacks, GET/HEAD, "
        "allowed meta). Requests of this spider that need more (a private callback such as "
        "CrawlSpider's, a body, unpublished meta) are kept and crawled on the node that "
        "made them (scheduler/kept_local), not shared. Set FRONTIER_SECRET, the same on "
        "every node (python -m crawlproject.cli secret prints one)", extra=log_extra)
