"""MongoConfig: the MongoDB pipeline's settings, read once from Scrapy's.

Built by :meth:`MongoConfig.from_settings` in
:meth:`~crawlproject.pipelines.mongo.MongoPipeline.from_crawler` and given to
the pipeline and its :class:`~crawlproject.pipelines.outage.OutageHandler`, so
each setting is read in one place and passed as one object. The defaults are
those of :mod:`crawlproject.defaults`; ``docs/pipelines.md`` describes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crawlproject.connection import (
    mongo_client_options,
    mongo_collection_pattern,
    mongo_database_from_settings,
    mongo_unique_key,
    mongo_uri_from_settings,
    redis_url_from_settings,
)
from crawlproject.defaults import setting
from crawlproject.pipelines.spool import spool_path


@dataclass(frozen=True)
class MongoConfig:
    """The ``MONGO_*`` settings the pipeline and its outage handling use."""

    uri: str
    database: str
    collection: str               # MONGO_COLLECTION: %(spider)s, %(item)s
    key: str                      # MONGO_UNIQUE_KEY
    key_as_id: bool
    client_options: dict[str, Any]
    bulk_size: int
    flush_interval: float
    write_mode: str               # "auto" or "upsert"
    max_flushes: int              # MONGO_CONCURRENT_WRITES, at least 1
    flush_when_idle: bool
    spool_after: float
    spool_dir: str                # resolved (spool_path)
    probe_interval: float
    backoff_base: float
    backoff_max: float
    close_wait: float             # at least 0
    handoff: bool                 # MONGO_SPOOL_HANDOFF
    handoff_max_bytes: int
    redis_url: str                # the handoff's Redis ("" when the handoff is off)

    @classmethod
    def from_settings(cls, settings) -> "MongoConfig":
        """Read every setting once (environment fallbacks included)."""
        s = settings
        handoff = bool(setting(s, "MONGO_SPOOL_HANDOFF"))
        return cls(
            uri=mongo_uri_from_settings(s),
            database=mongo_database_from_settings(s),
            collection=mongo_collection_pattern(s),
            key=mongo_unique_key(s),
            key_as_id=setting(s, "MONGO_KEY_AS_ID"),
            client_options=mongo_client_options(s),
            bulk_size=setting(s, "MONGO_BULK_SIZE"),
            flush_interval=setting(s, "MONGO_FLUSH_INTERVAL"),
            write_mode=setting(s, "MONGO_WRITE_MODE").lower(),
            max_flushes=max(1, setting(s, "MONGO_CONCURRENT_WRITES")),
            flush_when_idle=setting(s, "MONGO_FLUSH_WHEN_IDLE"),
            spool_after=setting(s, "MONGO_SPOOL_AFTER"),
            spool_dir=str(spool_path(setting(s, "MONGO_SPOOL_DIR"))),
            probe_interval=setting(s, "MONGO_PROBE_INTERVAL"),
            backoff_base=setting(s, "MONGO_RETRY_BACKOFF_BASE"),
            backoff_max=setting(s, "MONGO_RETRY_BACKOFF_MAX"),
            close_wait=max(0.0, setting(s, "MONGO_CLOSE_WAIT")),
            handoff=handoff,
            handoff_max_bytes=int(setting(s, "MONGO_SPOOL_HANDOFF_MAX_MB") * 2**20),
            redis_url=redis_url_from_settings(s) if handoff else "",
        )
