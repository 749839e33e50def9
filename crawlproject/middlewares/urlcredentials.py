"""UrlCredentialsMiddleware: a URL's ``user:pw@`` as ``Authorization: Basic``,
for the hosts of ``URL_CREDENTIALS_HOSTS`` only.

Credentials are removed from every URL when it enters the frontier
(:mod:`crawlproject.urls`); for a listed host they travel with the request
sealed under ``FRONTIER_SECRET`` and bound to the host
(``meta["url_credentials"]``). This middleware opens them as the request
leaves for the site and sets the header, as Scrapy's ``HttpAuthMiddleware``
does with ``http_user``/``http_pass`` for its ``http_auth_domain``: never for
another host (a redirect elsewhere keeps the meta, not the right), never over
an ``Authorization`` header the request has. The header is not stored again
(the scheduler drops it from a retry or redirect: it is made again here).

Off (``NotConfigured``) unless ``URL_CREDENTIALS_HOSTS`` lists a host.
Stats: ``urls/credentials_sent``, ``urls/credentials_refused`` (a token that
does not open for the request's host: another host, another secret, altered).
"""

from __future__ import annotations

import logging

from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from w3lib.http import basic_auth_header

from crawlproject.defaults import setting
from crawlproject.urls import CREDENTIALS_META, canonical_host, seal_from_settings

logger = logging.getLogger(__name__)


class UrlCredentialsMiddleware:
    """Sealed URL credentials to ``Authorization: Basic`` (module docstring)."""

    def __init__(self, hosts, seal, stats=None):
        self.hosts = frozenset(canonical_host(h) for h in hosts)
        self.seal = seal
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler):
        hosts = setting(crawler.settings, "URL_CREDENTIALS_HOSTS")
        if not hosts:
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        seal = seal_from_settings(crawler.settings)
        if seal is None:   # the canonicaliser says so, once a host, and drops them
            raise NotConfigured("URL_CREDENTIALS_HOSTS needs FRONTIER_SECRET")
        return cls(hosts, seal, crawler.stats)

    def process_request(self, request, spider=None):
        token = request.meta.get(CREDENTIALS_META)
        if token is None or b"Authorization" in request.headers:
            return None
        host = canonical_host(urlparse_cached(request).hostname or "")
        if host not in self.hosts:
            return None
        userinfo = self.seal.open(host, token)
        if userinfo is None:
            self.stats.inc_value("urls/credentials_refused")
            return None
        user, _, password = userinfo.partition(":")
        request.headers[b"Authorization"] = basic_auth_header(user, password)
        self.stats.inc_value("urls/credentials_sent")
        return None
