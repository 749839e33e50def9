"""Build Redis and MongoDB clients from Scrapy settings, and redact secrets.

Every component gets its clients here, so there is one place that decides how
``REDIS_URL`` (``redis://``, ``rediss://``, Redis Cluster) and ``MONGO_URI``
are interpreted, and one function (:func:`redact_url`) that keeps passwords
out of logs, stats and metrics.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from redis.exceptions import RedisClusterException, RedisError

from crawlproject import defaults
from crawlproject.defaults import is_set, setting

try:
    import hiredis
except ImportError:  # an optional speed-up of redis-py: without it, its own packer
    hiredis = None

DEFAULT_REDIS_URL = defaults.REDIS_URL
DEFAULT_MONGO_URI = defaults.MONGO_URI
DEFAULT_MONGO_DATABASE = defaults.MONGO_DATABASE

#: What a Redis call raises when Redis cannot answer: redis-py's errors, a
#: Redis Cluster's "cannot be connected" (a ``RedisClusterException``, which is
#: not a ``RedisError``), socket errors and timeouts. An outage, not a bug.
REDIS_FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)


#: Query parameters whose value is a secret (``redis://host/0?password=...``).
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|credential", re.IGNORECASE)


def redact_url(url: str | None) -> str:
    """Return *url* with any password replaced by ``***``, in the user
    information and in query parameters such as ``?password=``.

    >>> redact_url("redis://user:secret@host:6379/0")
    'redis://user:***@host:6379/0'
    >>> redact_url("redis://host:6379/0?password=secret&db=1")
    'redis://host:6379/0?password=***&db=1'
    """
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(_SECRET_PARAM.search(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _SECRET_PARAM.search(k) else v) for k, v in pairs],
                              safe="*")
            parts = parts._replace(query=query)
    if parts.password is None and "@" not in parts.netloc:
        return urlunsplit(parts)
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
    """Create a redis-py client (sync or asyncio, single node or cluster).

    Raises ``ValueError`` (password redacted) for a URL redis-py cannot use.
    """
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"not a Redis URL: {redact_url(url)!r} (expected redis://, rediss:// "
                         "or unix://)")
    use_cluster = is_cluster_url(url, cluster)
    url = _strip_cluster_param(url)
    kw.setdefault("socket_timeout", 30)
    kw.setdefault("socket_connect_timeout", 10)
    kw.setdefault("health_check_interval", 30)
    if asyncio:
        from redis import asyncio as aioredis

        cls = _async_cluster_class() if use_cluster else aioredis.Redis
    else:
        import redis

        cls = redis.RedisCluster if use_cluster else redis.Redis
    if use_cluster:
        kw.pop("health_check_interval", None)
    client = cls.from_url(url, **kw)
    if asyncio and not use_cluster:
        pool = client.connection_pool
        pool.connection_class = hiredis_packing(pool.connection_class)
    return client


_PACKING: dict[type, type] = {}
_UTF8 = frozenset({"utf-8", "utf8", "UTF-8", "UTF8"})


def hiredis_packing(connection_class: type) -> type:
    """*connection_class* (a redis-py asyncio connection), packing commands
    with hiredis' C ``pack_command`` as redis-py's synchronous client does.

    Why: redis-py 8.1's asyncio connection packs every command in Python,
    one ``Encoder.encode`` and a few byte joins per argument, and a frontier
    call carries 40-100 arguments: hiredis' packer saves node CPU on every
    call (``python -m bench.costs``, "node CPU per SYNC call"). Anything
    hiredis does not take (a ``memoryview``, a wrong type) goes to redis-py's
    own packer, which encodes it or raises its ``DataError`` as before.
    (Redis Cluster's asyncio client builds its connections from a fixed
    class: it keeps redis-py's packer.)
    """
    if hiredis is None or getattr(connection_class, "_hiredis_packing", False):
        return connection_class
    packing = _PACKING.get(connection_class)
    if packing is None:
        class packing(connection_class):  # noqa: N801 - named after its base below
            _hiredis_packing = True

            def pack_command(self, *args):
                encoder = self.encoder
                if encoder.encoding not in _UTF8 or encoder.encoding_errors != "strict":
                    return super().pack_command(*args)  # hiredis writes str as UTF-8
                first = args[0]
                if isinstance(first, str):
                    args = (*first.encode().split(), *args[1:])
                elif isinstance(first, bytes) and b" " in first:
                    args = (*first.split(), *args[1:])
                try:
                    return [hiredis.pack_command(args)]
                except TypeError:  # not str/bytes/int/float: redis-py decides
                    return super().pack_command(*args)

        packing.__name__ = packing.__qualname__ = f"Hiredis{connection_class.__name__}"
        _PACKING[connection_class] = packing
    return packing


_ASYNC_CLUSTER = None


def _async_cluster_class():
    """redis-py's asyncio ``RedisCluster``, made to read the cluster's slots
    before it routes a first command.

    Why: redis-py 8.1 routes a command before it has initialised (no default
    node yet, so no slot), so the first commands a node sends at once (its
    frontier partitions, control watcher, seed reader) go to any master and
    come back MOVED. Every fifth MOVED closes the client's connections, those
    other commands are using too: ``AttributeError: 'NoneType' object has no
    attribute 'writelines'`` out of the call (tests/test_connection.py).
    Initialising first, under redis-py's own lock, routes every command by its
    slot.
    """
    global _ASYNC_CLUSTER
    if _ASYNC_CLUSTER is None:
        from redis.asyncio import RedisCluster
        from redis.exceptions import ConnectionError as RedisConnectionError

        class InitialisedRedisCluster(RedisCluster):
            async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
                if self._initialize:
                    await self.initialize()
                try:
                    return await super().execute_command(*args, **kwargs)
                except (AttributeError, TypeError) as exc:
                    if not _closed_under_the_command(exc):
                        raise
                    raise RedisConnectionError(
                        f"the connection was closed while the command used it ({exc})") from exc

        _ASYNC_CLUSTER = InitialisedRedisCluster
    return _ASYNC_CLUSTER


def _closed_under_the_command(exc: BaseException) -> bool:
    """True when *exc* came out of redis-py's asyncio connection code.

    When a call to a cluster node fails (e.g. as the cluster comes back after
    an outage), redis-py disconnects that node's idle connections in a task
    of its own, while other commands may already be reconnecting one of them:
    their socket goes away under them (``AttributeError: 'NoneType' object has
    no attribute 'writelines'``). That is a connection error, and is reported
    as one (an outage, retried), not as a bug of the caller.
    """
    if "NoneType" not in str(exc):  # a socket gone: None where the stream was
        return False
    tb = exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if path.endswith("/redis/asyncio/connection.py"):
            return True
        tb = tb.tb_next
    return False


def redis_url_from_settings(settings) -> str:
    """``REDIS_URL`` (setting, then environment); else scrapy-redis'
    ``REDIS_HOST`` / ``REDIS_PORT`` when set; else the local default."""
    host, port = setting(settings, "REDIS_HOST"), setting(settings, "REDIS_PORT")
    if (host or port) and not is_set(settings, "REDIS_URL"):
        return f"redis://{host or '127.0.0.1'}:{int(port or 6379)}/0"
    return setting(settings, "REDIS_URL")


def redis_cluster_from_settings(settings) -> bool:
    """``REDIS_CLUSTER`` (setting, then environment) as a boolean."""
    return setting(settings, "REDIS_CLUSTER")


def redis_from_settings(settings, *, asyncio: bool = False, **kw: Any):
    """Create the Redis client described by ``REDIS_URL``/``REDIS_CLUSTER``
    (see :func:`redis_url_from_settings`) and ``REDIS_PARAMS``."""
    params = redis_params(settings)
    params.update(kw)
    return redis_from_url(
        redis_url_from_settings(settings),
        cluster=redis_cluster_from_settings(settings),
        asyncio=asyncio,
        **params,
    )


def redis_params(settings) -> dict[str, Any]:
    """``REDIS_PARAMS``: extra redis-py client options (without scrapy-redis'
    ``url`` and ``redis_cls``, which the URL and :func:`redis_from_url` decide)."""
    params = setting(settings, "REDIS_PARAMS")
    params.pop("url", None)
    params.pop("redis_cls", None)
    return params


def mongo_uri_from_settings(settings) -> str:
    """``MONGO_URI`` (setting, then environment, then the local default)."""
    return setting(settings, "MONGO_URI")


def mongo_database_from_settings(settings) -> str:
    """``MONGO_DATABASE`` (setting, then environment, then ``crawlproject``)."""
    return setting(settings, "MONGO_DATABASE")


def mongo_client_options(settings) -> dict[str, Any]:
    """Extra pymongo client options from ``MONGO_CLIENT_OPTIONS``."""
    opts = {"serverSelectionTimeoutMS": 10_000, "appname": "crawlproject"}
    opts.update(setting(settings, "MONGO_CLIENT_OPTIONS"))
    return opts


def mongo_client(uri: str, *, asyncio: bool = True, settings=None, **kw: Any):
    """The one place MongoDB clients are made: pymongo's ``AsyncMongoClient``
    (or ``MongoClient`` with ``asyncio=False``) for *uri*, with the options of
    ``MONGO_CLIENT_OPTIONS`` (from *settings*) and *kw*."""
    import pymongo

    opts = mongo_client_options(settings)
    opts.update(kw)
    cls = pymongo.AsyncMongoClient if asyncio else pymongo.MongoClient
    return cls(uri, **opts)


def collection_name(pattern: str, cls: type | None, spider: str) -> str:
    """The collection of item class *cls*: its ``mongo_collection``, else
    *pattern* (``MONGO_COLLECTION``), with ``%(spider)s`` and ``%(item)s``."""
    pattern = getattr(cls, "mongo_collection", None) or pattern
    return pattern % {"spider": spider, "item": cls.__name__.lower() if cls else ""}


def mongo_collection_pattern(settings) -> str:
    """``MONGO_COLLECTION`` (``%(spider)s`` by default, also ``%(item)s``):
    read here only, by the pipeline and the recrawl middleware alike."""
    return setting(settings, "MONGO_COLLECTION")


def mongo_unique_key(settings) -> str:
    """``MONGO_UNIQUE_KEY``: the item field documents are keyed on (``url``)."""
    return setting(settings, "MONGO_UNIQUE_KEY")
