"""Revisit rules, page state, the recrawl middlewares on hand-made responses, and
the gone marks against a real MongoDB-wire server."""

from datetime import datetime, timedelta, timezone

import pytest

from crawlproject.signing import Signer
from hypothesis import given, settings, strategies as st
from scrapy import Request
from scrapy.http import HtmlResponse, Response
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from crawlproject.recrawl.middleware import (
    RecrawlMiddleware,
    RecrawlSpiderMiddleware,
    _stored_items,
    stored_payload,
)
from crawlproject.pipelines.documents import (
    WriteOp,
    from_spool_line,
    gone_op,
    gone_update,
    to_spool_line,
    upsert_update,
)
from crawlproject.policy import InputPolicy
from crawlproject.recrawl.schedule import (
    STATE_META,
    VISIT_META,
    GoneMark,
    PageState,
    PageVisit,
    RecrawlPolicy,
    RevisitRule,
    body_hash,
    checked_state,
    next_state,
)
from crawlproject.spiders.products import ProductsSpider

UTC = timezone.utc


# -- rules and state -------------------------------------------------------------
def test_rules_first_match_spider_rules_before_settings_catch_all_last():
    class Spider(ProductsSpider):
        recrawl_rules = [{"pattern": r"/list/", "interval": 60}]

    policy = RecrawlPolicy.from_settings(Settings({
        "RECRAWL_RULES": [{"pattern": r"/product/", "interval": 3600, "adaptive": True}],
        "RECRAWL_INTERVAL": 86400}), Spider)
    assert policy.rule_for("http://x/list/2").interval == 60
    assert policy.rule_for("http://x/product/1").adaptive is True
    assert policy.rule_for("http://x/about").interval == 86400
    assert not RecrawlPolicy.from_settings(Settings({}))          # nothing revisited


@pytest.mark.parametrize("raw, message", [
    ({"pattern": "("}, "interval"),
    ({"pattern": "(", "interval": 5}, "missing"),
    ({"pattern": "x", "interval": 0}, "interval must be > 0"),
    ({"pattern": "x", "interval": 5, "speed": 1}, "unknown keys"),
    ({"pattern": "x", "interval": 5, "min_interval": 10}, "min_interval"),
    ({"pattern": "x", "interval": 5, "factor": 1}, "factor"),
    ("x", "a dict"),
])
def test_bad_rules_are_refused_with_a_reason(raw, message):
    with pytest.raises(Exception, match=message):
        RevisitRule.parse(raw)


def test_adaptive_interval_shrinks_when_changed_grows_when_not_within_bounds():
    rule = RevisitRule(pattern="", interval=8, adaptive=True, min_interval=2, max_interval=32)
    state = None
    seen = []
    for outcome in ("new", "changed", "changed", "changed", "unchanged", "unchanged",
                    "unchanged", "unchanged"):
        values = next_state(rule, state, outcome)
        seen.append(values["interval"])
        state = PageState(interval=values["interval"], checks=values["checks"],
                          changes=values["changes"])
    assert seen == [8, 4, 2, 2, 4, 8, 16, 32]
    assert state.checks == 8 and state.changes == 4
    # A fixed rule keeps its interval; a page gone waits the longest interval.
    fixed = RevisitRule(pattern="", interval=8)
    assert next_state(fixed, PageState(interval=2), "changed")["interval"] == 8
    assert next_state(rule, PageState(interval=4), "gone")["interval"] == 32


def test_state_from_a_payload_keeps_only_well_formed_values():
    state = checked_state({"etag": '"abc"', "last_modified": "Thu, 01 Jan 2026 00:00:00 GMT",
                           "body_hash": "a" * 40, "interval": 30, "checks": 3, "changes": 1})
    assert state.validators() == {b"If-None-Match": b'"abc"',
                                  b"If-Modified-Since": b"Thu, 01 Jan 2026 00:00:00 GMT"}
    hostile = checked_state({"etag": 'x"\r\nX-Injected: 1', "last_modified": "é" * 300,
                             "body_hash": "zz", "interval": -5, "checks": "9", "gone": 1})
    assert hostile == PageState()
    assert checked_state("not a dict") is None


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20))
def test_state_and_stored_items_never_raise_on_any_json(raw):
    for value in (raw, {"etag": raw, "interval": raw, "items": raw, "checks": raw}):
        state = checked_state(value)
        if state is not None:
            for header in state.validators().values():
                assert b"\r" not in header and b"\n" not in header
        for entry in _stored_items(value):
            assert isinstance(entry[1], str) and not entry[1].startswith("$")


