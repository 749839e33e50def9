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


def replay_dead_letters(parts: list[Frontier], count: int = 1000, *, key_of=None,
                        skipped: list | None = None) -> int:
    """Move up to *count* dead letters of each partition back (fresh retries),
    each under the politeness key the nodes compute from its payload's URL
    (*key_of*: by default :func:`politeness_key_function` of the project's
    settings), never the key the record names. Records that cannot be
    replayed stay, each appended to *skipped* as ``(letter, reason)``."""
    key_of = key_of or politeness_key_function()
    return sum(part.replay_dead(count, key_of=key_of, skipped=skipped) for part in parts)


def politeness_key_function(settings=None):
    """``key_of(url, payload data)``: the politeness key a node gives a request
    of *url* (:meth:`crawlproject.scheduling.sitepoliteness.SitePoliteness.key`,
    the nodes' own function, from *settings*: by default the project's). A
    payload's ``meta["download_slot"]`` counts as the nodes count it (only with
    ``FRONTIER_HONOUR_DOWNLOAD_SLOT``). ``ip`` keys are what a node that has
    not resolved the host uses: the host name."""
    from scrapy import Request

    from crawlproject.ops.common import current_project
    from crawlproject.scheduling.sitepoliteness import SitePoliteness

    if settings is None:
        settings, _ = current_project()
    politeness = SitePoliteness.from_settings(settings)

    def key_of(url: str, data: dict) -> str:
        meta = data.get("meta") if isinstance(data, dict) else None
        slot = meta.get("download_slot") if isinstance(meta, dict) else None
        return politeness.key(Request(url, meta={"download_slot": slot}
                                      if isinstance(slot, str) else None))
    return key_of
