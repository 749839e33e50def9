"""crawlctl seed: seeds checked as the nodes check them, then pushed."""

from __future__ import annotations

import os
import sys

from crawlproject.control import read_state, resume_command, who_and_when
from crawlproject.ops.common import UsageError
from crawlproject.policy import InputPolicy
from crawlproject.seeds import InvalidSeed, check_seed, parse_seed
from crawlproject.cli.common import _client, _seed_keys, _spider_class, redis_where


def cmd_seed(args) -> int:
    settings, spidercls = _spider_class(args)
    if spidercls is None:
        print(f"note: spider {args.spider!r} is not in this project: seeds are checked "
              "without its callbacks", file=sys.stderr)
    policy = InputPolicy.from_settings(settings, spidercls)
    key = _seed_keys(args, settings, spidercls).key
    _warn_unless_running(_client(args), args.spider)
    if args.file:
        return _seed_file(args, policy, key)
    if not args.seeds:
        raise UsageError("give seeds, or --file FILE (- for standard input)")
    for raw in args.seeds:
        try:
            check_seed(raw, policy)
        except InvalidSeed as exc:
            raise UsageError(f"invalid seed {raw[:100]!r} ({exc.code}): {exc}") from None
    _client(args).lpush(key, *args.seeds)
    print(f"pushed {len(args.seeds)} seed(s) to {key} on {redis_where(args)}")
    return 0


def _warn_unless_running(client, spider: str) -> None:
    """Seeds pushed while the crawl is paused, draining or stopped wait in
    Redis: they are pushed all the same (a seeding job may load tomorrow's
    seeds before the resume), with a warning on stderr saying so."""
    info = read_state(client, spider)
    if info["state"] == "run":
        return
    if info.get("error"):
        print(f"warning: {info['error']}", file=sys.stderr)
        return
    until = ("the drain ends by itself (--then-clear) or: " if info["then_clear"]
             else "")
    print(f"warning: the crawl of {spider!r} is in state {info['state']!r} "
          f"({who_and_when(info)}): nodes take no seed until {until}"
          f"{resume_command(spider)}. The seeds are pushed and wait in Redis.", file=sys.stderr)


SEED_CHUNK = 5000


SEED_ERRORS_SHOWN = 20


def _seed_file(args, policy: InputPolicy, key: str) -> int:
    """Stream a file of seeds (one a line; blank lines and ``#`` comments
    skipped): each line checked as the nodes check it, good ones pushed in
    pipelined chunks, bad ones reported with their line number (exit 2)."""
    from rich.progress import BarColumn, Progress, TextColumn, TransferSpeedColumn

    client = _client(args)
    try:
        source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    size = None if args.file == "-" else os.fstat(source.fileno()).st_size
    pushed = bad = 0
    chunk: list[bytes] = []

    def flush() -> None:
        nonlocal pushed
        if chunk:
            pipe = client.pipeline(transaction=False)
            for i in range(0, len(chunk), 1000):
                pipe.lpush(key, *chunk[i:i + 1000])
            pipe.execute()
            pushed += len(chunk)
            chunk.clear()

    progress = Progress(TextColumn("seeds"), BarColumn(), TextColumn("{task.fields[n]} lines"),
                        TransferSpeedColumn(), disable=not sys.stderr.isatty(),
                        console=None, transient=True)
    plain_checked = False
    with source, progress:
        task = progress.add_task("seed", total=size, n=0)
        for number, line in enumerate(source, 1):
            raw = line.strip()
            if raw and not raw.startswith(b"#"):
                try:
                    if plain_checked and not raw.startswith((b"{", b"[")):
                        # A plain URL: only its URL differs from the plain seed fully
                        # checked before, and parse_seed checks that with the engine's
                        # parser (4x faster than building and encoding its request).
                        parse_seed(raw)
                    else:
                        check_seed(raw, policy)
                        plain_checked = plain_checked or not raw.startswith((b"{", b"["))
                    chunk.append(raw)
                except InvalidSeed as exc:
                    bad += 1
                    if bad <= SEED_ERRORS_SHOWN:
                        print(f"line {number}: {exc.code}: {exc} ({raw[:80]!r})", file=sys.stderr)
                if len(chunk) >= SEED_CHUNK:
                    flush()
            if number % 10000 == 0:
                progress.update(task, completed=source.tell() if size else None, n=number)
        flush()
    if bad > SEED_ERRORS_SHOWN:
        print(f"... and {bad - SEED_ERRORS_SHOWN} more invalid line(s)", file=sys.stderr)
    print(f"pushed {pushed} seed(s) to {key} on {redis_where(args)}"
          + (f"; {bad} invalid line(s) not pushed" if bad else ""))
    return 2 if bad else 0
