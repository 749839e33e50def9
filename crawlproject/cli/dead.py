"""crawlctl dead / invalid / invalid-seeds / replay: what was set aside, and
putting it back."""

from __future__ import annotations

import json

from crawlproject.ops.actions import replay_dead_letters
from crawlproject.ops.common import UsageError
from crawlproject.cli.common import _action, _client, _partitions, _seed_keys, _spider_class


def _purge(args, keys: list[str], what: str) -> int:
    if not args.yes:
        raise UsageError(f"refusing to delete {what} without --yes")
    client = _client(args)
    count = sum(client.llen(k) for k in keys)
    for key in keys:
        client.delete(key)
    print(f"purged {count} {what}")
    return 0


def cmd_dead(args) -> int:
    action = _action(args)
    if action == "requeue":
        return cmd_replay(args)
    parts = _partitions(args)
    if action == "purge":
        return _purge(args, [p.keys.dead for p in parts], "dead letter(s)")
    for part in parts:
        for record in part.dead_letters(args.n if args.n is not None else 20):
            record.pop("payload", None)
            print(json.dumps(record))
    return 0


def cmd_invalid(args) -> int:
    parts = _partitions(args)
    if _action(args) == "purge":
        return _purge(args, [p.keys.invalid for p in parts], "invalid payload(s)")
    for part in parts:
        for record in part.invalid_entries(args.n):
            print(json.dumps(record))
    return 0


def cmd_invalid_seeds(args) -> int:
    settings, spidercls = _spider_class(args)
    key = _seed_keys(args, settings, spidercls).invalid
    if _action(args) == "purge":
        return _purge(args, [key], "invalid seed(s)")
    for raw in _client(args).lrange(key, 0, args.n - 1):
        try:
            print(json.dumps(json.loads(raw)))
        except ValueError:
            print(json.dumps({"seed": raw.decode("utf-8", "replace"), "reason": "unreadable"}))
    return 0


def cmd_replay(args) -> int:
    count = args.n if args.n is not None else 1000
    print(f"replayed {replay_dead_letters(_partitions(args), count)} dead letter(s)")
    return 0
