"""Small operator tool: seed, inspect and reset a crawl's shared state.

    python -m crawlproject.cli status products
    python -m crawlproject.cli seed products http://127.0.0.1:8000/ '{"url": "...", "priority": 5}'
    python -m crawlproject.cli dead products [-n 20]
    python -m crawlproject.cli replay products [-n 1000]
    python -m crawlproject.cli invalid products
    python -m crawlproject.cli reset products --yes [--keep-seeds]

Connects to ``--redis-url`` (default: ``$REDIS_URL``, then the local default);
add ``--cluster`` for Redis Cluster. Passwords are never printed.
"""

from __future__ import annotations

import argparse
import json
import sys

from crawlproject.connection import DEFAULT_REDIS_URL, env_default, redact_url, redis_from_url
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import START_URLS, START_URLS_INVALID, reset_spider
from crawlproject.seeds import InvalidSeed, parse_seed


def _frontier(args) -> Frontier:
    client = redis_from_url(args.redis_url, cluster=args.cluster)
    return Frontier(client, args.spider, node="cli")


def cmd_status(args) -> int:
    from rich.console import Console
    from rich.table import Table

    f = _frontier(args)
    counts = f.counts()
    counts["seeds"] = f.client.llen(START_URLS % {"spider": args.spider})
    counts["invalid seeds"] = f.client.llen(START_URLS_INVALID % {"spider": args.spider})
    table = Table(title=f"{args.spider} on {redact_url(args.redis_url)}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for name, value in counts.items():
        table.add_row(name, str(value))
    for name, value in sorted(f.stats().items()):
        table.add_row(f"total {name}", str(value))
    est = f.bloom_estimates()
    if est["layers"]:
        table.add_row("bloom layers / items", f"{est['layers']} / {est['count']}")
        table.add_row("bloom fill ratio", f"{est['fill_ratio']:.4f}")
        table.add_row("bloom est. FP rate", f"{est['est_fp_rate']:.2e}")
        table.add_row("bloom bytes per item", f"{est['bytes_per_item']:.2f}")
    Console().print(table)
    return 0


def cmd_seed(args) -> int:
    f = _frontier(args)
    good = []
    for raw in args.seeds:
        try:
            parse_seed(raw)
        except InvalidSeed as exc:
            print(f"invalid seed {raw[:100]!r}: {exc}", file=sys.stderr)
            return 2
        good.append(raw)
    f.client.lpush(START_URLS % {"spider": args.spider}, *good)
    print(f"pushed {len(good)} seed(s) to {START_URLS % {'spider': args.spider}}")
    return 0


def cmd_dead(args) -> int:
    for record in _frontier(args).dead_letters(args.n):
        record.pop("payload", None)
        print(json.dumps(record))
    return 0


def cmd_invalid(args) -> int:
    for record in _frontier(args).invalid_entries(args.n):
        print(json.dumps(record))
    return 0


def cmd_replay(args) -> int:
    print(f"replayed {_frontier(args).replay_dead(args.n)} dead letter(s)")
    return 0


def cmd_reset(args) -> int:
    if not args.yes:
        print("refusing to delete shared state without --yes", file=sys.stderr)
        return 2
    client = redis_from_url(args.redis_url, cluster=args.cluster)
    deleted = reset_spider(client, args.spider, keep_seeds=args.keep_seeds)
    print(f"deleted {deleted} key(s) of {args.spider}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m crawlproject.cli",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=env_default("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--cluster", action="store_true",
                        default=env_default("REDIS_CLUSTER", "") in ("1", "true", "yes"))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in [
        ("status", cmd_status, "queue, in-flight, delayed, dead, nodes, Bloom filter"),
        ("seed", cmd_seed, "push seeds (plain URL or JSON) to <spider>:start_urls"),
        ("dead", cmd_dead, "list dead letters with their reason and attempts"),
        ("invalid", cmd_invalid, "list payloads that were moved aside"),
        ("replay", cmd_replay, "move dead letters back into the queue"),
        ("reset", cmd_reset, "delete the spider's queue, filter and seeds"),
    ]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("spider")
        p.set_defaults(func=func)
        if name == "seed":
            p.add_argument("seeds", nargs="+")
        if name in ("dead", "invalid", "replay"):
            p.add_argument("-n", type=int, default=20 if name != "replay" else 1000)
        if name == "reset":
            p.add_argument("--yes", action="store_true")
            p.add_argument("--keep-seeds", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    from redis.exceptions import RedisError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RedisError as exc:
        message = str(exc).replace(args.redis_url, redact_url(args.redis_url))
        print(f"error: Redis at {redact_url(args.redis_url)}: {type(exc).__name__}: {message}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
