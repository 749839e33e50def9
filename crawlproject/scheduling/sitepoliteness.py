"""The Scrapy side of the frontier's politeness: limits read from Scrapy's
settings, and each request's politeness key (host, registered domain or IP).

:mod:`crawlproject.frontier.sitelimits` holds the plain data the frontier
works with (keys, limits, partitions) and imports no Scrapy; this module builds
it from a crawler's settings (:meth:`SitePoliteness.from_settings`) and keys
Scrapy requests (:meth:`SitePoliteness.key`). The registered domain comes from
the public suffix list (``tldextract`` with its bundled snapshot, never the
network).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.httpobj import urlparse_cached

from crawlproject.defaults import setting
from crawlproject.urls import canonical_host
from crawlproject.frontier.sitelimits import (KEY_MODES, MAX_BUDGET, MAX_DELAY, MAX_PARTITIONS,
                                              UNLIMITED,
                                              Limits, PolitenessConfig, host_key, limits_from,
                                              safe_key)

logger = logging.getLogger(__name__)


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
class SitePoliteness(PolitenessConfig):
    """:class:`~crawlproject.frontier.sitelimits.PolitenessConfig` read from
    Scrapy's settings, with the politeness key of a Scrapy request."""

    @classmethod
    def from_settings(cls, settings) -> "PolitenessConfig":
        mode = setting(settings, "FRONTIER_POLITENESS_KEY").lower()
        if mode not in KEY_MODES:
            raise ValueError(f"FRONTIER_POLITENESS_KEY must be one of {KEY_MODES}, got {mode!r}")
        partitions = setting(settings, "FRONTIER_PARTITIONS")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"FRONTIER_PARTITIONS must be 1 to {MAX_PARTITIONS}, got {partitions}")
        enabled = setting(settings, "FRONTIER_POLITENESS")
        concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
        delay = max(0.0, settings.getfloat("DOWNLOAD_DELAY"))
        if not delay <= MAX_DELAY:  # also NaN: the scripts could not hold it
            raise ValueError(f"DOWNLOAD_DELAY must be 0 to {MAX_DELAY:g} s, got {delay!r}")
        site_budget = setting(settings, "FRONTIER_SITE_BUDGET")
        crawl_budget = setting(settings, "FRONTIER_CRAWL_BUDGET")
        for name, value in (("FRONTIER_SITE_BUDGET", site_budget),
                            ("FRONTIER_CRAWL_BUDGET", crawl_budget)):
            if not 0 <= value <= MAX_BUDGET:
                raise ValueError(f"{name} must be 0 (none) to {MAX_BUDGET}, got {value!r}")
        # The frontier honours a block, backoff or crawl delay of at most a day
        # whatever is asked (its hard bound): a longer setting would not hold.
        maxima = {name: setting(settings, name)
                  for name in ("FRONTIER_RETRY_AFTER_MAX", "FRONTIER_BACKOFF_MAX")}
        for name, value in maxima.items():
            if not 0 <= value <= MAX_DELAY:
                raise ValueError(f"{name} must be 0 to {MAX_DELAY:g} s, got {value!r}")
        default = Limits(delay=delay, concurrency=concurrency if concurrency > 0 else UNLIMITED,
                         budget=site_budget)
        overrides = {}
        # Scrapy's own per-slot limits (delay, concurrency) are per process; the
        # frontier enforces them for the cluster. FRONTIER_HOST_LIMITS wins.
        for name, entries in (("DOWNLOAD_SLOTS", settings.getdict("DOWNLOAD_SLOTS")),
                              ("FRONTIER_HOST_LIMITS", setting(settings, "FRONTIER_HOST_LIMITS"))):
            for given, value in entries.items():
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
            honour_download_slot=setting(settings, "FRONTIER_HONOUR_DOWNLOAD_SLOT"),
            default=default if enabled else Limits(budget=site_budget),
            jitter=delay_jitter(settings),
            overrides=overrides if enabled else {},
            backoff_codes=frozenset(int(c) for c in setting(
                settings, "FRONTIER_BACKOFF_HTTP_CODES")),
            retry_after_max=maxima["FRONTIER_RETRY_AFTER_MAX"],
            backoff_max=maxima["FRONTIER_BACKOFF_MAX"],
            **backoff_shape(settings),
            crawl_budget=crawl_budget,
            partitions=partitions,
            margin=max(0.0, setting(settings, "FRONTIER_DELAY_MARGIN")),
            margin_min=max(0.0, setting(settings, "FRONTIER_DELAY_MARGIN_MIN")),
        )

    def key(self, request) -> str:
        """The politeness key of *request* (always a :func:`safe_key`)."""
        return safe_key(self._key(request))

    def _key(self, request) -> str:
        if self.honour_download_slot:
            slot = request.meta.get("download_slot")
            if isinstance(slot, str) and slot:
                return slot[:200]
        # Canonical (trailing dot, IPv6 form...) even for a URL that did not
        # go through the scheduler's enqueue: one server, one key.
        host = canonical_host(urlparse_cached(request).hostname or "")
        if self.key_mode == "domain":
            return registered_domain(host)
        if self.key_mode == "ip":
            from scrapy.resolver import dnscache

            # Only what this node already resolved: a DNS round trip here
            # would block the reactor. Unresolved hosts count as themselves.
            return cached_address(dnscache.get(host)) or host
        return host


def delay_jitter(settings) -> float:
    """The magnitude of the random part of an interval, read as Scrapy's
    downloader reads it: ``DOWNLOAD_DELAY_JITTER`` (Scrapy 2.19; 0.5 by
    default), or the deprecated ``RANDOMIZE_DOWNLOAD_DELAY`` (0.5 or 0) where
    that is set at a higher priority. The frontier draws as Scrapy does
    (× uniform(1 − j, 1 + j)) but never shortens an interval: a draw below 1
    is the delay itself (a mean of 1 + j/4), so a site never sees two starts
    closer than its delay. Above 1: 1, said."""
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    if randomize > max(settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0,
                       SETTINGS_PRIORITIES["default"]):
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    try:
        jitter = float(settings.get("DOWNLOAD_DELAY_JITTER"))
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


def backoff_shape(settings) -> dict:
    """How a key's backoff follows its slow-down answers (see
    :class:`~crawlproject.frontier.sitelimits.PolitenessConfig`); ValueError
    for a value the scripts could not use."""
    tolerance = setting(settings, "FRONTIER_BACKOFF_TOLERANCE")
    window = setting(settings, "FRONTIER_BACKOFF_WINDOW")
    base = setting(settings, "FRONTIER_BACKOFF_BASE")
    if not 0.0 <= tolerance <= 1.0:
        raise ValueError(f"FRONTIER_BACKOFF_TOLERANCE must be 0 to 1, got {tolerance!r}")
    if not 1 <= window <= 1_000_000:
        raise ValueError(f"FRONTIER_BACKOFF_WINDOW must be 1 to 1000000 answers, got {window!r}")
    if not 0.0 <= base <= MAX_DELAY:
        raise ValueError(f"FRONTIER_BACKOFF_BASE must be 0 to {MAX_DELAY:g} s, got {base!r}")
    return {"backoff_tolerance": tolerance, "backoff_window": window, "backoff_base": base}
