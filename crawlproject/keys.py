"""Every Redis key the project uses, in one place.

=====================================  ======  =====================================
key                                    type    written by
=====================================  ======  =====================================
``<spider>:start_urls``                list    users (``redis-cli lpush``); popped by
                                               ``RedisSpider.start()``
                                       (set / sorted set with
                                       ``REDIS_START_URLS_AS_SET`` / ``_AS_ZSET``)
``<spider>:start_urls:invalid``        list    ``RedisSpider``: rejected seeds as JSON
                                               ``{seed, reason, error, node, at}``
``<spider>:requests``                  zset    the scheduler (scrapy-redis queue of
                                               JSON requests, score = -priority)
``<spider>:dupefilter``                set     the dupefilter (request fingerprints)
=====================================  ======  =====================================

Nothing in these keys is ever unpickled. One node closing never deletes them
(``SCHEDULER_PERSIST = True``); :func:`reset_spider` is the explicit reset.
"""

from __future__ import annotations

START_URLS = "%(spider)s:start_urls"
START_URLS_INVALID = "%(spider)s:start_urls:invalid"
REQUESTS = "%(spider)s:requests"
DUPEFILTER = "%(spider)s:dupefilter"


def spider_keys(spider: str) -> dict[str, str]:
    """The concrete key names of *spider*."""
    values = {"spider": spider}
    return {
        "start_urls": START_URLS % values,
        "start_urls_invalid": START_URLS_INVALID % values,
        "requests": REQUESTS % values,
        "dupefilter": DUPEFILTER % values,
    }


def reset_spider(client, spider: str, keep_seeds: bool = False) -> int:
    """Delete the shared state of *spider* (queue, filter, and seeds unless kept).

    Returns how many keys were deleted. Uses SCAN, so it also removes keys
    added by later versions of the layout under the same ``<spider>:`` prefix.
    """
    keep = {START_URLS % {"spider": spider}} if keep_seeds else set()
    deleted = 0
    for pattern in (f"{spider}:*", f"{{{spider}}}:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            name = key.decode() if isinstance(key, bytes) else key
            if name not in keep:
                deleted += client.delete(name)
    return deleted
