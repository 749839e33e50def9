"""crawlctl spool-replay and recrawl: items spooled through a MongoDB outage,
pages due again."""

from __future__ import annotations

import sys

from crawlproject.connection import redis_from_url
from crawlproject.keys import (
    FrontierKeys,
)
from crawlproject.ops.common import UsageError, current_project
from crawlproject.cli.common import _client


def cmd_spool_replay(args) -> int:
    """Store the items a node left in its MongoDB spool, without crawling.

    Defaults as for the pipeline: the project's setting, else the environment
    variable (``MONGO_URI``, ``MONGO_DATABASE``, ``MONGO_SPOOL_DIR``), else the
    local default; a relative spool directory is under the project's ``.scrapy/``.
    """
    import asyncio

    from crawlproject.connection import (mongo_client_options, mongo_database_from_settings,
                                         mongo_uri_from_settings)
    from crawlproject.defaults import setting
    from crawlproject.pipelines.errors import MongoPipelineError
    from crawlproject.pipelines.replay import replay_spool
    from crawlproject.pipelines.spool import spool_path, target_dir

    settings, _ = current_project()
    uri = args.mongo_uri or mongo_uri_from_settings(settings)
    database = args.database or mongo_database_from_settings(settings)
    base = spool_path(args.spool_dir or setting(settings, "MONGO_SPOOL_DIR"))

    async def run():
        redis = redis_from_url(args.redis_url, cluster=args.cluster, asyncio=True,
                               **getattr(args, "redis_params", {})) \
            if args.spider else None
        try:
            return await replay_spool(uri, database, base, redis=redis, spider=args.spider,
                                      client_options=mongo_client_options(settings))
        finally:
            if redis is not None:
                await redis.aclose()

    try:
        replayed, left = asyncio.run(run())
    except MongoPipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    also = f" and Redis ({args.spider})" if args.spider else ""
    print(f"replayed {replayed} item(s) from {target_dir(base, uri, database)}{also}")
    if left:
        print(f"{left} item(s) still waiting (spool segments of a running node are left to it)",
              file=sys.stderr)
        return 1
    return 0


def cmd_recrawl(args) -> int:
    """Make the spider's known pages (those *pattern* finds) due for a revisit
    now; with ``--now`` the nodes look for due pages at once (else at their
    next ``RECRAWL_CHECK_INTERVAL``). Revisits are fed a bounded batch at a
    time and are as polite as any request."""
    import re
    from datetime import datetime, timezone

    import pymongo
    from pymongo.errors import PyMongoError

    from crawlproject.connection import (mongo_client, mongo_database_from_settings,
                                         mongo_uri_from_settings)
    from crawlproject.connection import collection_name
    from crawlproject.pipelines.errors import Scrubber
    from crawlproject.recrawl.schedule import PageVisit

    query: dict = {}
    if args.pattern:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            raise UsageError(f"--pattern {args.pattern!r} is not a regular expression: {exc}")
        query = {"url": {"$regex": args.pattern}}
    settings, _ = current_project()
    uri = args.mongo_uri or mongo_uri_from_settings(settings)
    database = args.database or mongo_database_from_settings(settings)
    pages = collection_name("%(spider)s", PageVisit, args.spider)
    now = datetime.now(timezone.utc)
    client = mongo_client(uri, asyncio=False, settings=settings, serverSelectionTimeoutMS=5000)
    try:
        with pymongo.timeout(30):
            result = client[database][pages].update_many(query, {"$set": {"next_visit": now}})
    except PyMongoError as exc:
        print(f"error: MongoDB at {Scrubber(uri).redacted}: {Scrubber(uri).exception(exc)}",
              file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"{result.matched_count} page(s) of {args.spider} due for a revisit now "
          f"({database}.{pages}{', pattern ' + repr(args.pattern) if args.pattern else ''})")
    if args.now:
        _client(args).hincrby(FrontierKeys(args.spider).recrawl, "wake", 1)
        print(f"nodes of {args.spider} look for due pages within ~1 s")
    return 0
