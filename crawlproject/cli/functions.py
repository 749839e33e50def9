"""crawlctl functions load: the project's Redis code, loaded by the operator."""

from __future__ import annotations

from crawlproject.cli.common import _client
from crawlproject.frontier.library import load, scripts


def cmd_functions(args) -> int:
    """Load this version's functions library (Redis 7) or scripts (6.2) on
    every master; idempotent. Nodes whose Redis user may not load code wait
    for it (docs/deploy.md, "Redis functions")."""
    result = load(_client(args))
    where = f"{result['masters']} master(s)" if result["masters"] > 1 else "Redis"
    if result["functions"]:
        print(f"functions library {result['library']}: loaded on {result['loaded']} of "
              f"{where} (already there on the others)" if result["masters"] > 1 else
              f"functions library {result['library']}: "
              f"{'loaded' if result['loaded'] else 'already loaded'}")
    else:
        print(f"Redis without functions (6.2): {len(scripts())} scripts in the script cache of "
              f"{where}; a restart of Redis empties it: run this again then")
    return 0
