"""Incremental recrawl: which pages are revisited when, and what a visit found.

Model: crawler-commons' URL Frontier "known URL with a refetchable-from date".
Every page a revisit rule covers gets a *page record* in MongoDB (collection
``<spider>_pages``, one document per URL, in ``MONGO_DATABASE``): the
request that fetches it (as the frontier stores it, JSON), the validators the
site sent (``etag``, ``last_modified``), the sha1 of the body (``body_hash``),
its revisit ``interval`` and ``next_visit``, when it was last checked and last
changed, how often, and the items it produced (so that a page answering
404/410 marks them gone). Why MongoDB and not Redis: docs/recrawl.md
(measured by ``python -m bench.recrawl_memory``).

The pieces:

* :class:`RecrawlPolicy`: revisit rules per URL pattern (spider attribute
  ``recrawl_rules`` first, then ``RECRAWL_RULES``, then ``RECRAWL_INTERVAL``
  for every other page), fixed or adaptive intervals;
* :func:`next_state`: what a visit does to a page's state (pure);
* :class:`PageVisit` and :class:`GoneMark`: the items that carry a visit to
  the MongoDB pipeline, so that a page record is stored with the same
  guarantees as any item (acknowledged after it is stored, spooled through
  outages, idempotent);
* ``crawlproject.recrawl.middleware``: conditional requests, 304 / unchanged
  / gone handling; ``crawlproject.recrawl.extension``: due pages back into
  the frontier.

A revisit request carries the page's previous state in ``meta["recrawl"]``
(:data:`STATE_META`). It is stored in Redis with the request, so it is
untrusted when it comes back: :func:`checked_state` keeps only well-formed
values.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

from scrapy import Field, Item

from crawlproject.defaults import setting

__all__ = ["RevisitRule", "RecrawlPolicy", "PageState", "next_state", "checked_state",
           "body_hash", "PageVisit", "PageCheck", "GoneMark", "STATE_META", "VISIT_META",
           "OUTCOMES", "MAX_ITEMS_PER_PAGE", "lastmod_due"]

#: meta key of a revisit's previous page state (stored with the request).
STATE_META = "recrawl"
#: meta key of what this download found (transient: never stored).
VISIT_META = "_crawlproject_recrawl_visit"
#: What a visit can find.
OUTCOMES = ("new", "changed", "unchanged", "gone")
#: Item keys kept per page record (to mark them gone).
MAX_ITEMS_PER_PAGE = 50
_MAX_VALIDATOR = 256
_HEX40 = re.compile(r"[0-9a-f]{40}")
# A header value may hold no control characters (a CR/LF would inject headers).
_HEADER_SAFE = re.compile(r"[\x20-\x7e\x80-\xff]+")


@dataclass(frozen=True)
class RevisitRule:
    """Revisit the URLs *pattern* finds (``re.search``) every *interval* seconds.

    With *adaptive*, the interval of a page is divided by *factor* when a visit
    finds it changed and multiplied by it when unchanged, within
    [*min_interval*, *max_interval*]. *priority* is the revisit requests'
    frontier priority (below fresh discoveries, priority 0, by default).
    """

    pattern: str
    interval: float
    adaptive: bool = False
    min_interval: float = 0.0
    max_interval: float = 0.0
    factor: float = 2.0
    priority: int = -100

    def __post_init__(self) -> None:
        re.compile(self.pattern)
        if not self.interval > 0:
            raise ValueError(f"recrawl rule {self.pattern!r}: interval must be > 0 seconds")
        if self.factor <= 1:
            raise ValueError(f"recrawl rule {self.pattern!r}: factor must be > 1")
        lo = self.min_interval or self.interval / 16
        hi = self.max_interval or self.interval * 16
        if not 0 < lo <= self.interval <= hi:
            raise ValueError(f"recrawl rule {self.pattern!r}: need 0 < min_interval <= "
                             f"interval <= max_interval")
        object.__setattr__(self, "min_interval", lo)
        object.__setattr__(self, "max_interval", hi)

    @classmethod
    def parse(cls, raw: Any) -> "RevisitRule":
        """A rule from settings: ``{"pattern": ..., "interval": ..., ...}``."""
        if not isinstance(raw, Mapping) or "pattern" not in raw or "interval" not in raw:
            raise ValueError(f"a recrawl rule is a dict with 'pattern' and 'interval', got {raw!r}")
        unknown = set(raw) - {"pattern", "interval", "adaptive", "min_interval",
                              "max_interval", "factor", "priority"}
        if unknown:
            raise ValueError(f"recrawl rule {raw.get('pattern')!r}: unknown keys {sorted(unknown)}")
        return cls(pattern=str(raw["pattern"]), interval=float(raw["interval"]),
                   adaptive=bool(raw.get("adaptive", False)),
                   min_interval=float(raw.get("min_interval") or 0),
                   max_interval=float(raw.get("max_interval") or 0),
                   factor=float(raw.get("factor", 2.0)),
                   priority=int(raw.get("priority", -100)))

    def bound(self, interval: float) -> float:
        return min(self.max_interval, max(self.min_interval, interval))


class RecrawlPolicy:
    """The revisit rules of one spider, first match wins."""

    def __init__(self, rules: Iterable[RevisitRule]):
        self.rules = list(rules)
        self._compiled = [(re.compile(r.pattern), r) for r in self.rules]

    @classmethod
    def from_settings(cls, settings, spidercls=None) -> "RecrawlPolicy":
        raw = list(getattr(spidercls, "recrawl_rules", None) or ())
        raw += setting(settings, "RECRAWL_RULES")  # also -s RECRAWL_RULES='[{...}]'
        rules = [r if isinstance(r, RevisitRule) else RevisitRule.parse(r) for r in raw]
        interval = setting(settings, "RECRAWL_INTERVAL")
        if interval > 0:
            rules.append(RevisitRule(
                pattern="", interval=interval,
                adaptive=setting(settings, "RECRAWL_ADAPTIVE"),
                min_interval=setting(settings, "RECRAWL_MIN_INTERVAL"),
                max_interval=setting(settings, "RECRAWL_MAX_INTERVAL"),
                priority=setting(settings, "RECRAWL_PRIORITY")))
        return cls(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule_for(self, url: str) -> RevisitRule | None:
        """The rule that covers *url*, or None (the page is not revisited)."""
        for regex, rule in self._compiled:
            if regex.search(url):
                return rule
        return None


@dataclass(frozen=True)
class PageState:
    """What is known of a page before a visit (from ``meta["recrawl"]``)."""

    etag: str | None = None
    last_modified: str | None = None
    body_hash: str | None = None
    interval: float | None = None
    checks: int = 0
    changes: int = 0
    gone: bool = False

    def validators(self) -> dict[bytes, bytes]:
        """The conditional request headers this state allows."""
        headers = {}
        if self.etag:
            headers[b"If-None-Match"] = self.etag.encode("latin-1")
        if self.last_modified:
            headers[b"If-Modified-Since"] = self.last_modified.encode("latin-1")
        return headers


def _header_value(value: Any) -> str | None:
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_VALIDATOR:
        return None
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return None
    return value if _HEADER_SAFE.fullmatch(value) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else 0


def checked_state(raw: Any) -> PageState | None:
    """The :class:`PageState` in *raw* (``meta["recrawl"]``, untrusted), or None.

    Values that are not what a page record holds are dropped one by one: a bad
    ``etag`` is no validator, a bad interval is the rule's; nothing raises.
    """
    if not isinstance(raw, Mapping):
        return None
    interval = raw.get("interval")
    if not (isinstance(interval, (int, float)) and not isinstance(interval, bool)
            and 0 < interval < 10 * 365 * 86400):
        interval = None
    body = raw.get("body_hash")
    return PageState(etag=_header_value(raw.get("etag")),
                     last_modified=_header_value(raw.get("last_modified")),
                     body_hash=body if isinstance(body, str) and _HEX40.fullmatch(body) else None,
                     interval=float(interval) if interval is not None else None,
                     checks=_count(raw.get("checks")), changes=_count(raw.get("changes")),
                     gone=raw.get("gone") is True)


def body_hash(body: bytes) -> str:
    """sha1 of a response body: "changed" when the site sends no validators."""
    return hashlib.sha1(body).hexdigest()


def next_state(rule: RevisitRule, previous: PageState | None, outcome: str) -> dict[str, Any]:
    """The interval and counters after a visit that found *outcome*.

    A first visit (``new``) starts at the rule's interval. An adaptive rule
    shrinks the interval of a page found changed and stretches that of a page
    found unchanged; a fixed rule keeps the rule's interval. A page gone is
    checked again at the longest interval (it may come back).
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    interval = rule.bound(previous.interval if previous and previous.interval else rule.interval)
    if not rule.adaptive:
        interval = rule.interval
    elif outcome == "changed":
        interval = rule.bound(interval / rule.factor)
    elif outcome == "unchanged":
        interval = rule.bound(interval * rule.factor)
    elif outcome == "new":
        interval = rule.interval
    if outcome == "gone":
        interval = rule.max_interval
    checks = (previous.checks if previous else 0) + 1
    changes = (previous.changes if previous else 0) + (outcome in ("new", "changed"))
    return {"interval": interval, "checks": checks, "changes": changes}