# -- the middlewares ---------------------------------------------------------------
def _crawler(**extra):
    settings = {"RECRAWL_ENABLED": True, "RECRAWL_INTERVAL": 60, **extra}
    crawler = get_crawler(ProductsSpider, settings)
    crawler.spider = ProductsSpider(name="products")
    crawler.spider.crawler = crawler
    return crawler


def _revisit(url="http://127.0.0.1/product/3", **state):
    spider_cb = ProductsSpider(name="products").parse_product
    return Request(url, callback=spider_cb, meta={STATE_META: state}, dont_filter=True)


def test_off_by_default_and_without_rules():
    from scrapy.exceptions import NotConfigured

    with pytest.raises(NotConfigured):
        RecrawlMiddleware.from_crawler(get_crawler(ProductsSpider, {}))
    with pytest.raises(NotConfigured, match="no revisit rule"):
        RecrawlMiddleware.from_crawler(get_crawler(ProductsSpider, {"RECRAWL_ENABLED": True}))


def test_revisit_is_conditional_and_304_skips_the_callback():
    crawler = _crawler()
    mw = RecrawlMiddleware.from_crawler(crawler)
    request = _revisit(etag='"v1"', last_modified="Thu, 01 Jan 2026 00:00:00 GMT",
                       body_hash="b" * 40, interval=60, checks=1, changes=1)
    request = request.replace(cb_kwargs={"page": 2})   # the spider's, not the record's
    mw.process_request(request)
    assert request.headers[b"If-None-Match"] == b'"v1"'
    assert request.headers[b"If-Modified-Since"] == b"Thu, 01 Jan 2026 00:00:00 GMT"
    out = mw.process_response(request, Response(request.url, status=304, request=request))
    assert out.request.callback == mw.record and out.request.errback is None
    assert out.request.meta["handle_httpstatus_all"] is True
    records = list(out.request.callback(out, **out.request.cb_kwargs))
    assert len(records) == 1 and isinstance(records[0], PageVisit)
    record = records[0]
    assert record["outcome"] == "unchanged" and record["checks"] == 2 and record["changes"] == 1
    assert record["etag"] == '"v1"' and "last_changed" not in record  # kept from the record
    assert crawler.stats.get_value("recrawl/not_modified") == 1
    # The request itself was not changed: the engine still tracks it.
    assert request.callback.__name__ == "parse_product"


def test_same_body_without_validators_is_unchanged_a_new_body_changed():
    crawler = _crawler()
    mw = RecrawlMiddleware.from_crawler(crawler)
    body = b"<html><body>same</body></html>"
    request = _revisit(body_hash=body_hash(body), interval=60)
    out = mw.process_response(request, HtmlResponse(request.url, body=body, request=request))
    assert out.request.callback == mw.record
    request = _revisit(body_hash=body_hash(body), interval=60)
    out = mw.process_response(request, HtmlResponse(request.url, body=b"<p>new</p>",
                                                    request=request))
    assert out.request is request and request.meta[VISIT_META]["outcome"] == "changed"


def test_first_visit_is_new_and_uncovered_pages_are_left_alone():
    crawler = _crawler(RECRAWL_INTERVAL=0, RECRAWL_RULES=[{"pattern": "/product/",
                                                           "interval": 60}])
    mw = RecrawlMiddleware.from_crawler(crawler)
    request = Request("http://127.0.0.1/product/1")
    mw.process_response(request, HtmlResponse(request.url, body=b"x", request=request))
    assert request.meta[VISIT_META]["outcome"] == "new"
    listing = Request("http://127.0.0.1/list/2")
    assert mw.process_response(listing, HtmlResponse(listing.url, body=b"x")) is not None
    assert VISIT_META not in listing.meta
    # A 404 on a first visit is not "gone": nothing was known of the page.
    dead = Request("http://127.0.0.1/product/999999")
    mw.process_response(dead, Response(dead.url, status=404))
    assert VISIT_META not in dead.meta


