"""Scrapy settings of the crawlproject example project.

Connection settings read environment variables, with local defaults that the
embedded services (``python -m crawlproject.services up``) listen on. The
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

BOT_NAME = "crawlproject"
SPIDER_MODULES = ["crawlproject.spiders"]
NEWSPIDER_MODULE = "crawlproject.spiders"
# `scrapy crawl` that exits non-zero when the crawl did not finish normally.
COMMANDS_MODULE = "crawlproject.commands"

ROBOTSTXT_OBEY = True
CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 16
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
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "crawlproject.middlewares.retry.BackoffRetryMiddleware": 550,
    "crawlproject.middlewares.politeness.FrontierPolitenessMiddleware": 560,
    "crawlproject.middlewares.rendering.RenderingMiddleware": 620,
    # after HttpCompressionMiddleware (590): checks the page the callback would get
    "crawlproject.middlewares.rendering.RenderIfMissingMiddleware": 585,
}
# Politeness is enforced by the frontier for all nodes together (see
# crawlproject/frontier/politeness.py): DOWNLOAD_DELAY is the interval between
# request starts of one host across the cluster, CONCURRENT_REQUESTS_PER_DOMAIN
# the most requests of one host in flight across the cluster.
FRONTIER_POLITENESS = True
FRONTIER_POLITENESS_KEY = "host"        # or "domain" (public suffix list), "ip"
FRONTIER_PARTITIONS = 1                 # more spreads the frontier over Redis Cluster masters
FRONTIER_HOST_LIMITS = {}               # {"example.com": {"delay": 2.0, "concurrency": 1}}

# Seeds (see crawlproject.spiders.seeded.RedisSpider)
REDIS_START_URLS_KEY = START_URLS     # "%(name)s:start_urls", scrapy-redis' key
REDIS_START_URLS_BATCH_SIZE = 100
SEEDS_POLL_INTERVAL = 1.0
# Seeds are untrusted: the only meta keys a seed may set (see crawlproject/policy.py).
SEED_META_ALLOW = ["campaign"]
MAX_IDLE_TIME_BEFORE_CLOSE = int(env_default("MAX_IDLE_TIME_BEFORE_CLOSE", "0"))

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

ITEM_PIPELINES = {
    "crawlproject.pipelines.validation.ValidationPipeline": 300,
    "crawlproject.pipelines.mongo.MongoPipeline": 800,
}

# --- JavaScript rendering (crawlproject.rendering, crawlproject.middlewares.rendering) ----
# The add-on routes http/https through scrapy-playwright's handler (only requests
# marked for rendering use Chromium), launches the system Chromium (CHROMIUM_PATH
# setting or environment variable, else found in the usual places), retries pages
# lost to browser errors and blocks RENDER_BLOCK_RESOURCES. docs/middlewares.md.
ADDONS = {"crawlproject.rendering.RenderingAddon": 0}
RENDERING_ENABLED = True
RENDER_URL_PATTERNS = []                # regexes of URLs always rendered (+ spider.render_rules)
RENDER_IF_MISSING = {}                  # {url-regex: css}: static page without it → render
RENDER_WAIT_FOR_SELECTOR = None         # css, or {url-regex: css}: rendered pages wait for it
RENDER_WAIT_TIMEOUT = 15.0              # seconds a rendered page waits for its selector
RENDER_BLOCK_RESOURCES = ["image", "font", "media"]  # never fetched by the browser
RENDER_MAX_CONTEXTS = 8                 # browser contexts (one per proxy × identity) at most
PLAYWRIGHT_MAX_PAGES_PER_CONTEXT = 4    # pages rendering at once in one context
