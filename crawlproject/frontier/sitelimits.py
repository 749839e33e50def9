"""Politeness keys, partitions and limits: what the frontier is polite *to*.

Every request belongs to a *politeness key*, by default its host name (what
Scrapy uses as download slot), optionally its registered domain (public
suffix list: ``tldextract`` with its bundled snapshot, never the network) or
its IP address (how a request gets its key, from Scrapy's settings and
request, is :mod:`crawlproject.scheduling.sitepoliteness`: this module knows no
Scrapy). The frontier keeps one queue per key and enforces, at lease
time and for all nodes together, a minimum interval between the starts of two
requests of a key and a maximum number of its requests in flight
(:class:`Limits`). A key lives in partition ``crc32(key) % partitions``.

Cluster-wide meaning of Scrapy's settings (with ``FRONTIER_POLITENESS``, the
default): ``DOWNLOAD_DELAY`` is the interval between request starts of one key
*across all nodes*; ``CONCURRENT_REQUESTS_PER_DOMAIN`` the most requests of a
key in flight *across all nodes*; ``RANDOMIZE_DOWNLOAD_DELAY`` stretches each
interval by a random 0–50 % (never shortens it: the interval is a floor).
Two nodes with ``CONCURRENT_REQUESTS_PER_DOMAIN = 16`` used to allow 32 in
flight to one site; now 16 in all. Each node's own Scrapy downloader no
longer delays or limits per domain on top (its slots get no delay and the
node's full concurrency), so the delay is applied once, cluster-wide.
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from crawlproject import defaults
from crawlproject.urls import canonical_host

logger = logging.getLogger(__name__)

KEY_MODES = ("host", "domain", "ip")
# Partitions are spread over Redis Cluster's 16,384 slots by their hash tags:
# more than this would only multiply the calls a node makes.
MAX_PARTITIONS = 4096
#: Concurrency meaning "no limit" in the scripts.
UNLIMITED = 1_000_000_000
#: The longest interval a host limit may ask for (one request a day).
MAX_DELAY = 86_400.0
#: The largest page budget (exact in the scripts' numbers).
MAX_BUDGET = 10**15


def safe_key(key: str) -> str:
    """*key* as the frontier stores it: never starting with ``|``.

    The per-key state hash keeps the override of key ``K`` in field ``|K``, so
    a key of its own starting with ``|`` would overwrite another key's limits
    with its state. Scrapy accepts ``http://|example.com/`` (its host name is
    ``|example.com``), so a page can link to one. Such hosts never resolve; the
    ``%7C`` they get instead may make two of them share a queue, nothing more.
    Idempotent: keys already safe are returned unchanged.
    """
    return "%7C" + key[1:] if key.startswith("|") else key


def host_key(given: str) -> str:
    """The politeness key an operator means by *given* (a setting, a command
    line argument): a host name, also when given as a URL or with a port,
    since requests are keyed by host name as Scrapy's download slots are (a
    limit kept under ``host:8080`` or ``http://host/`` would never apply).
    Anything else is taken as it is, in the canonical form of a host
    (:func:`crawlproject.urls.canonical_host`: lower case, IDN as punycode,
    no trailing dot). ValueError if it names no host."""
    text = str(given).strip()
    key = text
    try:
        if "://" in text:
            key = urlsplit(text).hostname or ""
        elif text.startswith("["):  # an IPv6 address, with or without a port
            key = urlsplit("//" + text).hostname or ""
        elif re.fullmatch(r"[^:/\s\[\]]+:\d+", text):
            key = text.rsplit(":", 1)[0]
    except ValueError:
        raise ValueError(f"{given!r} is neither a host name nor a URL") from None
    key = safe_key(canonical_host(key))
    if not key:
        raise ValueError(f"{given!r} names no host")
    return key


def partition_of(key: str, partitions: int) -> int:
    """The partition of politeness key *key* (stable across processes)."""
    if partitions <= 1:
        return 0
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


@dataclass(frozen=True)
class Limits:
    """How polite to be to one key: interval between starts, most in flight."""

    delay: float = 0.0
    concurrency: int = UNLIMITED
    #: most new pages the key may queue in the crawl (0: no budget)
    budget: int = 0

    def encoded(self, source: str) -> str:
        """The ``T:limits`` value: ``"delay ms|concurrency[|budget]|source"``."""
        return Override(self.delay, self.concurrency, self.budget or None).encoded(source)


@dataclass(frozen=True)
class Override:
    """Limits of a key set at run time (``crawlctl politeness``). A field left
    None is not overridden: the nodes' own setting (``DOWNLOAD_DELAY``,
    ``CONCURRENT_REQUESTS_PER_DOMAIN``) applies, resolved by every SYNC call,
    so tightening one limit never loosens the other."""

    delay: float | None = None
    concurrency: int | None = None
    #: most new pages the key may queue in the crawl (None: the nodes' setting)
    budget: int | None = None

    def encoded(self, source: str) -> str:
        """The ``T:limits`` value, an empty field for one not overridden
        (without a budget the three fields older versions wrote)."""
        delay = "" if self.delay is None else str(int(round(self.delay * 1000)))
        concurrency = "" if self.concurrency is None else str(self.concurrency)
        if self.budget is None:
            return f"{delay}|{concurrency}|{source}"
        return f"{delay}|{concurrency}|{self.budget}|{source}"


def parse_override(value: str) -> dict:
    """``{"delay": s or None, "concurrency": n or None, "source": c}`` (and
    ``"budget": n`` when it has one) from a stored override; ValueError for
    anything else."""
    fields = value.split("|")
    if len(fields) == 3:
        (delay, concurrency, source), budget = fields, ""
    else:
        delay, concurrency, budget, source = fields   # ValueError unless 4
    # Only what the scripts read as a limit (digits, or empty): a value they
    # ignore ("-5", "+5", " 5") is junk here too, never shown nor merged back.
    if not all(f == "" or (f.isascii() and f.isdigit()) for f in (delay, concurrency, budget)):
        raise ValueError(f"not a stored override: {value!r}")
    out = {"delay": int(delay) / 1000 if delay else None,
           "concurrency": int(concurrency) if concurrency else None, "source": source}
    if budget:
        out["budget"] = int(budget)
    return out


@dataclass(frozen=True)
class PolitenessConfig:
    """Settings of the frontier's politeness (read once, from settings).

    ``default`` applies to every key without an override; ``overrides`` come
    from ``FRONTIER_HOST_LIMITS``; the command line sets more in Redis, which
    win over both. ``backoff_codes`` are the statuses that slow a key down
    (with ``Retry-After``: blocked that long, at most ``retry_after_max``).
    Without ``Retry-After`` the answer raises the key's recent error rate (a
    moving average over about ``backoff_window`` answers, or the key's
    concurrency if more, at most 100); only while that
    rate is at least ``backoff_tolerance`` is the key's interval doubled
    (from ``backoff_base``, or twice its delay; at most ``backoff_max``).
    Successes lower the rate and halve the interval again.
    """

    enabled: bool = defaults.FRONTIER_POLITENESS
    key_mode: str = defaults.FRONTIER_POLITENESS_KEY
    honour_download_slot: bool = defaults.FRONTIER_HONOUR_DOWNLOAD_SLOT
    default: Limits = Limits()
    jitter: float = 0.0
    overrides: dict = field(default_factory=dict)
    backoff_codes: frozenset = frozenset(defaults.FRONTIER_BACKOFF_HTTP_CODES)
    retry_after_max: float = defaults.FRONTIER_RETRY_AFTER_MAX
    backoff_max: float = defaults.FRONTIER_BACKOFF_MAX
    backoff_tolerance: float = defaults.FRONTIER_BACKOFF_TOLERANCE
    backoff_window: int = defaults.FRONTIER_BACKOFF_WINDOW
    backoff_base: float = defaults.FRONTIER_BACKOFF_BASE
    #: most new pages the crawl may queue (0: none), split evenly between
    #: partitions (each counts its own); a site's budget is ``default.budget``
    crawl_budget: int = defaults.FRONTIER_CRAWL_BUDGET
    partitions: int = defaults.FRONTIER_PARTITIONS
    #: intervals are this much longer than asked (node-side latency between the
    #: lease and the request leaving must never shorten what the site sees)
    margin: float = defaults.FRONTIER_DELAY_MARGIN
    #: ... and at least this many seconds (a node's scheduling latency does not
    #: shrink with the interval)
    margin_min: float = defaults.FRONTIER_DELAY_MARGIN_MIN

    def pad(self, interval: float) -> float:
        """The safety margin (s) added to an interval of *interval* s; the same
        sum as the frontier's script makes. A polite entry the node could not
        start within it of its lease goes back unstarted. A ``margin`` of 0
        turns it off (limits held at lease only)."""
        if interval <= 0 or self.margin <= 0:
            return 0.0
        return max(self.margin * interval, self.margin_min)

    def partition(self, key: str) -> int:
        return partition_of(key, self.partitions)


def limits_from(value, default: Limits) -> Limits:
    """A :class:`Limits` from ``{"delay": s, "concurrency": n}`` (missing: *default*'s)."""
    if not isinstance(value, dict):
        raise ValueError(f"a host limit must be {{'delay': s, 'concurrency': n}}, got {value!r}")
    try:
        delay = float(value.get("delay", default.delay))
        concurrency = int(value.get("concurrency", default.concurrency))
        budget = int(value.get("budget", default.budget))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"bad host limit {value!r}: delay, concurrency and budget must be "
                         "numbers") from None
    if not 0 <= delay <= MAX_DELAY or concurrency < 0 or not 0 <= budget <= MAX_BUDGET:
        raise ValueError(f"bad host limit {value!r}: delay must be 0 to {MAX_DELAY:g} s, "
                         f"concurrency 0 (no limit) or more, budget 0 (none) to {MAX_BUDGET}")
    return Limits(delay, min(concurrency, UNLIMITED) if concurrency > 0 else UNLIMITED, budget)