def test_gone_page_marks_its_items_and_hostile_item_lists_are_filtered():
    crawler = _crawler()
    mw = RecrawlMiddleware.from_crawler(crawler)
    request = _revisit(interval=60, items=[["products", "url", "http://127.0.0.1/product/3"],
                                          ["products", "$where", "x"], "junk",
                                          ["products", "url", {"$gt": ""}],
                                          ["accounts", "url", "x"], ["products_pages", "url", "y"],
                                          ["productsx", "url", "z"]])
    out = mw.process_response(request, Response(request.url, status=410, request=request))
    records = list(mw.record(out))
    assert records[0]["outcome"] == "gone" and records[0]["gone_at"] is not None
    # Only the spider's item collection: the list came back through Redis.
    assert [dict(r) for r in records[1:]] == [
        {"collection": "products", "key_field": "url", "key": "http://127.0.0.1/product/3"}]
    assert crawler.stats.get_value("recrawl/gone_refused") == 3


def test_gone_collections_follow_mongo_collection_and_the_allow_list():
    from crawlproject.recrawl.middleware import item_collections_pattern

    per_item = item_collections_pattern("%(spider)s_%(item)s", "shop", ["catalog_%(spider)s"])
    assert per_item.fullmatch("shop_productitem") and per_item.fullmatch("catalog_shop")
    assert not per_item.fullmatch("shop_") and not per_item.fullmatch("other_productitem")
    assert not item_collections_pattern("%(spider)s", "a.b", []).fullmatch("aXb")


def test_spider_middleware_adds_the_record_after_the_output_with_item_keys():
    crawler = _crawler()
    smw = RecrawlSpiderMiddleware.from_crawler(crawler)
    mw = RecrawlMiddleware.from_crawler(crawler)
    request = Request("http://127.0.0.1/product/3", callback=crawler.spider.parse_product)
    response = HtmlResponse(request.url, body=b"<h1>x</h1>", request=request)
    mw.process_response(request, response)

    async def output():
        yield {"url": "http://127.0.0.1/product/3", "title": "x"}
        yield Request("http://127.0.0.1/product/4")

    async def collect():
        return [o async for o in smw.process_spider_output(response, output())]

    import asyncio

    out = asyncio.run(collect())
    assert isinstance(out[-1], PageVisit) and len(out) == 3
    assert out[-1]["outcome"] == "new"
    assert out[-1]["items"] == [["products", "url", "http://127.0.0.1/product/3"]]
    assert '"callback":"parse_product"' in out[-1]["request"]


def test_stored_payload_drops_what_the_download_added():
    spider = ProductsSpider(name="products")
    request = Request("http://127.0.0.1/product/3", callback=spider.parse_product,
                      headers={"User-Agent": "pinned-by-identity", "X-Keep": "1"},
                      meta={"download_slot": "x", "depth": 2, "campaign": "spring",
                            STATE_META: {"etag": '"v"'}})
    # A node's record is signed: the spider's own header and meta come back whole.
    signer = Signer([b"k" * 16], "products")
    payload = stored_payload(spider, request, request.url, InputPolicy(), signer)
    data, proven = signer.open(payload)
    assert proven and "pinned-by-identity" not in data and "X-Keep" in data
    assert '"campaign":"spring"' in data and "download_slot" not in data
    assert STATE_META not in data and '"dont_filter":true' in data
    # Without a secret, the seed policy: "campaign" published (as this
    # project's SEED_META_ALLOW does), the custom header not.
    policy = InputPolicy(spidercls=ProductsSpider, stored_meta_allow=frozenset({"campaign"}))
    assert stored_payload(spider, request, request.url, policy) is None
    del request.headers["X-Keep"]
    assert '"campaign":"spring"' in stored_payload(spider, request, request.url, policy)
    # The frontier's own payload wins when the node leased the request (signed again).
    request.meta["_crawlproject_payload"] = signer.sign(
        '{"url":"http://127.0.0.1/product/3","meta":{"recrawl":{"etag":"x"},"a":1}}')
    assert signer.open(stored_payload(spider, request, request.url, policy, signer)) == (
        '{"url":"http://127.0.0.1/product/3","meta":{"a":1},"dont_filter":true}', True)


