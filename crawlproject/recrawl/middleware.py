"""Incremental recrawl in the crawl: conditional requests and what a visit found.

:class:`RecrawlMiddleware` (downloader, 580):

* a revisit (a request with ``meta["recrawl"]``, put back in the frontier by
  :class:`crawlproject.recrawl.extension.RecrawlFeeder`) is sent with the
  page's stored validators as ``If-None-Match`` / ``If-Modified-Since``
  (not for rendered requests: the browser makes its own);
* each answer of a page a revisit rule covers is classified: ``new`` (first
  visit), ``changed``, ``unchanged`` (``304 Not Modified`` to a conditional
  request, or the same body sha1 as last time when the site sends no
  validators) or ``gone`` (404/410 on a revisit);
* an unchanged or gone page skips the spider's callback and storage: its
  response goes to :meth:`RecrawlMiddleware.record` instead, which yields only
  the page record (:class:`~crawlproject.recrawl.PageVisit`) and, for a gone
  page, a :class:`~crawlproject.recrawl.GoneMark` per item the page produced.

:class:`RecrawlSpiderMiddleware` (spider, 950) lets a new or changed page's
callback output through and adds the page record after it, with the keys of
the items the page produced.

Page records are items: they go through the MongoDB pipeline like any item,
so the request is acknowledged only once its record is stored (a node killed
before loses nothing: the revisit is crawled again).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, AsyncIterator

from itemadapter import ItemAdapter
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import Response

from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import PAYLOAD_META
from crawlproject.connection import collection_name, mongo_collection_pattern, mongo_unique_key
from crawlproject.policy import InputPolicy
from crawlproject.recrawl.schedule import (
    MAX_ITEMS_PER_PAGE,
    STATE_META,
    VISIT_META,
    GoneMark,
    PageVisit,
    RecrawlPolicy,
    body_hash,
    checked_state,
    utc_now,
    visit_record,
)
from crawlproject.serialization import RequestEncodeError, request_to_json
from crawlproject.signing import Signer, signer_from_settings, unwrap
from crawlproject.sitemaps.parse import LASTMOD_META, lastmod_datetime

logger = logging.getLogger(__name__)

GONE_CODES = frozenset({404, 410})


def record_url(request: Request) -> str:
    """The URL a page record is kept under: the first URL of a redirect chain."""
    chain = request.meta.get("redirect_urls")
    return chain[0] if isinstance(chain, list) and chain and isinstance(chain[0], str) else request.url


def _enabled(crawler) -> RecrawlPolicy:
    s = crawler.settings
    if not setting(s, "RECRAWL_ENABLED"):
        raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
    policy = RecrawlPolicy.from_settings(s, crawler.spidercls)
    if not policy:
        raise NotConfigured("RECRAWL_ENABLED is on but no revisit rule: set RECRAWL_INTERVAL, "
                            "RECRAWL_RULES or the spider's recrawl_rules")
    return policy


class RecrawlMiddleware:
    """Downloader middleware: validators out, visit outcome in (module docstring)."""

    def __init__(self, crawler, policy: RecrawlPolicy, input_policy: InputPolicy,
                 item_collections: re.Pattern, signer: Signer | None = None):
        self.crawler = crawler
        self.stats = crawler.stats
        self.policy = policy
        self.input_policy = input_policy
        self.signer = signer
        #: the collections a gone mark may name (the spider's item collections)
        self.item_collections = item_collections

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        return cls(crawler, _enabled(crawler), InputPolicy.from_settings(s, crawler.spidercls),
                   item_collections_pattern(mongo_collection_pattern(s),
                                            crawler.spidercls.name,
                                            setting(s, "RECRAWL_GONE_COLLECTIONS")),
                   signer_from_settings(s, crawler.spidercls.name))

    def process_request(self, request: Request):
        state = checked_state(request.meta.get(STATE_META))
        if state is None or request.meta.get("playwright") or request.meta.get("render") is True:
            return None  # rendered: the browser cannot show a 304 (see the rendering middleware)
        headers = state.validators()
        for name, value in headers.items():
            request.headers.setdefault(name, value)
        if headers:
            self.stats.inc_value("recrawl/conditional")
        return None

    def process_response(self, request: Request, response: Response):
        if request.method != "GET":
            return response
        url = record_url(request)
        rule = self.policy.rule_for(url)
        if rule is None:
            return response
        raw = request.meta.get(STATE_META)
        state = checked_state(raw)
        if raw is not None and state is None:
            self.stats.inc_value("recrawl/invalid_state")
        digest = None
        if response.status == 304 and state is not None and state.validators():
            outcome = "unchanged"
        elif response.status in GONE_CODES and state is not None:
            outcome = "gone"
        elif 200 <= response.status < 300:
            digest = body_hash(response.body)
            if state is None:
                outcome = "new"
            elif state.body_hash == digest and not state.gone:
                outcome = "unchanged"
            else:
                outcome = "changed"
        else:
            return response  # errors, redirects: retried or handled elsewhere
        self.stats.inc_value(f"recrawl/{outcome}")
        if response.status == 304:
            self.stats.inc_value("recrawl/not_modified")
        visit = {"outcome": outcome, "url": url, "status": response.status, "hash": digest,
                 "etag": _header(response, b"ETag"),
                 "last_modified": _header(response, b"Last-Modified")}
        if outcome in ("new", "changed"):
            request.meta[VISIT_META] = visit
            return response
        # Unchanged or gone: nothing for the spider to parse, nothing to store
        # but the page record.
        meta = dict(request.meta)
        meta[VISIT_META] = visit
        meta["handle_httpstatus_all"] = True
        return response.replace(request=request.replace(callback=self.record, errback=None,
                                                        cb_kwargs={}, meta=meta))

    def record(self, response: Response):
        """Callback of unchanged and gone pages: the page record (and gone marks)."""
        request = response.request
        visit = request.meta[VISIT_META]
        record = page_record(self.crawler.spider, request, visit, self.policy, self.input_policy,
                             signer=self.signer)
        if record is None:
            return
        yield record
        if visit["outcome"] == "gone":
            for entry in _stored_items(request.meta.get(STATE_META)):
                if not self.item_collections.fullmatch(entry[0]):
                    # The record came back through Redis: it may only mark the
                    # spider's own items gone.
                    self.stats.inc_value("recrawl/gone_refused")
                    continue
                yield GoneMark(collection=entry[0], key_field=entry[1], key=entry[2])


def _header(response: Response, name: bytes) -> str | None:
    value = response.headers.get(name)
    if value is None:
        return None
    text = value.decode("latin-1")
    return text if 0 < len(text) <= 256 else None


def item_collections_pattern(pattern: str, spider: str, extra=()) -> re.Pattern:
    """The collection names the spider's items may be stored in: *pattern*
    (``MONGO_COLLECTION``) with ``%(item)s`` as any item class name, plus the
    names of ``RECRAWL_GONE_COLLECTIONS`` (item classes with a ``mongo_collection``
    of their own, ``%(spider)s`` expanded)."""
    marker = "\x00item\x00"
    names = [re.escape(pattern % {"spider": spider, "item": marker}).replace(
        re.escape(marker), "[a-z0-9_]+")]
    names += [re.escape(name % {"spider": spider, "item": ""}) for name in extra]
    return re.compile("|".join(f"(?:{n})" for n in names))


def _stored_items(raw: Any) -> list[list]:
    """The items of a page record carried by a revisit (untrusted: checked)."""
    items = raw.get("items") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        return []
    out = []
    for entry in items[:MAX_ITEMS_PER_PAGE]:
        if (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and entry[1] and not entry[1].startswith("$")
                and isinstance(entry[2], (str, int))):
            out.append(entry)
    return out


def page_record(spider, request: Request, visit: dict, policy: RecrawlPolicy,
                input_policy: InputPolicy, items: list[list] | None = None,
                signer: Signer | None = None) -> PageVisit | None:
    """The :class:`PageVisit` of *request*'s visit, or None when the page is
    not covered (any more) or cannot be fetched again from a record."""
    rule = policy.rule_for(visit["url"])
    if rule is None:
        return None
    payload = None
    if visit["outcome"] == "new" or request.meta.get("redirect_urls"):
        payload = stored_payload(spider, request, visit["url"], input_policy, signer)
    state = checked_state(request.meta.get(STATE_META))
    return visit_record(visit["url"], rule, state, visit["outcome"], status=visit["status"],
                        now=utc_now(), payload=payload, etag=visit["etag"],
                        last_modified=visit["last_modified"], body=visit["hash"], items=items,
                        sitemap_lastmod=lastmod_datetime(request.meta.get(LASTMOD_META)))


#: meta keys of one download (Scrapy's and this project's), not of the page.
DOWNLOAD_META = frozenset({STATE_META, VISIT_META, PAYLOAD_META, LASTMOD_META, "redirect_urls",
                           "redirect_times", "redirect_ttl", "redirect_reasons", "retry_times",
                           "depth", "handle_httpstatus_all", "download_timeout", "download_slot",
                           "download_latency", "crawlproject_callback_attempts"})
#: Headers downloader middlewares add on every download (identity, compression,
#: defaults, validators): a revisit gets them afresh.
DOWNLOAD_HEADERS = frozenset({b"if-none-match", b"if-modified-since", b"referer", b"cookie",
                              b"user-agent", b"accept", b"accept-language", b"accept-encoding"})


def stored_payload(spider, request: Request, url: str, input_policy: InputPolicy,
                   signer: Signer | None = None) -> str | None:
    """The request to fetch *url* again: the frontier's payload of it when the
    node leased it (``meta[PAYLOAD_META]``), else the request without what
    the download added (headers of downloader middlewares, download meta).
    Signed with *signer* (a node's record: it comes back whole), as the
    frontier's payloads are."""
    raw = request.meta.get(PAYLOAD_META)
    if raw is not None and url == request.url:
        try:
            # The node accepted this payload (proven, or under the seed policy):
            # it vouches for the revisit made of it.
            again = _without_state(unwrap(raw))
            return signer.sign(again) if signer is not None else again
        except (ValueError, TypeError, AttributeError):
            pass  # not a payload we can read: rebuild it below
    meta = {k: v for k, v in request.meta.items() if k not in DOWNLOAD_META}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in DOWNLOAD_HEADERS}
    callback = request.callback if getattr(request.callback, "__self__", None) is spider else None
    try:
        again = request.replace(url=url, meta=meta, headers=headers, callback=callback,
                                errback=None, dont_filter=True)
        return request_to_json(again, spider, input_policy, signer)
    except (RequestEncodeError, ValueError, TypeError) as exc:
        logger.warning("Page %s cannot be revisited (its request cannot be stored: %s)", url,
                       exc, extra={"spider": spider})
        return None


