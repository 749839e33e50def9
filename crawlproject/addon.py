"""The crawlproject add-on: one line in a Scrapy project's ``settings.py``::

    ADDONS = {"crawlproject.addon.Addon": 0}

:class:`Addon` installs what a node of the shared frontier needs (what the README's
settings block listed line by line before it):

* the scheduler (:data:`SETTINGS`: ``SCHEDULER``), ``TWISTED_REACTOR``, Scrapy's
  remote control and telnet console off, the body limits and download deadline, at Scrapy's
  ``addon`` priority: a value of the project's ``settings.py``, ``-s`` or a
  spider's ``custom_settings`` wins;
* the downloader and spider middlewares (:data:`DOWNLOADER_MIDDLEWARES`,
  :data:`SPIDER_MIDDLEWARES`) at their orders, and the Scrapy ones they replace
  set to ``None``; the item pipelines (:data:`ITEM_PIPELINES`); the download
  handlers (:data:`DOWNLOAD_HANDLERS`). A component the project already lists,
  under any of its paths (an old path before the capability packages, or the
  README's former block pasted too), keeps the project's order or ``None``: no
  component is installed twice and a project can still switch one off;
* the default of every crawlproject setting (:mod:`crawlproject.defaults`) at
  ``default`` priority, so ``scrapy settings --get NAME`` shows it (with
  ``COMMANDS_MODULE = "crawlproject.commands"``, whose ``settings`` command
  applies the add-ons first, as a crawl does). The settings read from the
  environment (:data:`crawlproject.defaults.ENVIRONMENT`) get the environment
  variable's value there, else the default; a value of the project's wins.

Not installed: ``COMMANDS_MODULE`` (Scrapy reads it from ``settings.py`` before any
add-on loads, so it stays a line of its own there), and the rendering and
impersonation add-ons (``crawlproject.rendering.RenderingAddon``,
``crawlproject.impersonate.ImpersonateAddon``), which a project adds next to this
one; their handlers replace this one's in either order.
"""

from __future__ import annotations

import copy
import os

from scrapy.utils.misc import load_object

from crawlproject.defaults import DEFAULTS, ENVIRONMENT

__all__ = ["Addon", "DOWNLOADER_MIDDLEWARES", "DOWNLOAD_HANDLERS", "ITEM_PIPELINES",
           "SETTINGS", "SPIDER_MIDDLEWARES"]

#: Scalar settings, installed at ``addon`` priority.
SETTINGS = {
    "SCHEDULER": "crawlproject.scheduler.RedisScheduler",      # dedupe is built in
    "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    # Scrapy's HTTP endpoint that runs posted code: not on a crawl node
    "REMOTE_CONTROL_ENABLED": False,
    # Scrapy's telnet console: a Python shell into the crawl on a local port, whose
    # password Scrapy logs at INFO (into every node's log and log collector)
    "TELNETCONSOLE_ENABLED": False,
    # Scrapy's 1 GiB let a 2 KB brotli bomb take 2.1 GiB: bodies in MiB, checked
    # while decompressing (LimitedHttpCompressionMiddleware)
    "DOWNLOAD_MAXSIZE": 16 * 1024 * 1024,
    "DOWNLOAD_WARNSIZE": 4 * 1024 * 1024,
    "DOWNLOAD_TIMEOUT": 30,        # s for the whole download: a body that drips ends
}

#: Downloader middlewares and their orders; None: Scrapy's, replaced by ours.
DOWNLOADER_MIDDLEWARES = {
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "crawlproject.robots.ClusterRobotsTxtMiddleware": 100,   # one robots.txt per site
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "crawlproject.middlewares.urlcredentials.UrlCredentialsMiddleware": 310,
    "crawlproject.middlewares.retry.BackoffRetryMiddleware": 550,
    "crawlproject.middlewares.slowdown.FrontierPolitenessMiddleware": 560,
    "scrapy.downloadermiddlewares.httpcompression.HttpCompressionMiddleware": None,
    "crawlproject.limits.compression.LimitedHttpCompressionMiddleware": 590,  # bombs refused
    "scrapy.downloadermiddlewares.redirect.MetaRefreshMiddleware": None,
    "crawlproject.middlewares.redirect.FrontierMetaRefreshMiddleware": 580,
    "scrapy.downloadermiddlewares.redirect.RedirectMiddleware": None,
    "crawlproject.middlewares.redirect.FrontierRedirectMiddleware": 600,  # each hop its host's
    "crawlproject.proxies.middleware.ProxyPoolMiddleware": 600,   # PROXY_POOL_ENABLED
    "crawlproject.identity.middleware.IdentityMiddleware": 610,   # User-Agent per session
    "crawlproject.identity.cookies.SessionCookiesMiddleware": 690,
    "crawlproject.egress.middleware.EgressMiddleware": 760,       # where requests may go
    "crawlproject.sitemaps.SitemapSeeds": 587,                    # SITEMAPS_ENABLED
}

