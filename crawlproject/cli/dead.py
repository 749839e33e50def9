"""crawlctl dead / invalid / invalid-seeds / replay: what was set aside, and
putting it back.

Records are read from Redis (untrusted): each one is printed as one JSON line,
what an operator may see of it (long text cut, nested values summarised:
:mod:`crawlproject.frontier.deadletters`), or ``{"unreadable": reason, "raw":
...}``; a replay puts back only records whose payload has a usable URL, under
the politeness key the nodes compute from it, and names the others."""

from __future__ import annotations

import json
import sys
from collections import Counter

from crawlproject.frontier.deadletters import unreadable
from crawlproject.ops.actions import politeness_key_function, replay_dead_letters
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
        for letter in part.dead_records(args.n if args.n is not None else 20):
            print(json.dumps(letter.shown if letter.shown is not None else unreadable(letter)))
    return 0


def cmd_invalid(args) -> int:
    parts = _partitions(args)
    if _action(args) == "purge":
        return _purge(args, [p.keys.invalid for p in parts], "invalid payload(s)")
    for part in parts:
        for letter in part.invalid_records(args.n):
            print(json.dumps(letter.shown if letter.shown is not None else unreadable(letter)))
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
    settings, _ = _spider_class(args)
    skipped: list = []
    replayed = replay_dead_letters(_partitions(args), count,
                                   key_of=politeness_key_function(settings), skipped=skipped)
    print(f"replayed {replayed} dead letter(s)")
    if skipped:
        reasons = Counter(reason for _, reason in skipped)
        print(f"kept {len(skipped)} dead letter(s) that cannot be replayed (still listed by "
              f"crawlctl dead {args.spider}; purge them with dead purge): "
              + "; ".join(f"{n} × {reason}" for reason, n in reasons.most_common(10)),
              file=sys.stderr)
    return 0
