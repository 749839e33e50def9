"""crawlctl reset: a spider's state deleted, exactly."""

from __future__ import annotations

import sys

from crawlproject.keys import (
    FrontierKeys,
    ProxyKeys,
    reset_spider,
    spider_keys,
    spooled_item_keys,
)
from crawlproject.ops.common import UsageError
from crawlproject.cli.common import _client, _seed_keys, _spider_class


def cmd_reset(args) -> int:
    if not args.yes:
        raise UsageError("refusing to delete shared state without --yes")
    settings, spidercls = _spider_class(args)
    client = _client(args)
    spooled = {k: client.llen(k) for k in spooled_item_keys(client, args.spider)}
    if any(spooled.values()) and not args.drop_spooled_items:
        raise UsageError(
            f"{sum(spooled.values())} chunk(s) of items that nodes could not store in MongoDB "
            f"wait in {', '.join(spooled)}: store them first (spool-replay --spider "
            f"{args.spider}) or add --drop-spooled-items")
    seed_key = _seed_keys(args, settings, spidercls).key
    # The backlog's documents first: MongoDB not answering leaves everything as it was.
    if args.mongo_uri or _backlog_used(client, args.spider, seed_key):
        code = _reset_backlog(args, settings)
        if code:
            return code
    deleted = reset_spider(client, args.spider, keep_seeds=args.keep_seeds,
                           seed_key=seed_key, keep_proxy_pool=not args.drop_proxy_pool)
    kept = "" if args.drop_proxy_pool or not client.exists(ProxyKeys(args.spider).pool) else (
        f" (kept the proxy list {ProxyKeys(args.spider).pool}; --drop-proxy-pool deletes it)")
    print(f"deleted {deleted} key(s) of {args.spider}{kept}")
    return 0


def _backlog_used(client, spider: str, seed_key: str) -> bool:
    """Whether the spider may have documents in the frontier's MongoDB tier:
    Redis holds the tier's bookkeeping in some partition (every move begins
    with a claim, which writes ``T:mover``'s epoch counter; reset alone deletes
    it). A crawl that never spilled never touches MongoDB here."""
    base = FrontierKeys(spider)
    # the names after the partition's tag ({spider} or {spider:p})
    tag = len(f"{{{spider}}}")
    names = {base.mover[tag:], base.backlog[tag:]}
    prefixes = (base.moving_prefix[tag:] + ":", base.refilled_prefix[tag:] + ":")
    for key in spider_keys(client, spider, seed_key):
        rest = key.split("}", 1)[-1]
        if rest in names or rest.startswith(prefixes):
            return True
    return False


def _reset_backlog(args, settings) -> int:
    """Delete the spider's documents of the backlog collection (live entries and
    tombstones: after a reset a new crawl's members and epochs start again and
    would meet them); 0 when done, else 1 with the reason on standard error."""
    import asyncio
    import dataclasses

    from crawlproject.connection import redact_url
    from crawlproject.frontier.backlog import Backlog, BacklogConfig, BacklogError

    config = BacklogConfig.from_settings(settings)
    config = dataclasses.replace(config, uri=args.mongo_uri or config.uri,
                                 database=args.database or config.database)

    async def run() -> int:
        backlog = Backlog.from_config(config, args.spider)
        try:
            return await backlog.reset()
        finally:
            await backlog.close()

    where = f"{redact_url(config.uri)} ({config.database}.{config.collection})"
    # (a crawl's new members and epochs start again: old documents would meet them)
    again = f"crawlctl reset {args.spider} --yes --mongo-uri URI --database {config.database}"
    try:
        deleted = asyncio.run(run())
    except BacklogError as exc:
        if not args.keep_backlog:
            print(f"error: {exc}\nnothing deleted: reset again once MongoDB answers, or add "
                  f"--keep-backlog and delete the documents left behind before "
                  f"{args.spider} crawls again ({again})", file=sys.stderr)
            return 1
        print(f"warning: {exc}: the backlog documents of {args.spider} are left in MongoDB "
              f"(--keep-backlog); delete them once it answers, before {args.spider} crawls "
              f"again: {again}", file=sys.stderr)
        return 0
    print(f"deleted {deleted} backlog document(s) of {args.spider} from MongoDB at {where}")
    return 0
