"""SeedRefererMiddleware: Scrapy's RefererMiddleware, plus a default Referer for seeds.

Followed requests keep Scrapy's behaviour unchanged: the page they were found
on, as the referrer policy allows (``meta["referrer_policy"]``, the page's
``Referrer-Policy`` header, else ``REFERRER_POLICY``). Being a subclass, it
is also the instance Scrapy's ``RedirectMiddleware`` finds and uses to fix the
Referer of a redirected request.

Seeds: in this project seeds are what
:meth:`crawlproject.spiders.seeded.RedisSpider.start` yields, and Scrapy passes
``start()`` output through every spider middleware's ``process_start``, which
calls :meth:`get_processed_request` with no response. Scrapy leaves those
requests alone; here a seed without a ``Referer`` header gets the default of
its domain, so the hook is this one method and needs no second component:

* ``REFERER_SEED_DEFAULT``: ``"none"`` (default), ``"root"`` (the seed's site
  root, ``scheme://host[:port]/``) or ``"search"`` (``REFERER_SEED_SEARCH_URL``
  with ``{domain}`` (registered domain), ``{host}`` or ``{url}`` filled in,
  URL-quoted);
* ``REFERER_SEED_BY_DOMAIN``: ``{"example.com": "root"}``, matching the host
  or any of its parent domains (the longest match wins).

A request's own ``Referer`` header always wins, and a seed whose
``meta["referrer_policy"]`` is ``"no-referrer"`` gets none. The configured
default is the operator's choice and is not filtered by the referrer policy.
Referer headers are request headers: they travel through the frontier with
the request.

Trust: a request's meta may come from Redis (a redirect carries the meta of a
stored request). Scrapy imports the class an import path in
``meta["referrer_policy"]`` names; here only policy *names* (the standard ones
and those of ``REFERRER_POLICIES``) and the import paths the settings
themselves name are accepted. Anything else is refused with a warning
(``referer/policy_refused``) and the default policy applies.
Stats: ``referer/seed/<root|search>``.
"""

from __future__ import annotations

import ipaddress
import logging
import string
from urllib.parse import quote

from scrapy.exceptions import NotConfigured
from scrapy.spidermiddlewares.referer import NoReferrerPolicy, RefererMiddleware
from scrapy.utils.httpobj import urlparse_cached

from crawlproject.defaults import REFERER_SEED_SEARCH_URL, setting
from crawlproject.scheduling.sitepoliteness import registered_domain

logger = logging.getLogger(__name__)

SEED_MODES = ("none", "root", "search")
SEARCH_FIELDS = frozenset({"domain", "host", "url"})
DEFAULT_SEARCH_URL = REFERER_SEED_SEARCH_URL


def check_mode(mode, what: str) -> str:
    """A valid seed Referer mode, or ``ValueError`` naming *what* was wrong."""
    if mode not in SEED_MODES:
        raise ValueError(f"{what} must be one of {SEED_MODES}, got {mode!r}")
    return mode


def check_template(template) -> str:
    """A search URL template using only ``{domain}``, ``{host}`` and ``{url}``."""
    if not isinstance(template, str) or not template.startswith(("http://", "https://")):
        raise ValueError(f"REFERER_SEED_SEARCH_URL must be an http(s) URL, got {template!r}")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"REFERER_SEED_SEARCH_URL {template!r}: {exc}") from None
    if not fields <= SEARCH_FIELDS:
        raise ValueError(f"REFERER_SEED_SEARCH_URL may use only {sorted(SEARCH_FIELDS)}, "
                         f"got {sorted(fields - SEARCH_FIELDS)}")
    return template


