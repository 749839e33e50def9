"""Request lifecycle hooks: what the shared scheduler tells about each lease.

:class:`~crawlproject.scheduler.RedisScheduler` knows when this node leased a
request from the frontier and when that lease ended; components that want to
follow requests (tracing: :mod:`crawlproject.extensions.tracing`) register a
:class:`RequestHooks` object for their crawler in ``from_crawler``::

    add_request_hooks(crawler, self)

and the scheduler calls them (on the event loop's thread, never blocking):

* :meth:`RequestHooks.request_leased` once per leased request, when it enters
  the node's prefetch buffer;
* :meth:`RequestHooks.request_settled` once per lease when it ends, with the
  outcome: :data:`ACK` (done: downloaded, callback output consumed, items
  stored; also a request replaced by a redirect), :data:`RETRY` (back in the
  frontier to be tried again: a download retry or a callback that raised),
  :data:`DEAD` (dead-lettered) or :data:`RELEASED` (the node closed holding
  it: back in the queue for another node).

A hook that raises is logged once and left out from then on: a bug in one
never stops the crawl.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

ACK = "ack"
RETRY = "retry"
DEAD = "dead"
RELEASED = "released"
OUTCOMES = (ACK, RETRY, DEAD, RELEASED)

_HOOKS: WeakKeyDictionary = WeakKeyDictionary()


class RequestHooks:
    """Base class (all methods do nothing): override the ones you need."""

    def request_leased(self, request, *, member: str, partition: int, node: str,
                       key: str) -> None:
        """*request* was leased to node *node* as entry *member* of frontier
        partition *partition*; *key* is its politeness key (its site)."""

    def request_settled(self, request, *, member: str, outcome: str) -> None:
        """The lease of *request* ended with *outcome* (one of :data:`OUTCOMES`)."""


def add_request_hooks(crawler, hooks: RequestHooks) -> None:
    """Have *crawler*'s scheduler call *hooks* (call before the spider opens)."""
    _HOOKS.setdefault(crawler, []).append(hooks)


def request_hooks(crawler) -> list[RequestHooks]:
    """The hooks registered for *crawler* (a copy)."""
    return list(_HOOKS.get(crawler, ()))
