"""``scrapy settings`` that shows the settings a crawl gets: the project's
``ADDONS`` applied first.

Scrapy's own command prints ``settings.py`` and ``-s`` only: the defaults the
crawlproject add-on installs (``crawlproject.addon.Addon``) and whatever other
add-ons set would read as missing. Here the add-ons update a copy of the
settings, as a crawler does before a crawl, then Scrapy's command prints it.
"""

from __future__ import annotations

from scrapy.commands.settings import Command as ScrapySettingsCommand
from scrapy.crawler import Crawler
from scrapy.spiders import Spider


class Command(ScrapySettingsCommand):
    def run(self, args, opts) -> None:
        crawler = Crawler(Spider, self.settings)   # a copy: the command's own stay as given
        crawler.addons.load_settings(crawler.settings)
        self.settings = crawler.settings
        super().run(args, opts)