# -- gone marks in MongoDB -----------------------------------------------------------
def test_gone_marks_and_later_stores_in_any_order(mongo_db):
    coll = mongo_db["products"]
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    item = WriteOp.build("db", "products", "url", {"url": "u", "title": "a"}, seen=t0)
    coll.update_one(item.filter, upsert_update(item), upsert=True)
    mark = gone_op("db", {"collection": "products", "key_field": "url", "key": "u"})
    mark.seen = t0 + timedelta(hours=1)
    coll.update_one(mark.filter, gone_update(mark), upsert=False)
    doc = coll.find_one({"_id": "u"})
    assert doc["gone_at"] == mark.seen.replace(tzinfo=None) and doc["title"] == "a"
    # An older store (a spool replayed late) does not clear the mark...
    older = WriteOp.build("db", "products", "url", {"url": "u", "title": "a"},
                          seen=t0 + timedelta(minutes=30))
    coll.update_one(older.filter, upsert_update(older), upsert=True)
    assert coll.find_one({"_id": "u"}).get("gone_at") is not None
    # ... a later one does, even with the same content (the page came back).
    later = WriteOp.build("db", "products", "url", {"url": "u", "title": "a"},
                          seen=t0 + timedelta(hours=2))
    coll.update_one(later.filter, upsert_update(later), upsert=True)
    doc = coll.find_one({"_id": "u"})
    assert "gone_at" not in doc and doc["first_seen"] == t0.replace(tzinfo=None)
    # A mark older than the last store is ignored; a mark never inserts.
    coll.update_one(mark.filter, gone_update(mark), upsert=False)
    assert "gone_at" not in coll.find_one({"_id": "u"})
    missing = gone_op("db", {"collection": "products", "key_field": "url", "key": "nope"})
    coll.update_one(missing.filter, gone_update(missing), upsert=False)
    assert coll.count_documents({}) == 1


def test_gone_marks_refuse_system_collections_and_round_trip_the_spool():
    for bad in ({"collection": "system.users", "key_field": "url", "key": "u"},
                {"collection": "products", "key_field": "$where", "key": "u"},
                {"collection": 5, "key_field": "url", "key": "u"}):
        with pytest.raises(ValueError):
            gone_op("db", bad)
    with pytest.raises(KeyError):
        gone_op("db", {"collection": "products", "key_field": "url", "key": None})
    op = gone_op("db", {"collection": "products", "key_field": "url", "key": "u"})
    assert from_spool_line(to_spool_line(op)).kind == "gone"
    line = to_spool_line(op).replace('"w":"gone"', '"w":"drop"')
    with pytest.raises(ValueError):
        from_spool_line(line)


def test_gone_mark_item_is_what_the_pipeline_turns_into_a_gone_op():
    mark = GoneMark(collection="products", key_field="url", key="u")
    assert GoneMark.mongo_write == "gone"
    assert gone_op("db", mark).filter == {"_id": "u"}


def test_feeder_holds_an_idle_close_until_it_looked_and_while_pages_are_due():
    from scrapy.exceptions import DontCloseSpider

    from crawlproject.recrawl.extension import RecrawlFeeder

    crawler = _crawler()
    feeder = RecrawlFeeder.from_crawler(crawler)

    class Engine:
        scheduler = type("S", (), {"control_state": "run"})()

    crawler.engine = Engine()
    with pytest.raises(DontCloseSpider):
        feeder.spider_idle()                 # never looked for due pages yet
    feeder._looked, feeder._due_left = True, 3
    with pytest.raises(DontCloseSpider):
        feeder.spider_idle()                 # due pages left after the last cycle
    Engine.scheduler.control_state = "drain"
    feeder.spider_idle()                     # the operator drains: no hold
    Engine.scheduler.control_state = "run"
    feeder._due_left = 0
    feeder.spider_idle()                     # nothing due: the node may close


