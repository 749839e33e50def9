"""Scrapy settings of the crawlproject example project.

Connection settings read environment variables, with local defaults that the
embedded services (``python -m devtools.services up``) listen on. The
README lists every setting the project adds.
"""

import os

from crawlproject.connection import (
    DEFAULT_MONGO_DATABASE,
    DEFAULT_MONGO_URI,
    DEFAULT_REDIS_URL,
    env_default,
)
from crawlproject.keys import START_URLS
from crawlproject.proxies.pool import DEFAULT_BODY_PATTERNS, DEFAULT_REDIRECT_PATTERNS

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
DOWNLOAD_TIMEOUT = 30
REMOTE_CONTROL_ENABLED = False
TELNETCONSOLE_ENABLED = False
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
FEED_EXPORT_ENCODING = "utf-8"
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")

# --- Redis: one shared frontier for every node -------------------------------
REDIS_URL = env_default("REDIS_URL", DEFAULT_REDIS_URL)
REDIS_CLUSTER = env_default("REDIS_CLUSTER", "false").lower() in ("1", "true", "yes")

# The shared frontier (crawlproject.scheduler): leased at-least-once delivery,
# Bloom-filter dedupe in the same atomic call as the enqueue, JSON payloads.
SCHEDULER = "crawlproject.scheduler.RedisScheduler"
SCHEDULER_LEASE_TTL = 10            # a dead node's requests come back within ~12 s
SCHEDULER_HEARTBEAT_INTERVAL = 2
SCHEDULER_BATCH_SIZE = 100
SCHEDULER_FLUSH_INTERVAL = 0.05
DUPEFILTER_CAPACITY = 10_000_000
DUPEFILTER_ERROR_RATE = 0.001
CALLBACK_RETRY_TIMES = 2
RETRY_BACKOFF_BASE = 1.0
RETRY_BACKOFF_MAX = 60.0
DOWNLOADER_MIDDLEWARES = {
    # robots.txt fetched once per site for the cluster, under the site's limits
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "crawlproject.robots.ClusterRobotsTxtMiddleware": 100,
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "crawlproject.middlewares.retry.BackoffRetryMiddleware": 550,
    "crawlproject.middlewares.politeness.FrontierPolitenessMiddleware": 560,
    # after HttpCompressionMiddleware (590): checks the page the callback would get
    "crawlproject.rendering.middleware.RenderIfMissingMiddleware": 585,
    "crawlproject.proxies.middleware.ProxyPoolMiddleware": 600,
    "crawlproject.identity.middleware.IdentityMiddleware": 610,
    "crawlproject.rendering.middleware.RenderingMiddleware": 620,
    # before CookiesMiddleware (700): a session's cookies carried by its request
    "crawlproject.identity.cookies.SessionCookiesMiddleware": 690,
    # after HttpCompressionMiddleware (590) on the way back: hashes the decoded body
    "crawlproject.recrawl.middleware.RecrawlMiddleware": 580,
}
SPIDER_MIDDLEWARES = {
    "scrapy.spidermiddlewares.referer.RefererMiddleware": None,
    "crawlproject.middlewares.referer.SeedRefererMiddleware": 700,
    "crawlproject.identity.cookies.SessionCookiesSpiderMiddleware": 650,
    "crawlproject.recrawl.middleware.RecrawlSpiderMiddleware": 950,   # sees the callback's output
    # with FRONTIER_PARTITIONS > 1: an ack waits only for the requests its own callback made
    "crawlproject.middlewares.lineage.LineageMiddleware": 990,
}
# Politeness is enforced by the frontier for all nodes together (see
# crawlproject/frontier/politeness.py): DOWNLOAD_DELAY is the interval between
# request starts of one host across the cluster, CONCURRENT_REQUESTS_PER_DOMAIN
# the most requests of one host in flight across the cluster.
FRONTIER_POLITENESS = True
FRONTIER_POLITENESS_KEY = "host"        # or "domain" (public suffix list), "ip"
FRONTIER_PARTITIONS = 1                 # more spreads the frontier over Redis Cluster masters
FRONTIER_HOST_LIMITS = {}               # {"example.com": {"delay": 2.0, "concurrency": 1}}

