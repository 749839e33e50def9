"""Scrapy settings of the crawlproject example project.

Only this project's choices: every setting crawlproject adds has its default
in crawlproject/defaults.py (the same in a user's own project), and this file
sets one only where the project differs. The connection settings (``REDIS_URL``,
``MONGO_URI``, ``MONGO_DATABASE``, ``MONGO_SPOOL_DIR``, ``NODE_ID``...) read the
environment variable of the same name, else the local defaults the embedded
services (``python -m devtools.services up``) listen on. The README lists
every setting.
"""

import os

from scrapy.settings import default_settings as _scrapy_defaults

BOT_NAME = "crawlproject"
SPIDER_MODULES = ["crawlproject.spiders"]
NEWSPIDER_MODULE = "crawlproject.spiders"
# `scrapy crawl` that exits non-zero when the crawl did not finish normally.
COMMANDS_MODULE = "crawlproject.commands"

ROBOTSTXT_OBEY = True
CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 16
# Scrapy starts CONCURRENT_ITEMS worker tasks for every response's output,
# however little it holds (100 by default); 32 costs a node less CPU per page
# (BENCHMARKS.md §8).
# The MongoDB pipeline groups items across
# responses, so 32 per response loses nothing; raise it for pages that yield
# hundreds of items each.
CONCURRENT_ITEMS = 32
DOWNLOAD_TIMEOUT = 30   # a deadline for the whole download: a body that drips ends there
# Scrapy's 1 GiB would let one page take a node's memory: a 2 KB brotli bomb decompressed
# to 2.1 GiB (issue 46). 16 MiB is far above any HTML page and is checked on the
# decompressed size while decompressing (LimitedHttpCompressionMiddleware).
DOWNLOAD_MAXSIZE = 16 * 1024 * 1024
DOWNLOAD_WARNSIZE = 4 * 1024 * 1024
# Scrapy's HTTP/1.1 client with a bound on the response headers (DOWNLOAD_HEADERS_MAXSIZE,
# DOWNLOAD_HEADERS_MAXCOUNT); the rendering and impersonation add-ons replace it with
# their handlers, which have the same bounds.
DOWNLOAD_HANDLERS = {"http": "crawlproject.limits.headers.BoundedHTTP11DownloadHandler",
                     "https": "crawlproject.limits.headers.BoundedHTTP11DownloadHandler"}
REMOTE_CONTROL_ENABLED = False
TELNETCONSOLE_ENABLED = False
FEED_EXPORT_ENCODING = "utf-8"
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")

# The shared frontier on Redis (crawlproject.scheduler): leased at-least-once
# delivery, Bloom-filter dedupe in the same atomic call as the enqueue, JSON
# payloads. A dead node's requests come back within ~12 s (SCHEDULER_LEASE_TTL).
SCHEDULER = "crawlproject.scheduler.RedisScheduler"
DOWNLOADER_MIDDLEWARES = {
    # robots.txt fetched once per site for the cluster, under the site's limits
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "crawlproject.robots.ClusterRobotsTxtMiddleware": 100,
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    # URL credentials as Basic auth, for the hosts of URL_CREDENTIALS_HOSTS only
    "crawlproject.middlewares.urlcredentials.UrlCredentialsMiddleware": 310,
    "crawlproject.middlewares.retry.BackoffRetryMiddleware": 550,
    "crawlproject.middlewares.slowdown.FrontierPolitenessMiddleware": 560,
    # Scrapy's decompression (bounded by DOWNLOAD_MAXSIZE), its refusals dead-lettered
    "scrapy.downloadermiddlewares.httpcompression.HttpCompressionMiddleware": None,
    "crawlproject.limits.compression.LimitedHttpCompressionMiddleware": 590,
    # Scrapy's redirects, each hop a request of its own host (its slot, its
    # robots.txt); loops and over-long chains dead-lettered with the chain
    "scrapy.downloadermiddlewares.redirect.MetaRefreshMiddleware": None,
    "crawlproject.middlewares.redirect.FrontierMetaRefreshMiddleware": 580,
    "scrapy.downloadermiddlewares.redirect.RedirectMiddleware": None,
    "crawlproject.middlewares.redirect.FrontierRedirectMiddleware": 600,
    # after HttpCompressionMiddleware (590): checks the page the callback would get
    "crawlproject.rendering.middleware.RenderIfMissingMiddleware": 585,
    "crawlproject.proxies.middleware.ProxyPoolMiddleware": 600,
    "crawlproject.identity.middleware.IdentityMiddleware": 610,
    "crawlproject.rendering.middleware.RenderingMiddleware": 620,
    # before CookiesMiddleware (700): a session's cookies carried by its request
    "crawlproject.identity.cookies.SessionCookiesMiddleware": 690,
    # after the proxies are chosen (600, 750): IP-literal URLs and proxies checked
    # before any connection; refusals dead-lettered with the reason, never retried
    "crawlproject.egress.middleware.EgressMiddleware": 760,
    # after HttpCompressionMiddleware (590) on the way back: hashes the decoded body
    "crawlproject.recrawl.middleware.RecrawlMiddleware": 580,
    # sitemaps as seeds, off unless SITEMAPS_ENABLED or a spider's sitemap_seeds
    # (reads decoded bodies: after HttpCompressionMiddleware, before recrawl)
    "crawlproject.sitemaps.SitemapSeeds": 587,
}
SPIDER_MIDDLEWARES = {
    "scrapy.spidermiddlewares.referer.RefererMiddleware": None,
    "crawlproject.middlewares.referer.SeedRefererMiddleware": 700,
    "crawlproject.identity.cookies.SessionCookiesSpiderMiddleware": 650,
    "crawlproject.recrawl.middleware.RecrawlSpiderMiddleware": 950,   # sees the callback's output
    # Crawler traps and meta robots (crawlproject/traps/, docs/traps.md), on every
    # callback's output, next to the spider: meta robots first, then the cap on the
    # requests of one response (what is over costs no other middleware's work), both
    # before the recrawl's page record (950) sees the items; Scrapy's URL-length check
    # replaced by one that spares seeds and logs once per site.
    "crawlproject.traps.metarobots.MetaRobotsMiddleware": 970,
    "crawlproject.traps.pagerequests.PageRequestsMiddleware": 960,
    "scrapy.spidermiddlewares.urllength.UrlLengthMiddleware": None,
    "crawlproject.traps.urllength.UrlLengthMiddleware": 800,
    "crawlproject.traps.pathrepeat.PathRepeatMiddleware": 810,
    # with FRONTIER_PARTITIONS > 1: an ack waits only for the requests its own callback made
    "crawlproject.middlewares.lineage.LineageMiddleware": 990,
}
# Politeness is enforced by the frontier for all nodes together (see
# crawlproject/frontier/sitelimits.py): DOWNLOAD_DELAY is the interval between
# request starts of one host across the cluster, CONCURRENT_REQUESTS_PER_DOMAIN
# the most requests of one host in flight across the cluster; FRONTIER_*
# settings tune it. The proxy pool (crawlproject/proxies/,
# PROXY_POOL_ENABLED) is off: no pool is configured (docs/middlewares.md).

