"""crawlctl pause / resume / drain / stop."""

from __future__ import annotations

import os
import socket

from crawlproject.ops.actions import control_command
from crawlproject.cli.common import CONTROL_HINT, _client


def cmd_control(args) -> int:
    """pause / resume / drain / stop: the state every node reads within ~1 s."""
    who = f"{os.environ.get('USER') or 'operator'}@{socket.gethostname()}"
    previous, state = control_command(_client(args), args.spider, args.command, who,
                                      force=args.force)
    print(f"{args.spider}: {previous} -> {state} (nodes follow within about "
          f"{CONTROL_HINT}s)")
    return 0
