"""EgressMiddleware: requests the address policy refuses never reach a connection,
and refusals found at connection time are dead-lettered, never retried.

Downloader middleware at 760 (after the proxy middlewares, 600 and Scrapy's
750, have chosen the proxy; its ``process_exception`` runs before the retry
middleware's, 550):

* a URL whose host is an IP literal (``http://169.254.169.254/``,
  ``http://[::1]/``, ``http://[::ffff:127.0.0.1]/``) is checked against
  ``DOWNLOAD_ALLOWED_NETWORKS`` before any connection, whether it goes through
  a proxy or not (through a proxy it would reach the proxy's own network);
* so is a proxy that is an IP literal, unless the operator configured it
  (``PROXY_POOL``, ``PROXY_POOL_FILE``, ``STORED_PROXY_ALLOW``, ``*_proxy``
  environment variables): proxies from Redis pass the policy like any host;
* a request sent straight to a proxy the operator configured (not through
  it) is refused: the proxy's address is trusted as a proxy, not as a site;
* a DNS lookup error of a host whose addresses the guard refused
  (:mod:`crawlproject.egress.resolver`) becomes the refusal, with its reason.

Refused requests go through :func:`~crawlproject.egress.report.refuse`: stats
``egress/refused`` and ``egress/refused/<group>``, one WARNING per host,
dead-lettered with the reason. Host names are checked at connection time by
the guard, which this middleware installs too (as the scheduler does).
"""

from __future__ import annotations

from scrapy.utils.httpobj import urlparse_cached

from crawlproject.egress.policy import Refusal, parse_address
from crawlproject.egress.report import AddressRefused, connection_endpoint, refuse
from crawlproject.egress.resolver import (install_guard, policy_from_settings, process_guard,
                                          refusal_of)
from crawlproject.identity.session import PROXY_ID

#: Where the middleware goes in DOWNLOADER_MIDDLEWARES.
ORDER = 760


class EgressMiddleware:
    """Refuse requests to refused addresses (see the module docstring)."""

    def __init__(self, crawler, policy, guard):
        self.crawler = crawler
        self.policy = policy
        self.guard = guard

    @classmethod
    def from_crawler(cls, crawler):
        policy = policy_from_settings(crawler.settings)
        install_guard(crawler)
        return cls(crawler, policy, process_guard())

    def process_request(self, request, spider=None):
        """Refuse an IP-literal URL or untrusted IP-literal proxy the policy refuses."""
        url = urlparse_cached(request)
        host = url.hostname or ""
        ip = parse_address(host)
        if ip is not None:
            refusal = self.policy.check(ip, host)
            if refusal is not None:
                raise refuse(self.crawler, request, refusal)
        if request.meta.get("proxy"):
            return self._check_proxy(request)
        port = url.port or (443 if url.scheme == "https" else 80)
        if self.guard.exempt(host, port):
            raise refuse(self.crawler, request, Refusal(
                f"{host}:{port}", host, "proxy", "a proxy of the settings, never fetched as a site"))
        return None

    def _check_proxy(self, request):
        host, port = connection_endpoint(request)
        ip = parse_address(host)
        if ip is None or self.guard.exempt(host, port):
            return None  # a name: the guard checks what it resolves to
        refusal = self.policy.check(ip, host)
        if refusal is not None:
            raise refuse(self.crawler, request, refusal)
        return None

    def process_exception(self, request, exception, spider=None):
        """Turn a connection the guard refused into the request's refusal."""
        if isinstance(exception, AddressRefused):
            return None  # given up already, by whoever raised it
        refusal = refusal_of(request, exception)
        if refusal is None:
            return None
        if request.meta.get(PROXY_ID) and request.meta.get("proxy"):
            # A pool proxy (from Redis) that resolves to a refused address: a
            # failed proxy, which the pool bans and reroutes around, not a failed page.
            return None
        raise refuse(self.crawler, request, refusal)
