"""Politeness keys, partitions and limits: what the frontier is polite *to*.

Every request belongs to a *politeness key*, by default its host name (what
Scrapy uses as download slot), optionally its registered domain (public
suffix list: ``tldextract`` with its bundled snapshot, never the network) or
its IP address. The frontier keeps one queue per key and enforces, at lease
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
from functools import lru_cache
from urllib.parse import urlsplit

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.httpobj import urlparse_cached

logger = logging.getLogger(__name__)

KEY_MODES = ("host", "domain", "ip")
# Partitions are spread over Redis Cluster's 16,384 slots by their hash tags:
# more than this would only multiply the calls a node makes.
MAX_PARTITIONS = 4096
#: Concurrency meaning "no limit" in the scripts.
UNLIMITED = 1_000_000_000
#: The longest interval a host limit may ask for (one request a day).
MAX_DELAY = 86_400.0


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
    Anything else is taken as it is, lower-cased. ValueError if it names no
    host."""
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
    key = safe_key(key.lower())
    if not key:
        raise ValueError(f"{given!r} names no host")
    return key


def partition_of(key: str, partitions: int) -> int:
    """The partition of politeness key *key* (stable across processes)."""
    if partitions <= 1:
        return 0
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


@lru_cache(maxsize=1)
def _extractor():
    import tldextract

    # The bundled public suffix snapshot only: nodes never fetch it.
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """``shop.example.co.uk`` → ``example.co.uk`` (IPs and unknown suffixes: the host)."""
    ext = _extractor()(host)
    return ext.top_domain_under_public_suffix or host


@dataclass(frozen=True)
class Limits:
    """How polite to be to one key: interval between starts, most in flight."""

    delay: float = 0.0
    concurrency: int = UNLIMITED

    def encoded(self, source: str) -> str:
        """The ``T:limits`` value: ``"delay ms|concurrency|source"``."""
        return Override(self.delay, self.concurrency).encoded(source)


@dataclass(frozen=True)
class Override:
    """Limits of a key set at run time (``crawlctl politeness``). A field left
    None is not overridden: the nodes' own setting (``DOWNLOAD_DELAY``,
    ``CONCURRENT_REQUESTS_PER_DOMAIN``) applies, resolved by every SYNC call,
    so tightening one limit never loosens the other."""

    delay: float | None = None
    concurrency: int | None = None

    def encoded(self, source: str) -> str:
        """The ``T:limits`` value, an empty field for one not overridden."""
        delay = "" if self.delay is None else str(int(round(self.delay * 1000)))
        concurrency = "" if self.concurrency is None else str(self.concurrency)
        return f"{delay}|{concurrency}|{source}"


def parse_override(value: str) -> dict:
    """``{"delay": s or None, "concurrency": n or None, "source": c}`` from a
    stored override; ValueError for anything else."""
    delay, concurrency, source = value.split("|")
    # Only what the scripts read as a limit (digits, or empty): a value they
    # ignore ("-5", "+5", " 5") is junk here too, never shown nor merged back.
    if not all(f == "" or (f.isascii() and f.isdigit()) for f in (delay, concurrency)):
        raise ValueError(f"not a stored override: {value!r}")
    return {"delay": int(delay) / 1000 if delay else None,
            "concurrency": int(concurrency) if concurrency else None, "source": source}


def cached_address(resolved) -> str | None:
    """The address Scrapy's DNS cache holds for a host: a string with
    ``CachingThreadedResolver``, a list of Twisted addresses with
    ``CachingHostnameResolver`` (the lowest one, so that every node that
    resolved the same set keys the host alike); None for anything else."""
    if isinstance(resolved, str):
        return resolved or None
    if isinstance(resolved, (list, tuple)):
        hosts = [getattr(a, "host", None) for a in resolved]
        hosts = [h for h in hosts if isinstance(h, str) and h]
        return min(hosts) if hosts else None
    return None


