"""Outage logging: one WARNING when a service stops answering, a reminder now
and then, one INFO with the downtime when it answers again.

Every component of a node that talks to the same service shares one
:class:`OutageLog` (:func:`outage_log`), so an outage of Redis is reported
once per node, not once per failed call of each component. Each component
names itself (``source``): the outage ends when every component that saw it
has succeeded since, so one whose calls reach a healthy master of a Redis
Cluster does not end the outage another sees on a dead one.
"""

from __future__ import annotations

import logging
import time
import weakref

from crawlproject.acl import redis_user, refusal
from crawlproject.connection import redis_params, redis_url_from_settings

logger = logging.getLogger(__name__)

REMINDER_INTERVAL = 60.0
_logs: "weakref.WeakKeyDictionary[object, dict[str, OutageLog]]" = weakref.WeakKeyDictionary()


class OutageLog:
    """Tracks the availability of one service.

    *service* names it in log lines (``"Redis at redis://***@host:6379/0"``),
    *name* in stats (``<name>/outages``, ``<name>/outage_seconds``).
    """

    def __init__(self, service: str, *, name: str = "service", stats=None, reminder_interval: float = REMINDER_INTERVAL,
                 clock=time.monotonic, log: logging.Logger = logger, user: str = "default"):
        self.service = service
        self.name = name
        self.stats = stats
        self.reminder_interval = reminder_interval
        self.clock = clock
        self.log = log
        self.since: float | None = None
        self.failures = 0
        # Components whose last call failed. A Redis Cluster can be partly
        # down: one component's success on a healthy master must not end the
        # outage another component still sees.
        self._failing: set[str] = set()
        self._last_reminder: float | None = None   # set with since (None: no outage yet)
        #: The Redis user the node logs in as (named when Redis refuses a
        #: command for lack of an ACL permission), and what was refused already.
        self.user = user
        self._refusals: set[str] = set()

    def _stats(self):
        # A stats collector, or a callable returning one (a crawler's stats
        # exist only once the crawl starts).
        return self.stats() if callable(self.stats) else self.stats

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, what: str, exc: BaseException, extra: dict | None = None,
               source: str = "", refused: bool = False, denied: str | None = None) -> None:
        """A call to the service failed (*what*: doing what; *source*: which
        component, whose next :meth:`ok` clears it). *refused*: the service
        answered with an error (a key of the wrong type), it is not down; the
        node waits for it as for an outage, and says which it is. An ACL
        refusal (NOPERM) is named once: what was refused (*denied*, when the
        caller found out more than the error says) and the user."""
        now = self.clock()
        self._failing.add(source)
        self.failures += 1
        acl = self._denied(what, exc, extra, denied)
        refused = refused or acl
        if self.since is None:
            self.since = self._last_reminder = now
            self.failures = 1
            stats = self._stats()
            if stats is not None:
                stats.inc_value(f"{self.name}/outages")
            if acl:  # said by _denied, in words that name the cause
                return
            self.log.warning("%s %s (%s: %s: %s); retrying, work is kept", self.service,
                             "refuses a call" if refused else "is unreachable", what,
                             type(exc).__name__, exc, extra=extra)
        elif now - self._last_reminder >= self.reminder_interval:
            self._last_reminder = now
            self.log.warning("%s still %s after %.0fs (%d failed calls; last: %s: %s)",
                             self.service, "refusing calls" if refused else "unreachable",
                             now - self.since, self.failures, type(exc).__name__, exc,
                             extra=extra)

    def _denied(self, what: str, exc: BaseException, extra: dict | None,
                refused_what: str | None) -> bool:
        """*exc* is an ACL refusal (NOPERM): counted each time
        (``<name>/noperm``), and one ERROR per refused thing naming it and the
        user (never the password). False for any other error."""
        found = refusal(exc)
        if found is None:
            return False
        refused_what = refused_what or found
        stats = self._stats()
        if stats is not None:
            stats.inc_value(f"{self.name}/noperm")
        if refused_what not in self._refusals:
            self._refusals.add(refused_what)
            self.log.error("%s refuses %s to Redis user %r (NOPERM, %s: %s: %s); the node waits "
                           "and retries: give the user the rights of its role in "
                           "deploy/users.acl (docs/deploy.md, \"Redis users (ACL)\")",
                           self.service, refused_what, self.user, what, type(exc).__name__, exc,
                           extra=extra)
        return True

    def ok(self, extra: dict | None = None, source: str = "") -> None:
        """A call of component *source* succeeded. The outage ends once every
        component that saw it failing has succeeded since."""
        self._failing.discard(source)
        if self.since is None or self._failing:
            return
        downtime = self.clock() - self.since
        self.since = None
        stats = self._stats()
        if stats is not None:
            stats.inc_value(f"{self.name}/outage_seconds", round(downtime, 3))
        self.log.info("%s answers again after %.1fs (%d failed calls)", self.service, downtime,
                      self.failures, extra=extra)


def outage_log(crawler, name: str, service: str) -> OutageLog:
    """The :class:`OutageLog` *name* (``"redis"``) shared by all components of *crawler*."""
    per_crawler = _logs.setdefault(crawler, {})
    if name not in per_crawler:
        user = "default"
        if name == "redis":  # named when Redis refuses a command (ACL)
            settings = crawler.settings
            user = redis_user(redis_url_from_settings(settings), redis_params(settings))
        per_crawler[name] = OutageLog(service, name=name, user=user,
                                      stats=lambda: getattr(crawler, "stats", None))
    return per_crawler[name]