# Where requests may go (crawlproject/egress/, docs/frontier.md): public
# addresses, plus loopback here, because this project's own crawls are local:
# the demo shop and every test site listen on 127.0.0.x. A node crawling the
# web from this project's settings should drop "loopback" (Redis, a local admin
# page would be reachable from any link or seed otherwise).
DOWNLOAD_ALLOWED_NETWORKS = ["loopback"]

# Seeds (see crawlproject.spiders.seeded.RedisSpider) are untrusted: the only
# meta keys a seed may set (see crawlproject/policy.py).
SEED_META_ALLOW = ["campaign"]

# Items are validated (crawlproject.pipelines.validation), then stored by
# crawlproject.pipelines.mongo: bulk idempotent writes keyed on a unique
# field, retried through outages and spooled to local files meanwhile.
# docs/pipelines.md describes every setting.
ITEM_PIPELINES = {
    "crawlproject.pipelines.validation.ValidationPipeline": 300,
    "crawlproject.pipelines.mongo.MongoPipeline": 800,
}

# Prometheus endpoint per node (crawlproject/extensions/metrics.py),
# OpenTelemetry spans per request (crawlproject/extensions/tracing.py), both
# opt-in, and the incremental recrawl's feeder (crawlproject/recrawl/extension.py,
# RECRAWL_ENABLED, docs/recrawl.md), off by default.
EXTENSIONS = {"crawlproject.extensions.metrics.PrometheusMetrics": 500,
              "crawlproject.extensions.tracing.RequestTracing": 510,
              "crawlproject.recrawl.extension.RecrawlFeeder": 520,
              "crawlproject.extensions.gctuning.GcFreeze": 530,
              # a heartbeat file for liveness probes, opt-in (LIVENESS_ENABLED)
              "crawlproject.extensions.liveness.Liveness": 540}
# Scrapy's remote control is off (REMOTE_CONTROL_ENABLED above) and not even
# loaded: its module imports aiohttp's web server and makes an SSL context,
# about 0.2 s of CPU at every node start. Listing it as None in EXTENSIONS is
# not enough: Scrapy 2.19 imports every listed path to compare it with the base
# (Settings.get_component_priority_dict_with_base), so it is left out of the
# base itself. To turn it on, delete these lines.
EXTENSIONS_BASE = {path: order for path, order in _scrapy_defaults.EXTENSIONS_BASE.items()
                   if path != "scrapy.extensions.remote_control.RemoteControl"}
# Freeze the start-up heap for the garbage collector when the spider opens
# (a quarter of a node's CPU went to walking it: extensions/gctuning.py).
GC_FREEZE_ENABLED = True

# JavaScript rendering (crawlproject.rendering, crawlproject.rendering.middleware):
# the add-on routes http/https through scrapy-playwright's handler (only requests
# marked for rendering use Chromium), launches the system Chromium (CHROMIUM_PATH
# setting or environment variable, else found in the usual places), retries pages
# lost to browser errors and blocks RENDER_BLOCK_RESOURCES. docs/middlewares.md.
# The crawlproject add-on (crawlproject/addon.py) installs what this file lists above
# and the defaults of crawlproject/defaults.py; the lists above win, component by
# component, and name what this project adds (rendering, recrawl, extensions).
# Browser TLS and HTTP/2 of each identity (crawlproject.impersonate, the
# impersonate extra): off unless IMPERSONATE_ENABLED = True.
ADDONS = {"crawlproject.addon.Addon": 0,   # the defaults, for `scrapy settings --get NAME`
          "crawlproject.rendering.RenderingAddon": 0,
          "crawlproject.impersonate.ImpersonateAddon": 0,
          "crawlproject.extensions.jsonlog.JsonLogsAddon": 0}   # LOG_JSON