@dataclass(frozen=True)
class PolitenessConfig:
    """Settings of the frontier's politeness (read once, from settings).

    ``default`` applies to every key without an override; ``overrides`` come
    from ``FRONTIER_HOST_LIMITS``; the command line sets more in Redis, which
    win over both. ``backoff_codes`` are the statuses that slow a key down
    (with ``Retry-After``: blocked that long, at most ``retry_after_max``;
    without: its interval doubled, at most ``backoff_max``, relaxed again by
    successes).
    """

    enabled: bool = True
    key_mode: str = "host"
    honour_download_slot: bool = False
    default: Limits = Limits()
    jitter: float = 0.0
    overrides: dict = field(default_factory=dict)
    backoff_codes: frozenset = frozenset({429, 503})
    retry_after_max: float = 300.0
    backoff_max: float = 60.0
    partitions: int = 1
    #: intervals are this much longer than asked (node-side latency between the
    #: lease and the request leaving must never shorten what the site sees)
    margin: float = 0.05

    @classmethod
    def from_settings(cls, settings) -> "PolitenessConfig":
        mode = (settings.get("FRONTIER_POLITENESS_KEY") or "host").lower()
        if mode not in KEY_MODES:
            raise ValueError(f"FRONTIER_POLITENESS_KEY must be one of {KEY_MODES}, got {mode!r}")
        partitions = settings.getint("FRONTIER_PARTITIONS", 1)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"FRONTIER_PARTITIONS must be 1 to {MAX_PARTITIONS}, got {partitions}")
        enabled = settings.getbool("FRONTIER_POLITENESS", True)
        concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN", 8)
        delay = max(0.0, settings.getfloat("DOWNLOAD_DELAY", 0.0))
        if not delay <= MAX_DELAY:  # also NaN: the scripts could not hold it
            raise ValueError(f"DOWNLOAD_DELAY must be 0 to {MAX_DELAY:g} s, got {delay!r}")
        default = Limits(delay=delay, concurrency=concurrency if concurrency > 0 else UNLIMITED)
        overrides = {}
        # Scrapy's own per-slot limits (delay, concurrency) are per process; the
        # frontier enforces them for the cluster. FRONTIER_HOST_LIMITS wins.
        for name in ("DOWNLOAD_SLOTS", "FRONTIER_HOST_LIMITS"):
            for given, value in (settings.getdict(name) or {}).items():
                try:
                    key = host_key(given)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
                if key != str(given).strip().lower():
                    logger.warning("%s: %r is kept for politeness key %r (host names, without "
                                   "scheme or port)", name, given, key)
                if name == "DOWNLOAD_SLOTS" and isinstance(value, dict):
                    value = {k: value[k] for k in ("delay", "concurrency") if k in value}
                try:
                    overrides[key] = limits_from(value, default)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
        return cls(
            enabled=enabled, key_mode=mode,
            honour_download_slot=settings.getbool("FRONTIER_HONOUR_DOWNLOAD_SLOT", False),
            default=default if enabled else Limits(),
            jitter=delay_jitter(settings),
            overrides=overrides if enabled else {},
            backoff_codes=frozenset(int(c) for c in settings.getlist(
                "FRONTIER_BACKOFF_HTTP_CODES", [429, 503])),
            retry_after_max=settings.getfloat("FRONTIER_RETRY_AFTER_MAX", 300.0),
            backoff_max=settings.getfloat("FRONTIER_BACKOFF_MAX", 60.0),
            partitions=partitions,
            margin=max(0.0, settings.getfloat("FRONTIER_DELAY_MARGIN", 0.05)),
        )

    def key(self, request) -> str:
        """The politeness key of *request* (always a :func:`safe_key`)."""
        return safe_key(self._key(request))

    def _key(self, request) -> str:
        if self.honour_download_slot:
            slot = request.meta.get("download_slot")
            if isinstance(slot, str) and slot:
                return slot[:200]
        host = (urlparse_cached(request).hostname or "").lower()
        if self.key_mode == "domain":
            return registered_domain(host)
        if self.key_mode == "ip":
            from scrapy.resolver import dnscache

            # Only what this node already resolved: a DNS round trip here
            # would block the reactor. Unresolved hosts count as themselves.
            return cached_address(dnscache.get(host)) or host
        return host

    def partition(self, key: str) -> int:
        return partition_of(key, self.partitions)


def delay_jitter(settings) -> float:
    """The magnitude of the random part of an interval, read as Scrapy's
    downloader reads it: ``DOWNLOAD_DELAY_JITTER`` (Scrapy 2.19; 0.5 by
    default), or the deprecated ``RANDOMIZE_DOWNLOAD_DELAY`` (0.5 or 0) where
    that is set at a higher priority. The frontier only ever lengthens an
    interval, by 0 to this fraction (Scrapy's ±): a site never sees two starts
    closer than its delay. Above 1: 1, said."""
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    if randomize > max(settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0,
                       SETTINGS_PRIORITIES["default"]):
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    try:
        jitter = float(settings.get("DOWNLOAD_DELAY_JITTER", 0.5))
    except (TypeError, ValueError):
        raise ValueError("DOWNLOAD_DELAY_JITTER must be a number from 0 to 1, got "
                         f"{settings.get('DOWNLOAD_DELAY_JITTER')!r}") from None
    if not jitter >= 0 or jitter == float("inf"):   # also NaN
        raise ValueError(f"DOWNLOAD_DELAY_JITTER must be a number from 0 to 1, got {jitter!r}")
    if jitter > 1:
        logger.warning("DOWNLOAD_DELAY_JITTER %g: the frontier stretches intervals by at most "
                       "100 %% (1)", jitter)
        jitter = 1.0
    return jitter


def limits_from(value, default: Limits) -> Limits:
    """A :class:`Limits` from ``{"delay": s, "concurrency": n}`` (missing: *default*'s)."""
    if not isinstance(value, dict):
        raise ValueError(f"a host limit must be {{'delay': s, 'concurrency': n}}, got {value!r}")
    try:
        delay = float(value.get("delay", default.delay))
        concurrency = int(value.get("concurrency", default.concurrency))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"bad host limit {value!r}: delay and concurrency must be numbers") from None
    if not 0 <= delay <= MAX_DELAY or concurrency < 0:
        raise ValueError(f"bad host limit {value!r}: delay must be 0 to {MAX_DELAY:g} s, "
                         "concurrency 0 (no limit) or more")
    return Limits(delay, min(concurrency, UNLIMITED) if concurrency > 0 else UNLIMITED)