#: Spider middlewares and their orders; None: Scrapy's, replaced by ours.
SPIDER_MIDDLEWARES = {
    "scrapy.spidermiddlewares.referer.RefererMiddleware": None,
    "crawlproject.middlewares.referer.SeedRefererMiddleware": 700,
    "crawlproject.identity.cookies.SessionCookiesSpiderMiddleware": 650,
    "crawlproject.middlewares.lineage.LineageMiddleware": 990,    # FRONTIER_PARTITIONS > 1
    "crawlproject.traps.metarobots.MetaRobotsMiddleware": 970,    # nofollow / noindex
    "crawlproject.traps.pagerequests.PageRequestsMiddleware": 960,  # requests per page capped
    "scrapy.spidermiddlewares.urllength.UrlLengthMiddleware": None,
    "crawlproject.traps.urllength.UrlLengthMiddleware": 800,      # long links; seeds pass
    "crawlproject.traps.pathrepeat.PathRepeatMiddleware": 810,    # /a/b/a/b/a/b/ links
}

#: Item pipelines and their orders.
ITEM_PIPELINES = {
    "crawlproject.pipelines.validation.ValidationPipeline": 300,  # invalid items dropped
    "crawlproject.pipelines.mongo.MongoPipeline": 800,            # bulk, idempotent
}

#: Download handlers: Scrapy's HTTP/1.1 client with bounded response headers
#: (DOWNLOAD_HEADERS_MAXSIZE/MAXCOUNT). Installed only for a scheme with no
#: handler of the project's or of another add-on (rendering, impersonation).
DOWNLOAD_HANDLERS = {"http": "crawlproject.limits.headers.BoundedHTTP11DownloadHandler",
                     "https": "crawlproject.limits.headers.BoundedHTTP11DownloadHandler"}


class Addon:
    """Scrapy add-on: a node of the shared frontier (see the module docstring)."""

    def update_settings(self, settings) -> None:
        """Install the components, settings and defaults the project did not set."""
        for name, value in SETTINGS.items():
            settings.set(name, value, "addon")   # ignored under a higher priority
        for name, components in (("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
                                 ("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
                                 ("ITEM_PIPELINES", ITEM_PIPELINES)):
            _setdefault_components(settings, name, components)
        handlers = settings["DOWNLOAD_HANDLERS"]
        for scheme, handler in DOWNLOAD_HANDLERS.items():
            if handlers.get(scheme) is None:
                handlers.set(scheme, handler, "addon")
        for name, default in DEFAULTS.items():
            if name in ENVIRONMENT:
                # the environment before the default, as defaults.setting() reads it;
                # at "default" priority, so settings.py and -s still win over both
                default = os.environ.get(name) or default
            settings.setdefault(name, copy.deepcopy(default), "default")


def _setdefault_components(settings, name: str, components: dict) -> None:
    """Add each of *components* to the component dict *name* unless it holds the
    same object already, under any path (Scrapy's
    ``setdefault_in_component_priority_dict``, by path: the setting keeps the
    readable paths ``scrapy settings --get`` prints). One pass, one write."""
    current = settings.getdict(name)
    present = set()
    for key in current:
        present.add(key)
        try:
            present.add(load_object(key))
        except (ImportError, NameError, TypeError, ValueError, AttributeError):
            pass  # the project's own path that does not load: Scrapy says so at start
    added = False
    for path, order in components.items():
        if path in present or load_object(path) in present:
            continue
        current[path] = order
        added = True
    if added:
        # the dict's own priority: the added keys do not outrank or lower the project's
        settings.set(name, current, settings.getpriority(name) or 0)