class PageVisit(Item):
    """A page record update (stored by the MongoDB pipeline in ``RECRAWL_COLLECTION``).

    Keyed on ``url``; ``first_seen`` and ``updated_at`` come from the pipeline
    as for any item (``first_seen`` never moves).
    """

    mongo_key = "url"
    mongo_collection = "%(spider)s_pages"

    url = Field()
    request = Field()        # the request's JSON payload, to fetch it again
    outcome = Field()        # new / changed / unchanged / gone
    status = Field()
    etag = Field()
    last_modified = Field()
    body_hash = Field()
    interval = Field()       # seconds until the next visit
    next_visit = Field()     # datetime (UTC); the feeder pushes due pages
    last_checked = Field()
    last_changed = Field()
    checks = Field()
    changes = Field()
    gone_at = Field()
    items = Field()          # [[collection, key], ...] the page produced
    sitemap_lastmod = Field()  # datetime (UTC) a sitemap gave the page (crawlproject.sitemaps)
    # (sitemap_due_at: when a newer sitemap lastmod last made the page due;
    # set with it by the recrawl feeder (make_due), kept by the pipeline's merge.)


class PageCheck(PageVisit):
    """A page record update of a visit that found the page unchanged or gone:
    only its fields are set (a ``$set``, not a rewrite: most revisits are these)."""

    mongo_write = "touch"


