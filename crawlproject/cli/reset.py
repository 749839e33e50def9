"""crawlctl reset: a spider's state deleted, exactly."""

from __future__ import annotations


from crawlproject.keys import (
    ProxyKeys,
    reset_spider,
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
    deleted = reset_spider(client, args.spider, keep_seeds=args.keep_seeds,
                           seed_key=_seed_keys(args, settings, spidercls).key,
                           keep_proxy_pool=not args.drop_proxy_pool)
    kept = "" if args.drop_proxy_pool or not client.exists(ProxyKeys(args.spider).pool) else (
        f" (kept the proxy list {ProxyKeys(args.spider).pool}; --drop-proxy-pool deletes it)")
    print(f"deleted {deleted} key(s) of {args.spider}{kept}")
    return 0
