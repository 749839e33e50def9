"""The shared proxy pool: every node sends its requests through proxies chosen
from one pool, and the pool's health and bans are shared through Redis.

* :mod:`~crawlproject.proxies.pool`: entries parsed strictly, ban rules, the
  node's in-memory choice (no Scrapy, no Redis);
* :mod:`~crawlproject.proxies.store`: the pool's shared state in Redis (health,
  bans, retirements), one script call per node per second;
* :mod:`~crawlproject.proxies.middleware`: ``ProxyPoolMiddleware`` (downloader,
  600), which puts them together in the crawl.

The pool's names (``crawlproject.proxies.parse_proxy``, ``BanRules``, ...) are
importable from here, as they were from the module of this path before.
"""

from crawlproject.proxies.pool import (DEFAULT_BODY_PATTERNS, DEFAULT_REDIRECT_PATTERNS,
                                       MAX_ENTRY_LENGTH, SCHEMES, UNSUPPORTED_SCHEMES,
                                       BanRules, Health, InvalidProxy, PoolView, Proxy,
                                       entry_fingerprint, parse_proxy)

__all__ = ["DEFAULT_BODY_PATTERNS", "DEFAULT_REDIRECT_PATTERNS", "MAX_ENTRY_LENGTH", "SCHEMES",
           "UNSUPPORTED_SCHEMES", "BanRules", "Health", "InvalidProxy", "PoolView", "Proxy",
           "entry_fingerprint", "parse_proxy"]
