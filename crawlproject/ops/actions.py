"""What an operator does to a running crawl: pause/resume/drain/stop for
every node, and dead letters replayed into the frontier."""

from __future__ import annotations


from crawlproject.control import set_state
from crawlproject.frontier.queue import Frontier


CONTROL_COMMANDS = ("pause", "resume", "drain", "stop")


def control_command(client, spider: str, command: str, by: str,
                    force: bool = False, then_clear: bool = False) -> tuple[str, str]:
    """Apply ``pause | resume | drain | stop``; returns (previous state, new state).
    A control key of the wrong type raises ``ControlKeyError`` (a ValueError)
    unless *force*, which replaces it. *then_clear* (drain): back to ``run``
    once the drain is complete."""
    if command not in CONTROL_COMMANDS:
        raise ValueError(f"unknown control command {command!r}")
    state = {"resume": "run"}.get(command, command)
    return set_state(client, spider, state, by=by, force=force, then_clear=then_clear), state


def replay_dead_letters(parts: list[Frontier], count: int = 1000) -> int:
    """Move up to *count* dead letters of each partition back (fresh retries)."""
    return sum(part.replay_dead(count) for part in parts)
