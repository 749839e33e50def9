"""What a node does when it starts into a crawl an operator stopped, drained
or paused (``CONTROL_ON_START``; the states: :mod:`crawlproject.control`).

The state stays in Redis after the crawl: a node started tomorrow finds
yesterday's ``stop`` or ``drain``. It says so in one WARNING (the state, who
set it and when, the command that resumes the crawl), then:

* ``"wait"`` (the default): it stays up and is *held*. In a stop it takes
  nothing; in a drain it takes no seed, helps finish what the frontier still
  holds, then waits instead of closing. It neither closes because of that
  state nor counts as idle (``MAX_IDLE_TIME_BEFORE_CLOSE``), as in a pause.
  The first change of state ends the hold: from then on the state applies as
  to any running node (``resume``: it crawls; a new ``stop``: it closes).
* ``"exit"``: it closes at once with finish reason ``control_<state>_at_start``
  (``scrapy crawl`` exits 1 with ``COMMANDS_MODULE = "crawlproject.commands"``).

Why ``"wait"`` by default: long-lived workers run under something that starts
them again whatever their exit code (compose ``restart: unless-stopped``, a
Kubernetes Deployment, systemd ``Restart=always``); a node that exits there
restarts in a loop, while a held node costs one Redis read a second and goes on
by itself when the operator resumes. ``"exit"`` suits runs whose exit code is
read: a cron job, a Kubernetes Job, systemd ``Restart=on-failure``, CI.
A paused cluster always holds a node (a pause is waited out by definition).
"""

from __future__ import annotations

import logging

from crawlproject.control import resume_command, who_and_when

logger = logging.getLogger(__name__)

MODES = ("wait", "exit")
HELD_STATES = ("stop", "drain")


def check_mode(value) -> str:
    """``CONTROL_ON_START``, checked."""
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise ValueError(f"CONTROL_ON_START must be 'wait' or 'exit', not {value!r}")
    return mode


class StartState:
    """The operator's state found at start, and whether it still holds the node."""

    def __init__(self, spider: str, mode: str):
        self.spider = spider
        self.mode = check_mode(mode)
        #: the state (stop, drain) that holds this node since its start, or None
        self.held: str | None = None

    def arrived(self, info: dict, log_extra: dict | None = None) -> str:
        """The node read its first state, *info* (not ``run``): log it once
        and say what to do: ``"exit"``, ``"wait"`` (held) or ``"follow"`` (a
        pause: as any node does)."""
        state = info["state"]
        action = ("exit" if self.mode == "exit" else "wait") if state in HELD_STATES \
            else "follow"
        if action == "wait":
            self.held = state
        if info.get("broken"):   # a key of the wrong type: its own ERROR said it all
            return action
        does = {
            ("stop", "wait"): "this node takes nothing and waits (CONTROL_ON_START = 'wait')",
            ("drain", "wait"): "this node takes no seed, helps finish the frontier, then waits "
                               "instead of closing (CONTROL_ON_START = 'wait')",
            ("stop", "exit"): "this node closes now, exit code 1 (CONTROL_ON_START = 'exit')",
            ("drain", "exit"): "this node closes now, exit code 1 (CONTROL_ON_START = 'exit')",
            ("pause", "follow"): "this node takes nothing until it is resumed",
        }[state, action]
        then = (" It goes back to run by itself once the drain is complete (drain "
                "--then-clear)." if state == "drain" and info.get("then_clear") else "")
        logger.warning("The crawl of %r is in state %r, %s: %s.%s To crawl again: %s",
                       self.spider, state, who_and_when(info), does, then,
                       resume_command(self.spider), extra=log_extra or {})
        return action

    def release(self, new: str, log_extra: dict | None = None) -> None:
        """The state changed: it no longer holds the node (the new one applies)."""
        if self.held is not None:
            logger.info("Operator control: %s after %s: no longer held by the state found at "
                        "start", new, self.held, extra=log_extra or {})
            self.held = None
