"""Spiders of the example project; :class:`RedisSpider` is the base to use."""

from crawlproject.spiders.seeded import RedisSpider

__all__ = ["RedisSpider"]