def _without_state(payload: bytes | str) -> str:
    """A frontier payload without the revisit state it may carry, as a revisit."""
    data = json.loads(payload)
    meta = data.get("meta")
    if isinstance(meta, dict):
        meta.pop(STATE_META, None)
        meta.pop(LASTMOD_META, None)   # the sitemap's word on one visit, not the page's request
        if not meta:
            data.pop("meta")
    data["dont_filter"] = True
    return json.dumps(data, separators=(",", ":"))


class RecrawlSpiderMiddleware:
    """Spider middleware: the page record after a new or changed page's output."""

    def __init__(self, crawler, policy: RecrawlPolicy, input_policy: InputPolicy,
                 collection: str, key: str, signer: Signer | None = None):
        self.crawler = crawler
        self.policy = policy
        self.input_policy = input_policy
        self.signer = signer
        self.collection_pattern = collection
        self.default_key = key

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        return cls(crawler, _enabled(crawler), InputPolicy.from_settings(s, crawler.spidercls),
                   mongo_collection_pattern(s), mongo_unique_key(s),
                   signer_from_settings(s, crawler.spidercls.name))

    async def process_spider_output(self, response: Response, result: AsyncIterator):
        visit = response.request.meta.get(VISIT_META) if response.request is not None else None
        track = visit is not None and visit["outcome"] in ("new", "changed")
        items: list[list] = []
        async for output in result:
            if track and not isinstance(output, (Request, PageVisit, GoneMark)) \
                    and ItemAdapter.is_item(output) and len(items) < MAX_ITEMS_PER_PAGE:
                entry = self._item_key(output)
                if entry is not None:
                    items.append(entry)
            yield output
        if track:
            record = page_record(self.crawler.spider, response.request, visit, self.policy,
                                 self.input_policy, items, self.signer)
            if record is not None:
                yield record

    def _item_key(self, item: Any) -> list | None:
        cls = type(item)
        key_field = getattr(cls, "mongo_key", None) or self.default_key
        key = ItemAdapter(item).get(key_field)
        if key is None or not isinstance(key, (str, int)):
            return None
        return [collection_name(self.collection_pattern, cls, self.crawler.spider.name),
                key_field, key]