# --- Proxy pool shared by all nodes (crawlproject/proxies/) ------------------
# Off by default: no pool is configured. Entries: http(s)://[user:pass@]host:port
# (no SOCKS: Scrapy cannot use it). The Redis key {<spider>}:proxies (set or
# hash) is read every PROXY_REFRESH_INTERVAL and may change during the crawl.
# A banned proxy rests for that host (exponential backoff with jitter); the
# request goes to another proxy, at most PROXY_BAN_MAX_TRIES times, then is
# dead-lettered as "banned". docs/middlewares.md, "## Proxies".
PROXY_POOL_ENABLED = False
PROXY_POOL = []                         # proxy URLs
PROXY_POOL_FILE = ""                    # one proxy URL a line (# comments)
PROXY_REFRESH_INTERVAL = 1.0            # seconds between flushes/reads of the shared state
PROXY_BAN_HTTP_CODES = [403, 429]       # 503 is a ban only with a body marker
PROXY_BAN_BODY_PATTERNS = list(DEFAULT_BODY_PATTERNS)   # regexes; on 2xx and 503 bodies
PROXY_BAN_REDIRECT_PATTERNS = list(DEFAULT_REDIRECT_PATTERNS)  # redirect targets
PROXY_BAN_BODY_MAX_BYTES = 65536        # body markers are searched in this much of the body
PROXY_BAN_MAX_TRIES = 5                 # proxies tried per request before "banned"
PROXY_BAN_BACKOFF_BASE = 30.0           # first ban of a proxy for a host: 15-30 s
PROXY_BAN_BACKOFF_MAX = 1800.0
PROXY_RETIRE_AFTER = 10                 # connection failures in a row that retire a proxy
PROXY_LATENCY_EWMA = 0.3                # weight of a new latency sample
# With no usable proxy at all (empty pool, every proxy retired, or a pool key of the
# wrong type) nodes log a WARNING each minute and show it in `crawlctl status` /
# `proxies` and the dashboard; after this many seconds requests are dead-lettered
# with reason "no_proxy" instead of waiting (replay them once proxies are back).
PROXY_POOL_EMPTY_MAX_WAIT = 300.0

# Seeds (see crawlproject.spiders.seeded.RedisSpider)
REDIS_START_URLS_KEY = START_URLS     # "%(name)s:start_urls", scrapy-redis' key
REDIS_START_URLS_BATCH_SIZE = 100
SEEDS_POLL_INTERVAL = 1.0
# Seeds are untrusted: the only meta keys a seed may set (see crawlproject/policy.py).
SEED_META_ALLOW = ["campaign"]
# Requests read back from the frontier or a page record are untrusted too: meta
# keys beyond the project's own and SEED_META_ALLOW (plus the spider's
# stored_meta_allow), and the proxies they may name (docs/frontier.md).
STORED_META_ALLOW = []
STORED_PROXY_ALLOW = []
MAX_IDLE_TIME_BEFORE_CLOSE = int(env_default("MAX_IDLE_TIME_BEFORE_CLOSE", "0"))

# --- Identity: User-Agent and matching headers per session (docs/middlewares.md) ---
# One browser identity per session (explicit meta["session"], else proxy and
# cookie jar, else host), the same on every node; USER_AGENT set explicitly or
# a spider's user_agent turns it off. Filters are fake-useragent's own names.
IDENTITY_ENABLED = True
IDENTITY_BROWSERS = ["Chrome", "Edge", "Firefox", "Safari"]
IDENTITY_OS = []                        # any; e.g. ["Windows", "Mac OS X", "Linux"]
IDENTITY_PLATFORMS = ["desktop"]        # "desktop", "mobile", "tablet"
IDENTITY_MIN_VERSION = 0.0              # browser major.minor, for every browser alike
IDENTITY_MIN_PERCENTAGE = 0.0           # usage share of the User-Agent in the data
IDENTITY_ROTATION = "session"           # "session", "request" or N requests (counted per node)
IDENTITY_SALT = ""                      # change it to give every session a new identity

# --- Referer: Scrapy's referrer policy for followed requests, defaults for seeds ---
REFERER_SEED_DEFAULT = "none"           # "none", "root" or "search"
REFERER_SEED_SEARCH_URL = "https://www.google.com/search?q={domain}"   # {domain} {host} {url}
REFERER_SEED_BY_DOMAIN = {}             # {"example.com": "root"}: a domain and its subdomains

# --- MongoDB -------------------------------------------------------------------
# Items are validated (crawlproject.pipelines.validation), then stored by
# crawlproject.pipelines.mongo: bulk idempotent writes keyed on a unique
# field, retried through outages and spooled to local files meanwhile.
# docs/pipelines.md describes every setting.
MONGO_PIPELINE_ENABLED = True
MONGO_URI = env_default("MONGO_URI", DEFAULT_MONGO_URI)
MONGO_DATABASE = env_default("MONGO_DATABASE", DEFAULT_MONGO_DATABASE)
MONGO_COLLECTION = "%(spider)s"           # also %(item)s: the item class, lower case
MONGO_UNIQUE_KEY = "url"                  # unless the item class sets mongo_key
MONGO_KEY_AS_ID = True                    # the key is the _id (False: ObjectId + unique index)
MONGO_CLIENT_OPTIONS = {}                 # extra pymongo client options (TLS files...)
MONGO_BULK_SIZE = 500                     # items per bulk write at most
MONGO_FLUSH_INTERVAL = 0.2                # seconds an item may wait for a busy writer
MONGO_FLUSH_WHEN_IDLE = True              # write at once when no write is in flight
MONGO_CONCURRENT_WRITES = 2               # bulk writes in flight at most
MONGO_WRITE_MODE = "auto"                 # "auto" (insert new keys first) or "upsert"
MONGO_SPOOL_AFTER = 5.0                   # seconds of retries before spooling a batch
MONGO_SPOOL_DIR = env_default("MONGO_SPOOL_DIR", "mongo-spool")  # relative: under .scrapy/
MONGO_PROBE_INTERVAL = 1.0                # seconds between checks during an outage
MONGO_CLOSE_WAIT = 300                    # seconds an idle node waits for MongoDB to store its spool
MONGO_SPOOL_HANDOFF = True                # at close, MongoDB still down: spool to Redis for any node
MONGO_SPOOL_HANDOFF_MAX_MB = 256          # most spool data one node hands to Redis
MONGO_RETRY_BACKOFF_BASE = 0.1
MONGO_RETRY_BACKOFF_MAX = 2.0
VALIDATION_ENABLED = True
VALIDATION_INVALID_COLLECTION = ""        # e.g. "invalid_items" to keep dropped items