class GoneMark(Item):
    """Mark the stored item *key* of *collection* gone (``gone_at``), not deleted.

    Written as a partial update by the MongoDB pipeline: the document's other
    fields stay; a later store of the item clears the mark.
    """

    mongo_write = "gone"

    collection = Field()
    key_field = Field()
    key = Field()


def visit_record(url: str, rule: RevisitRule, previous: PageState | None, outcome: str, *,
                 status: int, now: datetime, payload: str | None, etag: str | None,
                 last_modified: str | None, body: str | None,
                 items: list[list] | None = None,
                 sitemap_lastmod: datetime | None = None) -> PageVisit:
    """The :class:`PageVisit` of one visit (see :func:`next_state`): a
    :class:`PageCheck` when it found the page unchanged or gone."""
    state = next_state(rule, previous, outcome)
    record = (PageVisit if outcome in ("new", "changed") else PageCheck)(
        url=url, outcome=outcome, status=status, interval=state["interval"],
        next_visit=now + timedelta(seconds=state["interval"]), last_checked=now,
        checks=state["checks"], changes=state["changes"])
    if payload is not None:
        record["request"] = payload
    if sitemap_lastmod is not None:
        record["sitemap_lastmod"] = sitemap_lastmod
    if outcome == "gone":
        record["gone_at"] = now
        return record
    record["gone_at"] = None
    # Unchanged: the stored validators stay valid (a 304 sends none back).
    record["etag"] = etag if outcome != "unchanged" or etag else (previous.etag if previous else None)
    record["last_modified"] = (last_modified if outcome != "unchanged" or last_modified
                               else (previous.last_modified if previous else None))
    record["body_hash"] = body or (previous.body_hash if previous else None)
    if outcome in ("new", "changed"):
        record["last_changed"] = now
        record["items"] = items or []
    return record


def lastmod_due(records: Iterable[Mapping[str, Any]], lastmods: Mapping[str, datetime],
                policy: RecrawlPolicy, now: datetime) -> list[Any]:
    """The ``_id`` of each page record of *records* (read with ``url``,
    ``last_checked``, ``next_visit``, ``sitemap_due_at``) that a sitemap's
    ``lastmod`` (*lastmods*: URL → UTC datetime) makes due now.

    Due only when all hold: a revisit rule covers the URL; the page was last
    fetched (``last_checked``) before its ``lastmod``; it is not due already
    (nor set aside: an ``invalid`` record has no ``next_visit``); and no
    sitemap made it due within its rule's ``min_interval`` (``sitemap_due_at``),
    so a sitemap cannot make a page due over and over. A ``lastmod`` in the
    future is the caller's to refuse.
    """
    due = []
    for doc in records:
        url = doc.get("url")
        lastmod = lastmods.get(url) if isinstance(url, str) else None
        rule = policy.rule_for(url) if lastmod is not None else None
        checked, next_visit, before = (_aware(doc.get("last_checked")),
                                       _aware(doc.get("next_visit")),
                                       _aware(doc.get("sitemap_due_at")))
        if (rule is None or not isinstance(checked, datetime) or not checked < lastmod
                or not isinstance(next_visit, datetime) or not next_visit > now
                or isinstance(before, datetime)
                and before > now - timedelta(seconds=rule.min_interval)):
            continue
        due.append(doc["_id"])
    return due


def _aware(value: Any) -> Any:
    # BSON dates are UTC; a client not tz_aware reads them naive.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def utc_now() -> datetime:
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