class SeedReferers:
    """Which Referer a seed gets: the mode of its domain, made into a URL."""

    def __init__(self, default: str = "none", by_domain: dict | None = None,
                 search_url: str = DEFAULT_SEARCH_URL):
        self.default = check_mode(default, "REFERER_SEED_DEFAULT")
        self.by_domain = {str(d).lower().strip("."): check_mode(m, f"REFERER_SEED_BY_DOMAIN[{d!r}]")
                          for d, m in (by_domain or {}).items()}
        self.search_url = check_template(search_url)

    @classmethod
    def from_settings(cls, settings) -> "SeedReferers":
        """Read ``REFERER_SEED_*``; ``ValueError`` with the setting's name when wrong."""
        return cls(setting(settings, "REFERER_SEED_DEFAULT"),
                   setting(settings, "REFERER_SEED_BY_DOMAIN"),
                   setting(settings, "REFERER_SEED_SEARCH_URL"))

    def mode(self, host: str) -> str:
        """The mode of *host*: its own entry, its closest parent domain's, else the default."""
        host = host.lower()
        if host in self.by_domain or _is_ip(host):
            return self.by_domain.get(host, self.default)
        labels = host.split(".")
        for i in range(1, len(labels)):
            parent = ".".join(labels[i:])
            if parent in self.by_domain and not _is_ip(parent):  # an address is no domain
                return self.by_domain[parent]
        return self.default

    def referer(self, request) -> tuple[str, str | None]:
        """(mode, Referer URL or None) for a seed *request*."""
        parsed = urlparse_cached(request)
        host = parsed.hostname or ""
        mode = self.mode(host)
        if mode == "root":
            return mode, f"{parsed.scheme}://{parsed.netloc.rpartition('@')[2]}/"
        if mode == "search":
            values = {"domain": registered_domain(host), "host": host, "url": request.url}
            return mode, self.search_url.format(**{k: quote(v, safe="") for k, v in values.items()})
        return mode, None


class SeedRefererMiddleware(RefererMiddleware):
    """Scrapy's referer handling plus seed defaults (see the module docstring)."""

    def __init__(self, settings, crawler=None):
        super().__init__(settings)
        self.crawler = crawler
        self.seeds = SeedReferers.from_settings(settings)
        # Import paths an operator put in the settings are trusted; nothing else.
        paths = [settings.get("REFERRER_POLICY")]
        paths += list(settings.getdict("REFERRER_POLICIES").values())
        self._trusted_paths = frozenset(p for p in paths if isinstance(p, str) and "." in p)

    @classmethod
    def from_crawler(cls, crawler):
        if not crawler.settings.getbool("REFERER_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        return cls(crawler.settings, crawler)

    def get_processed_request(self, request, response):
        """Followed requests: Scrapy's policy; seeds: the configured default."""
        if response is not None:
            return super().get_processed_request(request, response)
        if b"Referer" in request.headers or self._no_referrer(request):
            return request
        mode, referer = self.seeds.referer(request)
        if referer is not None:
            request.headers[b"Referer"] = referer
            self._inc(f"referer/seed/{mode}")
        return request

    def policy(self, response=None, request=None, **kwargs):
        """Scrapy's :meth:`policy`, refusing meta policies it would import."""
        name = request.meta.get("referrer_policy") if request is not None else None
        if name is not None and not self._accepted(name):
            logger.warning("Refused meta referrer_policy %r of %s: not a policy name",
                           str(name)[:100], request)
            self._inc("referer/policy_refused")
            return self.default_policy()
        return super().policy(response, request, **kwargs)

    def _accepted(self, name) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._trusted_paths:
            return True
        # Scrapy's own parsing: a comma-separated list, the last known name wins.
        return any(token.strip().lower() in self.policies for token in name.split(","))

    def _no_referrer(self, request) -> bool:
        name = request.meta.get("referrer_policy")
        if not isinstance(name, str):
            return False
        known = [t.strip().lower() for t in name.split(",") if t.strip().lower() in self.policies]
        return bool(known) and issubclass(self.policies[known[-1]], NoReferrerPolicy)

    def _inc(self, key: str) -> None:
        if self.crawler is not None and self.crawler.stats is not None:
            self.crawler.stats.inc_value(key)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
