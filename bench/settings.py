"""Scrapy settings shared by every benchmark node (ours, scrapy-redis, plain).

Loaded with ``SCRAPY_SETTINGS_MODULE=bench.settings``. Only what the three
systems have in common lives here; each spider class in :mod:`bench.spiders`
sets its own scheduler / dupefilter in ``custom_settings``. No item pipeline,
no Playwright (Scrapy's default download handlers), no robots.txt, no MongoDB.
"""

BOT_NAME = "crawlbench"
SPIDER_MODULES = ["bench.spiders"]
NEWSPIDER_MODULE = "bench.spiders"

TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
ROBOTSTXT_OBEY = False
CONCURRENT_REQUESTS = 64
CONCURRENT_REQUESTS_PER_DOMAIN = 64
DOWNLOAD_TIMEOUT = 30
DOWNLOAD_DELAY = 0
COOKIES_ENABLED = False
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
ITEM_PIPELINES = {}
MONGO_PIPELINE_ENABLED = False
LOG_LEVEL = "INFO"
LOGSTATS_INTERVAL = 60.0
EXTENSIONS = {"bench.recorder.BenchRecorder": 0}
# The benchmark sites listen on 127.0.0.x; our scheduler refuses loopback otherwise.
DOWNLOAD_ALLOWED_NETWORKS = ["loopback"]
