"""Default values of every setting crawlproject adds to Scrapy's.

The one place these defaults are written, as Scrapy keeps its own in
``scrapy/settings/default_settings.py``: components read a setting with
:func:`setting` (``setting(crawler.settings, "MONGO_BULK_SIZE")``), never with a
second default of their own, so a project that sets none of them (this one,
or a user's own project that enabled only some of the components) gets the
same values. Scrapy's own settings keep Scrapy's defaults: read them with
``settings.getint(...)`` and no default. crawlproject/settings.py holds only
this project's choices that differ from these.

Settings of :data:`ENVIRONMENT` fall back to the environment variable of the
same name before the default (``REDIS_URL``, ``MONGO_URI``...).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from crawlproject import keys

# --- Connections (crawlproject/connection.py) ----------------------------------
REDIS_URL = "redis://127.0.0.1:6379/0"      # shared frontier; None/"": REDIS_HOST/PORT
REDIS_CLUSTER = False                       # REDIS_URL is a Redis Cluster (also ?cluster=true)
REDIS_HOST = None                           # scrapy-redis' name, used without REDIS_URL
REDIS_PORT = None                           # scrapy-redis' name, used without REDIS_URL
REDIS_PARAMS: dict = {}                     # extra redis-py client options
MONGO_URI = "mongodb://127.0.0.1:27017/"    # MongoDB of the items
MONGO_DATABASE = "crawlproject"             # database of the items
MONGO_CLIENT_OPTIONS: dict = {}             # extra pymongo client options (TLS files...)
NODE_ID = None                              # this node's name; None: the host name

# --- Frontier scheduler (crawlproject/scheduler.py) ----------------------------
SCHEDULER_PREFETCH = 0                      # leased ahead; 0: max(16, CONCURRENT_REQUESTS // 4)
SCHEDULER_START_BURST = 0                   # requests to the engine per loop turn; 0: no limit
SCHEDULER_BATCH_SIZE = 100                  # new requests that trigger an immediate flush
SCHEDULER_FLUSH_INTERVAL = 0.05             # seconds between frontier calls while busy
SCHEDULER_MIN_SYNC_INTERVAL = 0.02          # calls coalesced to one per interval at most
SCHEDULER_LOCAL_DEDUPE_SIZE = 20_000        # fingerprints a node remembers having sent
SCHEDULER_IDLE_POLL = 0.2                   # seconds between polls of an empty frontier
SCHEDULER_IDLE_POLL_MAX = 1.0               # ... doubling after each empty poll up to this
SCHEDULER_LOG_INTERVAL = 60.0               # seconds between frontier size log lines
SCHEDULER_LEASE_TTL = 10.0                  # seconds after the last heartbeat: leases come back
SCHEDULER_HEARTBEAT_INTERVAL = 2.0          # seconds between lease renewals
SCHEDULER_DEAD_MAX = 100_000                # records kept in {spider}:dead
SCHEDULER_INVALID_MAX = 10_000              # records kept in {spider}:invalid
CONTROL_POLL_INTERVAL = 1.0                 # seconds between reads of pause / drain / stop
CONTROL_ON_START = "wait"                   # started into a stop/drain: wait, or exit (code 1)
CALLBACK_RETRY_TIMES = 2                    # retries of a page whose callback raised
RETRY_BACKOFF_BASE = 1.0                    # seconds: retry n waits ~base * 2**(n-1)
RETRY_BACKOFF_MAX = 60.0                    # longest retry wait (s)
# scrapy-redis' scheduler settings, as a project that moved here has them
# (crawlproject/scheduling/compat.py: honoured, or refused with what to use instead)
SCHEDULER_PERSIST = True                    # what the frontier does; False is refused
SCHEDULER_FLUSH_ON_START = False            # True is refused: crawlctl reset --keep-seeds
SCHEDULER_IDLE_BEFORE_CLOSE = 0.0           # seconds a node whose crawl is done waits to close

# --- Dedupe: the frontier's Bloom filter (crawlproject/frontier/bloom.py) -------
DUPEFILTER_CAPACITY = 10_000_000            # planned URLs of the first layer
DUPEFILTER_ERROR_RATE = 0.001               # false-positive rate, even past capacity
DUPEFILTER_GROWTH = 4.0                     # capacity factor of each new layer
DUPEFILTER_TIGHTENING = 0.1                 # error-rate ratio of each new layer
DUPEFILTER_SHARD_BITS = 2**26               # bits per Redis string (8 MiB)
DUPEFILTER_KEY = keys.DUPEFILTER            # key of the standalone RedisBloomDupeFilter
SCHEDULER_DUPEFILTER_KEY = None             # scrapy-redis' name; wins over DUPEFILTER_KEY when set

# --- Politeness for the whole cluster (scheduling/sitepoliteness.py) -----------
FRONTIER_POLITENESS = True                  # per-site limits enforced by the frontier
FRONTIER_POLITENESS_KEY = "host"            # what a site is: host, domain or ip
FRONTIER_HONOUR_DOWNLOAD_SLOT = False       # meta["download_slot"] is the site
FRONTIER_HOST_LIMITS: dict = {}             # {"example.com": {"delay": 2.0, "concurrency": 1}}
FRONTIER_BACKOFF_HTTP_CODES = [429, 503]    # answers that slow a site down for every node
FRONTIER_RETRY_AFTER_MAX = 300.0            # longest block (s) a Retry-After may ask
FRONTIER_BACKOFF_MAX = 60.0                 # longest backoff interval (s) without Retry-After
FRONTIER_BACKOFF_TOLERANCE = 0.2            # share of recent 429/503 answers that slows a site
FRONTIER_BACKOFF_WINDOW = 10                # answers in that average (at least the site's concurrency)
FRONTIER_BACKOFF_BASE = 1.0                 # first backoff interval (s), or twice the delay
FRONTIER_DELAY_MARGIN = 0.02                # intervals this much longer than asked,
FRONTIER_DELAY_MARGIN_MIN = 0.02            # ... and at least this many seconds longer
FRONTIER_SITE_BUDGET = 100_000              # most new pages queued per site; 0: no budget
FRONTIER_CRAWL_BUDGET = 0                   # most new pages queued by the crawl; 0: no budget
FRONTIER_PARTITIONS = 1                     # hash-tagged partitions (Redis Cluster masters)
FRONTIER_LINEAGE_ENABLED = True             # with partitions: an ack waits for its own requests

# --- Frontier larger than RAM: the backlog in MongoDB (frontier/backlog.py) ----
# Per politeness key Redis keeps a window W = clamp(ceil(WINDOW_SECONDS x pace),
# WINDOW_MIN, WINDOW_MAX) entries (BUbiNG's rule: the site's pace never waits on
# a refill; pace: 1 / the key's interval, WINDOW_MAX without one); once the
# partition queues over SPILL_ABOVE in Redis, entries beyond 1.25 W go to MongoDB.
FRONTIER_BACKLOG_ENABLED = True             # entries beyond a key's window go to MongoDB
FRONTIER_BACKLOG_COLLECTION = "frontier_backlog"  # in MONGO_DATABASE, shared (field s: spider)
FRONTIER_BACKLOG_WRITE_CONCERN = "majority"  # w of spills/removals: acknowledged = durable
FRONTIER_BACKLOG_TIMEOUT = 10.0             # seconds a backlog call may take (then: unavailable)
FRONTIER_BACKLOG_LEASE_TTL = 30.0           # seconds a mover holds a key (Redis time, fenced)
FRONTIER_BACKLOG_SETTLE = 2.0               # s a move waits for a commit to reach the AOF (< 7.2)
FRONTIER_BACKLOG_WINDOW_SECONDS = 300.0     # a key's window: this many seconds of its fetches
FRONTIER_BACKLOG_WINDOW_MIN = 4             # ... but at least this many entries
FRONTIER_BACKLOG_WINDOW_MAX = 1000          # ... and at most this many (a key without interval)
FRONTIER_BACKLOG_SPILL_ABOVE = 1_000_000    # nothing spills while a partition queues fewer
FRONTIER_REFILL_BATCH = 256                 # entries one refill moves from MongoDB to Redis
FRONTIER_BACKLOG_CRASH_AT = None            # test hook: "spill:2"... the node SIGKILLs itself there

# --- robots.txt once per site for the cluster (crawlproject/robots/) ----------
ROBOTSTXT_CACHE_TTL = 86_400.0              # seconds a 2xx / 4xx robots.txt is kept
ROBOTSTXT_CACHE_MAX_AGE = 2_592_000.0       # seconds its rules serve while it is unreachable
ROBOTSTXT_UNAVAILABLE_TTL = 60.0            # first wait to fetch a 429/5xx/unreachable one again
ROBOTSTXT_UNAVAILABLE_MAX_TTL = 3_600.0     # ... doubled per failure in a row, at most this
ROBOTSTXT_WAIT = 0.5                        # seconds a page waits first, then twice as long...
ROBOTSTXT_MAX_WAIT = 900.0                  # seconds since it first waited: dead-lettered
ROBOTSTXT_MAX_REDIRECTS = 5                 # redirects of robots.txt followed (RFC: at least 5)
ROBOTSTXT_MAX_RULES = 1_000                 # allow/disallow rules kept for this crawler
ROBOTSTXT_FETCH_LOCK_TTL = 120.0            # seconds one node holds a site's fetch lock
ROBOTSTXT_LOCAL_SITES = 10_000              # sites whose parsed rules a node keeps

_session_params = (r"jsessionid|phpsessid|sid|sessid|sessionid|session_id|session-id"
                   r"|aspsessionid[a-z]{8}|cfid|cftoken|zenid|oscsid")
# --- URLs and hosts in one canonical form (crawlproject/urls.py) ----------------
URL_CANONICAL_ENABLED = True                # host (case, IDN, trailing dot) and port in the URL
URL_STRIP_SESSION_IDS = True                # session-id parameters removed from URLs
URL_SESSION_PARAMS = _session_params        # session-id parameter names (a regex, any case)
URL_CREDENTIALS_HOSTS: list = []            # hosts whose URL credentials become Basic auth

# --- Crawler traps and meta robots (crawlproject/traps/) -----------------------
# (URLLENGTH_LIMIT, Scrapy's: 2083 characters; links only, seeds pass)
PATH_REPEAT_LIMIT = 2                       # times a segment run may occur in a row; 0: off
PAGE_REQUESTS_LIMIT = 10_000                # requests one response may add; 0: no limit
META_ROBOTS_ENABLED = True                  # meta robots and X-Robots-Tag obeyed
META_ROBOTS_NOFOLLOW = True                 # a nofollow page's requests are dropped
META_ROBOTS_NOINDEX = True                  # a noindex page's items are dropped
META_ROBOTS_NAMES: list = []                # our names; []: ROBOTSTXT_USER_AGENT's, else BOT_NAME

# --- Seeds (crawlproject/spiders/seeded.py, crawlproject/policy.py) ------------
REDIS_START_URLS_KEY = keys.START_URLS      # where seeds are read (scrapy-redis' name)
REDIS_START_URLS_AS_SET = False             # seeds in a set
REDIS_START_URLS_AS_ZSET = False            # seeds in a sorted set (highest score first)
REDIS_START_URLS_BATCH_SIZE = 100           # seeds taken per atomic pop
REDIS_ENCODING = "utf-8"                    # encoding of seeds
SEEDS_POLL_INTERVAL = 1.0                   # seconds between polls of an empty seed key
SEEDS_MAX_PENDING = 0                       # back-pressure; 0: 2 x REDIS_START_URLS_BATCH_SIZE
SEEDS_CLAIM_TTL = 15.0                      # seconds a taken seed stays claimed
SEEDS_INVALID_MAX = 10_000                  # records kept in <spider>:start_urls:invalid
MAX_IDLE_TIME_BEFORE_CLOSE = 0.0            # close after N idle seconds cluster-wide; 0: never

# --- Sitemaps as a seed source (crawlproject/sitemaps/; off unless asked) -------
SITEMAPS_ENABLED = False                    # robots.txt Sitemap: lines as seeds (or sitemap_seeds)
SITEMAPS_TRY_DEFAULT = False                # /sitemap.xml when robots.txt lists none
SITEMAPS_MAX_PER_SITE = 50                  # sitemaps (and indexes) requested per site
SITEMAPS_MAX_DEPTH = 2                      # index levels followed below robots.txt's sitemaps
SITEMAPS_MAX_URLS = 50_000                  # URLs read per sitemap (sitemaps.org's limit)
SITEMAPS_MAX_SIZE = 50 * 1024 * 1024        # bytes per sitemap, decompressed (<= DOWNLOAD_MAXSIZE)
SITEMAPS_OTHER_HOSTS = False                # URLs of another host than the site's: followed
SITEMAPS_MAX_QUEUED = 2000                  # sitemap seeds fed while frontier + seeds hold fewer
SITEMAPS_MAX_PENDING = 1_000_000            # seeds waiting in Redis; sitemaps wait beyond it
SITEMAPS_LASTMOD_SKEW = 300.0               # seconds a lastmod may be ahead of now; beyond: ignored

# --- Untrusted input: what seeds and stored requests may carry (policy.py) ------
SEED_META_ALLOW: list = []                  # meta keys a seed may set
SEED_METHODS_ALLOW: list = []               # methods besides GET/HEAD a seed may use (with a body)
SEED_HEADERS_ALLOW: list = []               # headers a seed may set besides SEED_HEADERS
FRONTIER_SECRET = None                      # HMAC key(s) proving what a node stored (crawlproject/signing.py)
STORED_META_ALLOW: list = []                # more meta keys a stored request may carry
STORED_PROXY_ALLOW: list = []               # proxies a stored request may name
PLAYWRIGHT_PAGE_METHODS_ALLOW = [           # page methods a stored request may ask for
    "wait_for_selector", "wait_for_timeout", "wait_for_load_state", "wait_for_url",
    "click", "dblclick", "hover", "focus", "press", "tap", "check", "uncheck",
]

# --- Where requests may go (crawlproject/egress/) -------------------------------
# Empty: public addresses only; a crawl of public sites needs nothing else, and a
# page, a redirect or a stored request can then never aim a node at Redis, a LAN
# admin page or a cloud metadata endpoint (opened only by its exact address,
# e.g. "169.254.169.254/32"). Groups: "loopback", "private" (RFC 1918,
# fc00::/7, 100.64/10), "link-local".
DOWNLOAD_ALLOWED_NETWORKS: list = []        # networks besides public ones: CIDRs and groups

# --- Proxy pool (crawlproject/proxies/) ---------------------------------------
PROXY_POOL_ENABLED = False                  # route requests through the shared pool
PROXY_POOL: list = []                       # proxy URLs http(s)://[user:pass@]host:port
PROXY_POOL_FILE = ""                        # one proxy URL a line (# comments)
PROXY_REFRESH_INTERVAL = 1.0                # seconds between flushes/reads of the shared state
PROXY_BAN_HTTP_CODES = [403, 429]           # 503 is a ban only with a body marker
PROXY_BAN_BODY_PATTERNS = [r"(?i)captcha", r"(?i)are you a (human|robot)"]  # 2xx/503 bodies
PROXY_BAN_REDIRECT_PATTERNS = [r"(?i)captcha", r"(?i)/(blocked|sorry)\b"]  # redirect targets
PROXY_BAN_BODY_MAX_BYTES = 65536            # body markers are searched in this much of it
PROXY_BAN_MAX_TRIES = 5                     # proxies tried per request before "banned"
PROXY_BAN_BACKOFF_BASE = 30.0               # seconds a proxy rests after a first ban (jittered)
PROXY_BAN_BACKOFF_MAX = 1800.0              # longest rest (s)
PROXY_RETIRE_AFTER = 10                     # connection failures in a row that retire a proxy
PROXY_LATENCY_EWMA = 0.3                    # weight of a new latency sample
PROXY_POOL_EMPTY_MAX_WAIT = 300.0           # seconds requests wait with no usable proxy

# --- Identity and sessions (crawlproject/identity/, middlewares/referer.py) ---
IDENTITY_ENABLED = True                     # one browser identity per session
IDENTITY_BROWSERS = ["Chrome", "Edge", "Firefox", "Safari"]  # fake-useragent names
IDENTITY_OS: list = []                      # any
IDENTITY_PLATFORMS = ["desktop"]            # "desktop", "mobile", "tablet"
IDENTITY_MIN_VERSION = 0.0                  # browser major.minor
IDENTITY_MIN_PERCENTAGE = 0.0               # usage share of the User-Agent
IDENTITY_ROTATION = "session"               # "session", "request" or N requests
IDENTITY_SALT = ""                          # change it: every session gets a new identity
SESSION_COOKIES_ENABLED = True              # an explicit session's cookies travel with it
REFERER_SEED_DEFAULT = "none"               # Referer of seeds: "none", "root" or "search"
REFERER_SEED_SEARCH_URL = "https://www.google.com/search?q={domain}"  # {domain} {host} {url}
REFERER_SEED_BY_DOMAIN: dict = {}           # {"example.com": "root"}

# --- Browser TLS and HTTP/2 on the wire (crawlproject/impersonate/) -------------
IMPERSONATE_ENABLED = False                 # identity's browser TLS/HTTP2 (ImpersonateAddon, extra)
IMPERSONATE_DEFAULT_PROFILE = ""            # profile of requests with no identity; "": their UA's
IMPERSONATE_FALLBACK = False                # impersonation failed: Scrapy's own client may retry it

# --- Download limits (crawlproject/limits/; body: Scrapy's DOWNLOAD_MAXSIZE) ---
DOWNLOAD_HEADERS_MAXSIZE = 256 * 1024       # bytes of a response's status line and headers
DOWNLOAD_HEADERS_MAXCOUNT = 1000            # headers of a response; 0: no limit (both)

# --- MongoDB pipelines (crawlproject/pipelines/) -------------------------------
MONGO_PIPELINE_ENABLED = True               # switch the MongoDB pipeline off
MONGO_COLLECTION = "%(spider)s"             # also %(item)s: the item class, lower case
MONGO_UNIQUE_KEY = "url"                    # unless the item class sets mongo_key
MONGO_KEY_AS_ID = True                      # the key is the _id (False: ObjectId + unique index)
MONGO_BULK_SIZE = 500                       # items per bulk write at most
MONGO_FLUSH_INTERVAL = 0.2                  # seconds an item may wait for a busy writer
MONGO_FLUSH_WHEN_IDLE = True                # write at once when no write is in flight
MONGO_CONCURRENT_WRITES = 2                 # bulk writes in flight at most
MONGO_WRITE_MODE = "auto"                   # "auto" (insert new keys first) or "upsert"
MONGO_SPOOL_AFTER = 5.0                     # seconds of retries before spooling a batch
MONGO_SPOOL_DIR = "mongo-spool"             # relative: under the project's .scrapy/
MONGO_PROBE_INTERVAL = 1.0                  # seconds between checks during an outage
MONGO_CLOSE_WAIT = 300.0                    # seconds an idle node waits to store its spool
MONGO_SPOOL_HANDOFF = True                  # at close, MongoDB down: spool to Redis
MONGO_SPOOL_HANDOFF_MAX_MB = 256.0          # most spool data one node hands to Redis
MONGO_RETRY_BACKOFF_BASE = 0.1              # first retry delay (s) of a transient error
MONGO_RETRY_BACKOFF_MAX = 2.0               # longest retry delay (s)
VALIDATION_ENABLED = True                   # switch the validation pipeline off
VALIDATION_INVALID_COLLECTION = ""          # e.g. "invalid_items" to keep dropped items

# --- Incremental recrawl (crawlproject/recrawl/) ------------------------------
RECRAWL_ENABLED = False                     # page records and revisits
RECRAWL_INTERVAL = 0.0                      # seconds between visits of any page; 0: rules only
RECRAWL_ADAPTIVE = False                    # halve when changed, double when not
RECRAWL_MIN_INTERVAL = 0.0                  # adaptive bounds; 0: interval / 16
RECRAWL_MAX_INTERVAL = 0.0                  # 0: interval * 16
RECRAWL_PRIORITY = -100                     # revisits after fresh discoveries (0)
RECRAWL_RULES: list = []                    # [{"pattern": "/product/", "interval": 3600}]
RECRAWL_CHECK_INTERVAL = 10.0               # seconds between looks for due pages
RECRAWL_BATCH_SIZE = 500                    # due pages fed per look at most
RECRAWL_MAX_QUEUED = 5000                   # no feeding while the frontier holds this many
RECRAWL_CLAIM_TIMEOUT = 3600.0              # a fed page not visited by then is due again
RECRAWL_GONE_COLLECTIONS: list = []         # more collections a 404/410 may mark gone

# --- JavaScript rendering (crawlproject/rendering/) ---------------------------
RENDERING_ENABLED = True                    # rendering add-on and middlewares on
CHROMIUM_PATH = None                        # None: found in the usual places
RENDER_URL_PATTERNS: list = []              # regexes of URLs always rendered
RENDER_IF_MISSING: dict = {}                # {url-regex: css}: static page without it -> render
RENDER_WAIT_FOR_SELECTOR = None             # css, or {url-regex: css}
RENDER_WAIT_TIMEOUT = 15.0                  # seconds a rendered page waits for its selector
RENDER_WAIT_IDLE = 2.0                      # no selector: seconds it waits for network idle
RENDER_BLOCK_RESOURCES = ["image", "font", "media"]  # never fetched by the browser
RENDER_MAX_CONTEXTS = 8                     # browser contexts open at most
RENDER_PROXY_BYPASS = None                  # hosts a proxied browser context reaches directly
RENDER_MAXSIZE = 64 * 1024 * 1024           # bytes a rendered page may receive in all; 0: no limit

# --- Operations: logs, metrics, tracing, garbage collector ---------------------
LOG_JSON = False                            # one JSON object per log line (JsonLogsAddon)
METRICS_ENABLED = False                     # a Prometheus endpoint per node
METRICS_HOST = "127.0.0.1"                  # 0.0.0.0 to be scraped from another host
METRICS_PORT = 9410                         # 0: a free port (logged)
TRACING_ENABLED = False                     # an OpenTelemetry span per request
TRACING_EXPORTER = "otlp"                   # otlp (HTTP) or console
TRACING_ENDPOINT = ""                       # "": $OTEL_EXPORTER_OTLP_*ENDPOINT or localhost:4318
GC_FREEZE_ENABLED = False                   # gc.freeze() the start-up heap at spider open
GC_THRESHOLD = None                         # e.g. [10000, 10, 10]; None: CPython's
LIVENESS_ENABLED = False                    # a heartbeat file the reactor writes (probes)
LIVENESS_FILE = "/tmp/crawlproject-liveness"  # where; the probe's --file
LIVENESS_INTERVAL = 5.0                     # seconds between beats

#: Settings that fall back to the environment variable of the same name.
ENVIRONMENT = frozenset({"REDIS_URL", "REDIS_CLUSTER", "REDIS_HOST", "REDIS_PORT",
                         "MONGO_URI", "MONGO_DATABASE", "MONGO_SPOOL_DIR",
                         "MAX_IDLE_TIME_BEFORE_CLOSE", "NODE_ID", "CHROMIUM_PATH",
                         "CONTROL_ON_START", "FRONTIER_SECRET"})

#: Settings of scrapy-playwright that crawlproject reads or its add-on sets;
#: their defaults are scrapy-playwright's (read with ``settings.get``).
PLAYWRIGHT_SETTINGS = frozenset({"PLAYWRIGHT_ABORT_REQUEST", "PLAYWRIGHT_BROWSER_TYPE",
                                 "PLAYWRIGHT_LAUNCH_OPTIONS", "PLAYWRIGHT_MAX_CONTEXTS",
                                 "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT",
                                 "PLAYWRIGHT_PROCESS_REQUEST_HEADERS"})

#: Every setting of this module and its default.
DEFAULTS: dict[str, Any] = {name: value for name, value in globals().items()
                            if name.isupper() and name not in ("ENVIRONMENT",
                                                               "PLAYWRIGHT_SETTINGS")}

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def setting(settings, name: str) -> Any:
    """The value of crawlproject setting *name* in *settings* (Scrapy
    ``Settings``, or None outside a project), converted like its default.

    Unset, None or ``""``: the environment variable for names in
    :data:`ENVIRONMENT`, else the default of this module. The type of the
    default picks the conversion (``getbool``, ``getint``, ``getfloat``,
    ``getlist``, ``getdict``; ``get`` for strings and None), so ``-s NAME=...``
    strings work as with Scrapy's own settings (plus ``yes``/``on``/``no``/
    ``off`` for booleans and a JSON ``[...]`` for lists).
    """
    try:
        default = DEFAULTS[name]
    except KeyError:
        raise KeyError(f"{name} is not a crawlproject setting (crawlproject/defaults.py)") \
            from None
    raw = settings.get(name) if settings is not None else None
    if raw is None or raw == "":
        raw = os.environ.get(name) if name in ENVIRONMENT else None
        if raw is None or raw == "":
            return copy.copy(default)
    return _convert(name, raw, default)


def is_set(settings, name: str) -> bool:
    """True when *settings* (or, for :data:`ENVIRONMENT` names, the
    environment) give *name* a value, None and ``""`` aside. A value at
    Scrapy's ``default`` priority is the default the add-on
    (:mod:`crawlproject.addon`) installed, not one the project gave."""
    raw = settings.get(name) if settings is not None else None
    getpriority = getattr(settings, "getpriority", None)
    if raw is not None and getpriority is not None and (getpriority(name) or 0) <= 0:
        raw = None   # 0: Scrapy's "default" priority
    if (raw is None or raw == "") and name in ENVIRONMENT:
        raw = os.environ.get(name)
    return raw is not None and raw != ""


def _convert(name: str, value: Any, default: Any) -> Any:
    from scrapy.settings import BaseSettings  # here: the plain classes import no Scrapy

    s = BaseSettings({name: value})
    if isinstance(default, bool):
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        return s.getbool(name)
    if isinstance(default, int):
        try:
            return s.getint(name)
        except ValueError:  # "1e7" from the command line
            return int(s.getfloat(name))
    if isinstance(default, float):
        return s.getfloat(name)
    if isinstance(default, list):
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:  # -s NAME='[...]': JSON, as getdict reads '{...}'
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                return parsed
        return s.getlist(name)
    if isinstance(default, dict):
        return s.getdict(name)
    return value
