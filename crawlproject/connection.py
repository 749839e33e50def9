"""Build Redis and MongoDB clients from Scrapy settings, and redact secrets.

Every component gets its clients here, so there is one place that decides how
``REDIS_URL`` (``redis://``, ``rediss://``, Redis Cluster) and ``MONGO_URI``
are interpreted, and one function (:func:`redact_url`) that keeps passwords
out of logs, stats and metrics.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MONGO_URI = "mongodb://127.0.0.1:27017/"
DEFAULT_MONGO_DATABASE = "crawlproject"


def env_default(name: str, default: str) -> str:
    """The environment variable *name*, or *default* when unset or empty."""
    return os.environ.get(name) or default


def redact_url(url: str | None) -> str:
    """Return *url* with any password replaced by ``***``.

    >>> redact_url("redis://user:secret@host:6379/0")
    'redis://user:***@host:6379/0'
    """
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None and "@" not in parts.netloc:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    netloc = f"{user}:***@{hostinfo}" if user else f"***@{hostinfo}"
    return urlunsplit(parts._replace(netloc=netloc))


def is_cluster_url(url: str, cluster_setting: bool = False) -> bool:
    """True when *url* names a Redis Cluster (``?cluster=true`` or the setting)."""
    if cluster_setting:
        return True
    query = parse_qs(urlsplit(url).query)
    return query.get("cluster", ["false"])[-1].lower() in ("1", "true", "yes")


def _strip_cluster_param(url: str) -> str:
    parts = urlsplit(url)
    query = "&".join(
        p for p in parts.query.split("&") if p and not p.startswith("cluster=")
    )
    return urlunsplit(parts._replace(query=query))


def redis_from_url(url: str, *, cluster: bool = False, asyncio: bool = False, **kw: Any):
    """Create a redis-py client (sync or asyncio, single node or cluster)."""
    use_cluster = is_cluster_url(url, cluster)
    url = _strip_cluster_param(url)
    kw.setdefault("socket_timeout", 30)
    kw.setdefault("socket_connect_timeout", 10)
    kw.setdefault("health_check_interval", 30)
    if asyncio:
        from redis import asyncio as aioredis

        cls = aioredis.RedisCluster if use_cluster else aioredis.Redis
    else:
        import redis

        cls = redis.RedisCluster if use_cluster else redis.Redis
    if use_cluster:
        kw.pop("health_check_interval", None)
    return cls.from_url(url, **kw)


def redis_from_settings(settings, *, asyncio: bool = False, **kw: Any):
    """Create the Redis client described by ``REDIS_URL``/``REDIS_CLUSTER``."""
    params = dict(settings.getdict("REDIS_PARAMS"))
    params.pop("url", None)
    params.pop("redis_cls", None)
    params.update(kw)
    return redis_from_url(
        settings.get("REDIS_URL") or DEFAULT_REDIS_URL,
        cluster=settings.getbool("REDIS_CLUSTER"),
        asyncio=asyncio,
        **params,
    )


def mongo_client_options(settings) -> dict[str, Any]:
    """Extra pymongo client options from ``MONGO_CLIENT_OPTIONS``."""
    opts = {"serverSelectionTimeoutMS": 10_000, "appname": "crawlproject"}
    opts.update(settings.getdict("MONGO_CLIENT_OPTIONS"))
    return opts
