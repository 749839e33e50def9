"""crawlctl pause / resume / drain / stop."""

from __future__ import annotations

import os
import socket

from crawlproject.control import resume_command
from crawlproject.ops.actions import control_command
from crawlproject.cli.common import CONTROL_HINT, _client

#: what the new state means for a node started later (the state stays in Redis)
LATER = {
    "pause": "nodes started later wait too",
    "drain": "nodes started later take no seed and wait (CONTROL_ON_START = 'wait') or exit 1 "
             "('exit')",
    "stop": "it stays so: nodes started later wait (CONTROL_ON_START = 'wait') or exit 1 "
            "('exit')",
}


def cmd_control(args) -> int:
    """pause / resume / drain / stop: the state every node reads within ~1 s."""
    who = f"{os.environ.get('USER') or 'operator'}@{socket.gethostname()}"
    then_clear = getattr(args, "then_clear", False)
    previous, state = control_command(_client(args), args.spider, args.command, who,
                                      force=args.force, then_clear=then_clear)
    print(f"{args.spider}: {previous} -> {state} (nodes follow within about "
          f"{CONTROL_HINT}s)")
    if state == "drain" and then_clear:
        print("once the drain is complete (nothing queued or leased, draining nodes closed) "
              "the state goes back to run by itself")
    elif state != "run":
        print(f"{LATER[state]}; to crawl again: {resume_command(args.spider)}")
    return 0
