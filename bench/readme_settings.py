"""Scrapy settings of a node "as users configure the product": README.md's
settings block ("Use it in your own Scrapy project"), whole, as
:func:`bench.soak.readme_settings_block` reads it (the soak's user project
pastes the same block).

Loaded with ``SCRAPY_SETTINGS_MODULE=bench.readme_settings`` (``run_nodes(...,
settings_module=...)``). Around the block, only what a ``scrapy startproject``
settings file has and a benchmark needs: the bench spiders, ``ROBOTSTXT_OBEY =
True`` (the startproject template's value; the block's robots.txt middleware
acts on it), the bench recorder, no telnet console, INFO logs. Servers
(``REDIS_URL``, ``MONGO_URI``, ``MONGO_DATABASE``) and the benchmark's own
overrides come on the command line (``-s``), after this module.
"""

from bench.soak import readme_settings_block

BOT_NAME = "crawlbench"
SPIDER_MODULES = ["bench.spiders"]
NEWSPIDER_MODULE = "bench.spiders"
ROBOTSTXT_OBEY = True

exec(readme_settings_block(), globals())  # noqa: S102 - the README's own text, pasted whole

EXTENSIONS = {**globals().get("EXTENSIONS", {}), "bench.recorder.BenchRecorder": 0}
DOWNLOAD_ALLOWED_NETWORKS = ["loopback"]   # the benchmark sites are on 127.0.0.x
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
LOGSTATS_INTERVAL = 60.0