def test_unchanged_visits_touch_the_record_and_an_older_touch_changes_nothing(mongo_db):
    from crawlproject.pipelines.documents import insert_document, touch_update
    from crawlproject.recrawl.schedule import PageCheck, visit_record

    coll = mongo_db["shop_pages"]
    rule = RevisitRule(pattern="", interval=60)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    new = visit_record("u", rule, None, "new", status=200, now=t0, payload='{"url":"u"}',
                       etag='"a"', last_modified=None, body="c" * 40, items=[])
    assert type(new) is PageVisit
    coll.insert_one(insert_document(WriteOp.build("db", "shop_pages", "url", dict(new), seen=t0)))
    later = t0 + timedelta(minutes=1)
    check = visit_record("u", rule, checked_state({"etag": '"a"', "interval": 60, "checks": 1}),
                         "unchanged", status=304, now=later, payload=None, etag=None,
                         last_modified=None, body=None)
    assert type(check) is PageCheck and check.mongo_write == "touch" and "request" not in check
    op = WriteOp.build("db", "shop_pages", "url", dict(check), seen=later, kind="touch")
    coll.update_one(*touch_update(op), upsert=False)
    doc = coll.find_one({"_id": "u"})
    assert doc["checks"] == 2 and doc["request"] == '{"url":"u"}' and doc["etag"] == '"a"'
    assert doc["first_seen"] == t0.replace(tzinfo=None)
    stale = WriteOp.build("db", "shop_pages", "url", {**dict(check), "checks": 99}, seen=t0,
                          kind="touch")
    assert coll.update_one(*touch_update(stale), upsert=False).modified_count == 0
    assert coll.find_one({"_id": "u"})["checks"] == 2
    assert from_spool_line(to_spool_line(op)).kind == "touch"


# -- page records from MongoDB: the stored-request policy, and their own site ------------
import json  # noqa: E402

from crawlproject.recrawl.extension import record_request  # noqa: E402
from crawlproject.serialization import RequestDecodeError  # noqa: E402

RECORD_URL = "http://127.0.0.1:8000/product/1"


@pytest.mark.parametrize("request_, code", [
    ({"url": "file:///etc/passwd", "callback": "parse_product"}, "scheme_not_allowed"),
    ({"url": "http://127.0.0.2:8000/product/1"}, "other_site"),
    ({"url": "https://127.0.0.1:8000/product/1"}, "other_site"),
    ({"url": "http://127.0.0.1:8001/product/1"}, "other_site"),
    ({"url": RECORD_URL, "meta": {"proxy": "http://127.0.0.9:1"}}, "proxy_not_allowed"),
    ({"url": RECORD_URL, "meta": {"dont_obey_robotstxt": True}}, "meta_not_allowed"),
    ({"url": RECORD_URL, "meta": {"playwright_include_page": True}}, "meta_not_allowed"),
    ({"url": RECORD_URL, "callback": "_set_crawler"}, "callback_not_allowed"),
])
def test_a_page_records_request_is_refused_with_a_reason(request_, code):
    spider = ProductsSpider(name="products")
    with pytest.raises(RequestDecodeError) as info:
        record_request(RECORD_URL, json.dumps(request_), spider,
                       InputPolicy.from_settings(Settings(), ProductsSpider))
    assert info.value.code == code


def test_a_page_records_own_request_is_rebuilt():
    spider = ProductsSpider(name="products")
    request = record_request(RECORD_URL, json.dumps({
        "url": RECORD_URL + "?x=1", "callback": "parse_product", "meta": {"depth": 2},
        "dont_filter": True}), spider, InputPolicy.from_settings(Settings(), ProductsSpider))
    assert request.callback == spider.parse_product and request.meta == {"depth": 2}


_record_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
    | st.sampled_from(["file:///etc/passwd", RECORD_URL, "http://127.0.0.2/", "proxy",
                       "parse_product", "http://127.0.0.9:1"]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["url", "meta", "callback", "proxy", "download_timeout",
                                       "playwright_include_page", "depth", "headers", "x"]),
                      children, max_size=4),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(url=st.sampled_from([RECORD_URL, "file:///etc/passwd", "http://127.0.0.2/"]),
       payload=st.one_of(_record_json.map(json.dumps), st.text(max_size=30)))
def test_fuzz_page_records_give_an_allowed_request_or_a_clean_reject(url, payload):
    spider = ProductsSpider(name="products")
    try:
        request = record_request(url, payload, spider,
                                 InputPolicy.from_settings(Settings(), ProductsSpider))
    except RequestDecodeError as exc:
        assert exc.code and str(exc)
        return
    # Only an http(s) record, and the request of its own origin (a record of
    # another page of another host, with a payload of that host, is valid).
    from urllib.parse import urlsplit
    assert url != "file:///etc/passwd"
    assert urlsplit(request.url)[:2] == urlsplit(url)[:2]
    assert request.meta.get("proxy") is None and "playwright_include_page" not in request.meta
    assert request.meta.get("download_timeout", 1) <= 180