# Prometheus endpoint per node (crawlproject/extensions/metrics.py),
# OpenTelemetry spans per request (crawlproject/extensions/tracing.py), both
# opt-in, and the incremental recrawl's feeder (crawlproject/recrawl/extension.py).
EXTENSIONS = {"crawlproject.extensions.metrics.PrometheusMetrics": 500,
              "crawlproject.extensions.tracing.RequestTracing": 510,
              "crawlproject.recrawl.extension.RecrawlFeeder": 520,
              "crawlproject.extensions.gctuning.GcFreeze": 530}
# Freeze the start-up heap for the garbage collector when the spider opens
# (a quarter of a node's CPU went to walking it: extensions/gctuning.py).
GC_FREEZE_ENABLED = True
GC_THRESHOLD = None                     # e.g. [10000, 10, 10]; None: CPython's
TRACING_ENABLED = False                 # True: a span per request, lease to ack (extra "tracing")
TRACING_EXPORTER = "otlp"               # otlp (HTTP) or console, unless the process has a provider
TRACING_ENDPOINT = ""                   # OTLP/HTTP URL; "": $OTEL_EXPORTER_OTLP_*ENDPOINT or localhost:4318
LOG_JSON = False                        # True: one JSON object per log line (JsonLogsAddon)
METRICS_ENABLED = False
METRICS_HOST = "127.0.0.1"              # 0.0.0.0 to let a Prometheus on another host scrape
METRICS_PORT = 9410                     # 0: a free port (logged)
ITEM_PIPELINES = {
    "crawlproject.pipelines.validation.ValidationPipeline": 300,
    "crawlproject.pipelines.mongo.MongoPipeline": 800,
}

# --- Incremental recrawl (crawlproject/recrawl/, docs/recrawl.md): opt-in --------
# Pages a rule covers get a record in MongoDB (<spider>_pages: validators, body
# hash, next visit); due pages go back into the frontier as conditional
# requests, a bounded batch at a time; 304 / unchanged pages skip parsing.
RECRAWL_ENABLED = False
RECRAWL_INTERVAL = 0                    # seconds between visits of any page (0: only the rules)
RECRAWL_ADAPTIVE = False                # halve the interval when changed, double it when not
RECRAWL_MIN_INTERVAL = 0                # adaptive bounds (0: interval / 16 and interval * 16)
RECRAWL_MAX_INTERVAL = 0
RECRAWL_PRIORITY = -100                 # revisits after fresh discoveries (priority 0)
RECRAWL_RULES = []                      # [{"pattern": "/product/", "interval": 3600, "adaptive": True}]
RECRAWL_CHECK_INTERVAL = 10.0           # seconds between looks for due pages
RECRAWL_BATCH_SIZE = 500                # due pages fed to the frontier per look, at most
RECRAWL_MAX_QUEUED = 5000               # no feeding while the frontier holds this many
RECRAWL_CLAIM_TIMEOUT = 3600.0          # a fed page not visited by then is due again
RECRAWL_GONE_COLLECTIONS = []           # item collections besides MONGO_COLLECTION's that
                                        # a page answering 404/410 may mark gone

# --- JavaScript rendering (crawlproject.rendering, crawlproject.rendering.middleware) ----
# The add-on routes http/https through scrapy-playwright's handler (only requests
# marked for rendering use Chromium), launches the system Chromium (CHROMIUM_PATH
# setting or environment variable, else found in the usual places), retries pages
# lost to browser errors and blocks RENDER_BLOCK_RESOURCES. docs/middlewares.md.
ADDONS = {"crawlproject.rendering.RenderingAddon": 0,
          "crawlproject.extensions.jsonlog.JsonLogsAddon": 0}   # LOG_JSON
RENDERING_ENABLED = True
RENDER_URL_PATTERNS = []                # regexes of URLs always rendered (+ spider.render_rules)
RENDER_IF_MISSING = {}                  # {url-regex: css}: static page without it → render
RENDER_WAIT_FOR_SELECTOR = None         # css, or {url-regex: css}: rendered pages wait for it
RENDER_WAIT_TIMEOUT = 15.0              # seconds a rendered page waits for its selector
RENDER_BLOCK_RESOURCES = ["image", "font", "media"]  # never fetched by the browser
RENDER_MAX_CONTEXTS = 8                 # browser contexts (one per proxy × identity) at most
RENDER_PROXY_BYPASS = None              # hosts a proxied browser context reaches directly
PLAYWRIGHT_MAX_PAGES_PER_CONTEXT = 4    # pages rendering at once in one context
