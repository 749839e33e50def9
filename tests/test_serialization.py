"""JSON request codec: round trips, refusals, and hostile payloads.

One trust rule: what a node of the crawl stored (signed with the crawl's
secret) comes back whole; anything else gets the seed policy."""

import json

import pytest
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.spiders import CrawlSpider, Rule
from scrapy.linkextractors import LinkExtractor
from scrapy_playwright.page import PageMethod

from crawlproject import serialization
from crawlproject.serialization import (
    RequestDecodeError,
    RequestEncodeError,
    load_request,
    request_from_json,
    request_to_json,
)
from crawlproject.signing import Signer

SIGNER = Signer([b"s" * 32], "demo")


class DemoSpider(Spider):
    name = "demo"
    # Its own data in meta, published for stored requests (crawlproject.policy).
    stored_meta_allow = ("tags", "raw", "nested", "x", "ok", "a")

    def parse_item(self, response):
        pass

    def on_error(self, failure):
        pass


@pytest.fixture
def spider():
    return DemoSpider()


def test_round_trip_keeps_everything(spider):
    request = Request(
        "http://127.0.0.1/p?a=1", method="POST", body=b"\x00\xffbinary",
        headers={"X-A": "1"}, cookies={"c": "v"}, priority=7, dont_filter=True,
        callback=spider.parse_item, errback=spider.on_error, cb_kwargs={"n": 1},
        meta={"depth": 2, "tags": ("a", "b"), "raw": b"\x01", "nested": {"__t__": "x"},
              "playwright": True,
              "playwright_page_methods": [PageMethod("wait_for_selector", "#app", timeout=5000)]},
    )
    back, proven = load_request(request_to_json(request, spider, signer=SIGNER), spider,
                                signer=SIGNER)
    assert proven
    assert (back.url, back.method, back.body, back.priority) == (request.url, "POST", b"\x00\xffbinary", 7)
    assert back.headers[b"X-A"] == b"1" and back.dont_filter and back.cookies == {"c": "v"}
    assert back.callback == spider.parse_item and back.errback == spider.on_error
    assert back.cb_kwargs == {"n": 1}
    assert back.meta["tags"] == ["a", "b"] and back.meta["raw"] == b"\x01"
    assert back.meta["nested"] == {"__t__": "x"}
    method = back.meta["playwright_page_methods"][0]
    assert isinstance(method, PageMethod)
    assert (method.method, method.args, method.kwargs) == ("wait_for_selector", ("#app",), {"timeout": 5000})


def test_form_request_class_survives(spider):
    request = FormRequest("http://127.0.0.1/f", formdata={"q": "x"})
    back = request_from_json(request_to_json(request, spider, signer=SIGNER), spider,
                             signer=SIGNER)
    assert type(back) is FormRequest and back.body == b"q=x"
    with pytest.raises(RequestEncodeError, match="method 'POST' is not allowed"):
        request_to_json(request, spider)   # no secret: what anyone may store, no POST


# -- what a node of the crawl stored: whole ----------------------------------------

class Mixin:
    def _from_mixin(self, response):
        pass


class PrivateSpider(Mixin, DemoSpider):
    name = "demo"

    def _parse_private(self, response, n):
        pass

    def _failed(self, failure):
        pass


class MyRequest(Request):
    pass


class Kinds(CrawlSpider):
    name = "demo"
    rules = (Rule(LinkExtractor(), callback="parse_page"),)

    def parse_page(self, response):
        pass


def test_a_nodes_own_request_round_trips_whole():
    """Private and mixin callbacks and errbacks, a CrawlSpider rule's request,
    bodies, methods, headers, cookies and meta the spider set without
    publishing anything: a node wrote them, they come back as they were."""
    spider = PrivateSpider()
    requests = [
        Request("http://127.0.0.1/a", callback=spider._parse_private, errback=spider._failed,
                cb_kwargs={"n": 3}, meta={"anything": {"the": ["spider", "set"]}},
                headers={"Authorization": "Bearer t", "X-Custom": "1"}, cookies={"sid": "1"}),
        Request("http://127.0.0.1/b", callback=spider._from_mixin, method="DELETE"),
        JsonRequest("http://127.0.0.1/c", data={"q": [1, 2]}, callback=spider.parse_item),
        MyRequest("http://127.0.0.1/d", method="PUT", body=b"raw"),
        Request("http://127.0.0.1/w", dont_filter=True,   # a cookie wall's hop: list form
                cookies=[{"name": "consent", "value": "1", "path": "/"}]),
        Request("http://127.0.0.1/e", meta={"playwright": True, "playwright_page_methods": [
            PageMethod("evaluate", "1 + 1"), PageMethod("screenshot", full_page=True)]}),
    ]
    for request in requests:
        back, proven = load_request(request_to_json(request, spider, signer=SIGNER), spider,
                                    signer=SIGNER)
        assert proven and type(back) is type(request)
        assert (back.url, back.method, back.body) == (request.url, request.method, request.body)
        assert back.callback == request.callback and back.errback == request.errback
        assert back.cb_kwargs == request.cb_kwargs and back.cookies == request.cookies
        assert dict(back.headers) == dict(request.headers)
        want = {k: v for k, v in request.meta.items() if k != "playwright_page_methods"}
        assert {k: v for k, v in back.meta.items() if k != "playwright_page_methods"} == want
    methods = back.meta["playwright_page_methods"]
    assert [(m.method, m.args, m.kwargs) for m in methods] == [
        ("evaluate", ("1 + 1",), {}), ("screenshot", (), {"full_page": True})]
    crawl = Kinds()
    rule_request = Request("http://127.0.0.1/p", callback=crawl._callback,
                           errback=crawl._errback, meta={"rule": 0, "link_text": "P"})
    back = request_from_json(request_to_json(rule_request, crawl, signer=SIGNER), crawl,
                             signer=SIGNER)
    assert back.callback == crawl._callback and back.meta == {"rule": 0, "link_text": "P"}


def test_proof_is_checked_not_the_form():
    """An altered payload, one signed for another spider or with another
    secret, and an unsigned one: not proven, so the seed policy applies
    (a private callback is refused)."""
    spider = PrivateSpider()
    data = request_to_json(Request("http://127.0.0.1/a", callback=spider._parse_private,
                                   cb_kwargs={"n": 1}), spider, signer=SIGNER)
    assert load_request(data, spider, signer=SIGNER)[1]
    forged = [
        data.replace("127.0.0.1/a", "127.0.0.1/b"),            # altered after signing
        Signer([b"s" * 32], "other").sign(data.split(":", 1)[1]),  # another spider
        Signer([b"t" * 32], "demo").sign(data.split(":", 1)[1]),   # another secret
        data.split(":", 1)[1],                                  # the JSON alone
        data[:3] + ("A" if data[3] != "A" else "B") + data[4:],  # one MAC character
    ]
    for value in forged:
        with pytest.raises(RequestDecodeError) as info:
            load_request(value, spider, signer=SIGNER)
        assert info.value.code == "callback_not_allowed"
    rotated = Signer([b"n" * 32, b"s" * 32], "demo")      # a new first secret, the old kept
    assert load_request(data, spider, signer=rotated)[1]


@pytest.mark.parametrize("fields, code", [
    ({"method": "POST"}, "method_not_allowed"),
    ({"method": "DELETE"}, "method_not_allowed"),
    ({"body": "eA=="}, "body_not_allowed"),
    ({"headers": {"Authorization": ["Basic eDp5"]}}, "header_not_allowed"),
    ({"headers": {"proxy-authorization": ["Basic eDp5"]}}, "header_not_allowed"),
    ({"headers": {"Cookie": ["sid=1"]}}, "header_not_allowed"),
    ({"headers": {"Host": ["internal.example"]}}, "header_not_allowed"),
    ({"headers": {"X-Forwarded-For": ["127.0.0.1"]}}, "header_not_allowed"),
    ({"cookies": {"sid": "1"}}, "header_not_allowed"),
    ({"callback": "_parse_private"}, "callback_not_allowed"),
    ({"_class": "tests.test_serialization.MyRequest"}, "class_not_allowed"),
])
def test_what_anyone_else_wrote_gets_the_seed_policy(fields, code):
    spider = PrivateSpider()
    with pytest.raises(RequestDecodeError) as info:
        load_request(payload(**fields), spider, signer=SIGNER)
    assert info.value.code == code
    back, proven = load_request(payload(headers={"Accept-Language": ["da"]}), spider,
                                signer=SIGNER)
    assert not proven and back.headers[b"Accept-Language"] == b"da"


def test_the_seed_policy_publishes_methods_and_headers():
    from scrapy.settings import Settings

    class Poster(DemoSpider):
        seed_methods_allow = ("POST",)

    policy = InputPolicy.from_settings(Settings({"SEED_HEADERS_ALLOW": ["X-Api-Version",
                                                                        "Cookie"]}), Poster)
    back = request_from_json(payload(method="POST", body="eA==",
                                     headers={"X-Api-Version": ["2"]}), Poster(), policy)
    assert back.method == "POST" and back.body == b"x"
    with pytest.raises(RequestDecodeError):   # a credential stays refused, listed or not
        request_from_json(payload(headers={"Cookie": ["a=1"]}), Poster(), policy)


def test_unserialisable_meta_is_refused_naming_the_key(spider):
    request = Request("http://127.0.0.1/", meta={"ok": 1, "session": object()})
    with pytest.raises(RequestEncodeError, match=r"meta\['session'\]"):
        request_to_json(request, spider)


def test_nested_unserialisable_value_is_named(spider):
    request = Request("http://127.0.0.1/", meta={"a": [1, {"b": {1, 2}}]})
    with pytest.raises(RequestEncodeError, match=r"meta\['a'\]\[1\]\['b'\]"):
        request_to_json(request, spider)


def test_callback_that_is_not_a_spider_method_is_refused(spider):
    request = Request("http://127.0.0.1/", callback=lambda r: None)
    with pytest.raises(RequestEncodeError):
        request_to_json(request, spider)


def test_transient_meta_is_dropped(spider):
    request = Request("http://127.0.0.1/", meta={"playwright_page": object(), "x": 1})
    back = request_from_json(request_to_json(request, spider), spider)
    assert "playwright_page" not in back.meta and back.meta["x"] == 1


def test_process_local_meta_read_from_redis_is_dropped(spider):
    """A stored payload never holds them: one that does was written by someone
    else, who must not pose as this node's lease, name an ack's parent (which
    would let that ack go before the request's own links are stored) or set
    Scrapy's proxy bookkeeping."""
    from crawlproject.serialization import TRANSIENT_META_KEYS

    meta = {key: "0:1@127.0.0.1" for key in TRANSIENT_META_KEYS
            if not key.startswith("playwright")}    # those are refused (above)
    payload = json.dumps({"url": "http://127.0.0.1/", "meta": {**meta, "x": 1}})
    back = request_from_json(payload, spider)
    assert back.meta == {"x": 1}
    assert "_crawlproject_parent" in TRANSIENT_META_KEYS


@pytest.mark.parametrize("payload", [
    b"\x80\x04\x95pickle",                                  # a pickle is never loaded
    b"not json",
    b"[1, 2]",
    json.dumps({"url": "http://127.0.0.1/", "_class": "os.system"}).encode(),
    json.dumps({"url": "http://127.0.0.1/", "callback": "__import__('os')"}).encode(),
    json.dumps({"url": "http://127.0.0.1/", "callback": "no_such_method"}).encode(),
    json.dumps({"url": "http://127.0.0.1/", "meta": {"__t__": "evil"}}).encode(),
    json.dumps({"url": "http://127.0.0.1/", "body": "!!!notbase64"}).encode(),
])
def test_invalid_payloads_raise_decode_error(spider, payload):
    with pytest.raises(RequestDecodeError):
        request_from_json(payload, spider)


def test_scrapy_redis_serializer_interface(spider):
    # Without a spider, only the meta keys every node may read back (no data of its own).
    request = Request("http://127.0.0.1/", callback=spider.parse_item, meta={"depth": 3})
    data = serialization.dumps(request.to_dict(spider=spider))
    assert isinstance(data, str) and "pickle" not in data
    d = serialization.loads(data)
    assert d["meta"] == {"depth": 3} and d["callback"] == "parse_item"


# -- payloads written to the frontier by someone else -------------------------

def payload(**fields):
    return json.dumps({"url": "http://127.0.0.1/x", **fields})


def page_method(method, *args, **kwargs):
    return {"__t__": "PageMethod", "method": method, "args": list(args), "kwargs": kwargs}


@pytest.mark.parametrize("fields", [
    {"callback": "__init__"},
    {"callback": "_set_crawler"},
    {"callback": "close"},
    {"callback": "closed"},
    {"callback": "start"},
    {"errback": "from_crawler"},
    {"callback": "log"},
    {"meta": {"playwright_page_methods": [page_method("screenshot", path="/tmp/pwned.png")]}},
    {"meta": {"playwright_page_methods": [page_method("goto", "file:///etc/passwd")]}},
    {"meta": {"playwright_page_methods": [page_method("set_input_files", "input", "/etc/passwd")]}},
    {"meta": {"playwright_page_methods": [page_method("evaluate", "fetch('http://x')")]}},
    {"meta": {"playwright_page_methods": [page_method("click", "#a", path="/tmp/x")]}},
    {"meta": {"playwright_page_methods": [page_method("click", {"nested": 1})]}},
    {"meta": {"playwright_context_kwargs": {"record_har_path": "/tmp/x.har"}}},
    {"meta": {"playwright_context_kwargs": {"record_video_dir": "/tmp"}}},
    {"meta": {"playwright_context_kwargs": {"storage_state": "/etc/passwd"}}},
    {"meta": {"playwright_page_event_handlers": {"dialog": "_set_crawler"}}},
    {"meta": {"playwright_page": {"fake": True}}},
    {"meta": {"x": {"__t__": "bytes", "b64": "not base64!"}}},
    {"meta": {"x": {"__t__": "PageMethod"}}},
    {"meta": [1]},
    {"encoding": "no-such-codec"},
    {"flags": 5},
    {"_class": "os.system"},
])
def test_hostile_payloads_are_refused_with_a_decode_error(spider, fields):
    with pytest.raises(RequestDecodeError) as info:
        request_from_json(payload(**fields), spider)
    assert str(info.value)


def test_allowed_page_methods_decode(spider):
    data = payload(meta={"playwright": True, "playwright_page_methods": [
        page_method("wait_for_selector", "#app", timeout=5000), page_method("click", "#more")]})
    methods = request_from_json(data, spider).meta["playwright_page_methods"]
    assert [m.method for m in methods] == ["wait_for_selector", "click"]


def test_a_spider_cannot_store_what_it_could_not_read_back(spider):
    """The same rules at enqueue: the spider author sees the refusal at once."""
    with pytest.raises(RequestEncodeError):
        request_to_json(Request("http://127.0.0.1/", meta={
            "playwright_page_methods": [PageMethod("screenshot", path="/tmp/x.png")]}), spider)

    class Private(DemoSpider):
        def _parse_private(self, response):
            pass

    private = Private()
    with pytest.raises(RequestEncodeError):
        request_to_json(Request("http://127.0.0.1/", callback=private._parse_private), private)


from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402

_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    | st.builds(lambda m, a: page_method(m, *a), st.sampled_from(
        ["wait_for_selector", "click", "screenshot", "goto", "evaluate"]),
        st.lists(st.text(max_size=8), max_size=2))
    | st.builds(lambda b: {"__t__": "bytes", "b64": b}, st.text(max_size=8))
    | st.just({"__t__": "weird"}),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)
_fields = st.fixed_dictionaries({}, optional={
    "url": st.one_of(st.just("http://127.0.0.1/"), st.text(max_size=20), st.integers()),
    "meta": _value, "cb_kwargs": _value, "headers": _value, "body": _value,
    "callback": st.sampled_from(["parse_item", "__init__", "close", "x", 5, None]),
    "method": _value, "priority": _value, "encoding": st.sampled_from(["utf-8", "zz", 5]),
    "flags": _value, "cookies": _value, "dont_filter": _value,
    "_class": st.sampled_from(["scrapy.http.request.Request", "os.system", 3]),
})


@hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(_fields.map(json.dumps), st.binary(max_size=40)))
def test_fuzz_payloads_decode_or_raise_a_decode_error(data):
    spider = DemoSpider()
    try:
        request = request_from_json(data, spider)
    except RequestDecodeError:
        return
    assert isinstance(request, Request)
    assert request.callback in (None, spider.parse_item)
    assert request.url.split(":", 1)[0].lower() in ("http", "https")
    assert all(isinstance(k, str) and (k in STORED_META or k in DemoSpider.stored_meta_allow
                                       or k in PLAYWRIGHT_META and k not in PUBLISHED_ONLY)
               for k in request.meta), request.meta


# -- one trust policy: what a payload's meta and URL may hold -----------------------------
from crawlproject.policy import STORED_META, InputPolicy, PLAYWRIGHT_META, PUBLISHED_ONLY  # noqa: E402
from scrapy.settings import Settings  # noqa: E402

NODE = InputPolicy.from_settings(Settings({"DOWNLOAD_TIMEOUT": 30, "DOWNLOAD_MAXSIZE": 1000}),
                                 DemoSpider)


@pytest.mark.parametrize("fields, code", [
    ({"meta": {"proxy": "http://127.0.0.1:9/"}}, "proxy_not_allowed"),
    ({"meta": {"proxy": "http://u:p@127.0.0.1:9/", "_auth_proxy": "x"}}, "proxy_not_allowed"),
    ({"meta": {"dont_obey_robotstxt": True}}, "meta_not_allowed"),
    ({"meta": {"playwright": True, "playwright_include_page": True}}, "meta_not_allowed"),
    ({"meta": {"playwright": True, "playwright_context": "held"}}, "meta_not_allowed"),
    ({"meta": {"bindaddress": ["127.0.0.1", 0]}}, "meta_not_allowed"),
    ({"meta": {"download_timeout": "1e9"}}, "meta_value_not_allowed"),
    ({"url": "file:///etc/passwd"}, "scheme_not_allowed"),
    ({"url": "FILE:///etc/passwd"}, "scheme_not_allowed"),
    ({"url": "ftp://127.0.0.1/x"}, "scheme_not_allowed"),
    ({"url": "data:text/html,<a href='file:///etc/passwd'>x</a>"}, "scheme_not_allowed"),
])
def test_payloads_carry_only_what_the_policy_allows(spider, fields, code):
    with pytest.raises(RequestDecodeError) as info:
        request_from_json(payload(**fields), spider, NODE)
    assert info.value.code == code


def test_payload_download_limits_are_capped_at_the_nodes_own(spider):
    back = request_from_json(payload(meta={"download_timeout": 1e9, "download_maxsize": 0}),
                             spider, NODE)
    assert back.meta == {"download_timeout": 30, "download_maxsize": 1000}


def test_a_proxy_chosen_for_one_download_is_never_stored_nor_honoured(spider):
    """The pool's choice (``proxy_id``) and Scrapy's from the environment
    (``_scheme_proxy``) travel with redirects and retries: dropped, so the next
    download chooses its own; any other stored proxy is refused."""
    for marker in ({"proxy_id": "127.0.0.9:1"}, {"_scheme_proxy": True}):
        request = Request("http://127.0.0.1/r", meta={"proxy": "http://u:p@127.0.0.9:1",
                                                       "depth": 1, **marker})
        data = request_to_json(request, spider, NODE)
        assert "127.0.0.9" not in data and json.loads(data)["meta"] == {"depth": 1}
        back = request_from_json(payload(meta={"proxy": "http://127.0.0.9:1", **marker}),
                                 spider, NODE)
        assert back.meta == {}
    with pytest.raises(RequestEncodeError, match="STORED_PROXY_ALLOW"):
        request_to_json(Request("http://127.0.0.1/", meta={"proxy": "http://127.0.0.9:1"}),
                        spider, NODE)
    allowed = InputPolicy.from_settings(
        Settings({"STORED_PROXY_ALLOW": ["http://127.0.0.9:1"]}), DemoSpider)
    request = Request("http://127.0.0.1/", meta={"proxy": "http://u:p@127.0.0.9:1"})
    back = request_from_json(request_to_json(request, spider, allowed), spider, allowed)
    assert back.meta == {"proxy": "http://127.0.0.9:1"}


def test_what_a_node_enqueues_itself_reads_back(spider):
    """Redirects, retries, depth, sessions, rendering, recrawl visits: the
    meta a node's own components put on the requests it stores."""
    meta = {"depth": 2, "retry_times": 1, "redirect_times": 1, "redirect_ttl": 19,
            "redirect_urls": ["http://127.0.0.1/a"], "redirect_reasons": [302],
            "download_slot": "127.0.0.1", "download_timeout": 30, "is_start_request": True,
            "cookiejar": "s", "session": "s", "session_cookies": {"sid": "1"},
            "dont_rotate_identity": True, "proxy_ban_tries": 1, "referrer_policy": "origin",
            "crawlproject_callback_attempts": 1, "recrawl": {"etag": '"v"', "checks": 2},
            "render": True, "render_wait_for": ".price", "playwright": True,
            "playwright_page_methods": [PageMethod("wait_for_selector", ".price")],
            "_crawlproject_lease": "0:1@n", "_crawlproject_identity": {"id": "i"},
            "_crawlproject_proxy_context": {"server": "http://p"}, "download_latency": 0.1}
    request = Request("https://127.0.0.1/p", meta=meta, callback=spider.parse_item)
    back = request_from_json(request_to_json(request, spider, NODE), spider, NODE)
    kept = {k: v for k, v in meta.items() if k in STORED_META}
    assert {k: v for k, v in back.meta.items() if k != "playwright_page_methods"} == kept
    assert back.meta["playwright_page_methods"][0].method == "wait_for_selector"


_KEYS = sorted({*STORED_META, *PLAYWRIGHT_META, "proxy", "proxy_id", "_scheme_proxy",
                "dont_obey_robotstxt", "bindaddress", "x", "tags", "_crawlproject_lease",
                "_crawlproject_original_meta", "dont_filter", "ftp_password"})
_meta_value = (st.none() | st.booleans() | st.integers(-10, 2**40)
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
               | st.sampled_from(["http://127.0.0.9:1", "no-referrer", "http://u:p@h:1/"])
               | st.lists(st.integers(0, 600) | st.text(max_size=5), max_size=3)
               | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
_stored_fields = st.fixed_dictionaries({
    "url": st.sampled_from(["http://127.0.0.1/", "https://127.0.0.1/a", "file:///etc/passwd",
                            "ftp://127.0.0.1/", "data:,x", "HTTP://127.0.0.1/", "http:///x",
                            "javascript:x", "gopher://127.0.0.1:6379/_FLUSHALL"]),
    "meta": st.dictionaries(st.sampled_from(_KEYS), _meta_value, max_size=6),
}, optional={"callback": st.sampled_from(["parse_item", "__init__", "close", None])})


@hsettings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=_stored_fields)
def test_fuzz_payloads_give_an_allowed_request_or_a_clean_reject(fields):
    """Arbitrary meta keys and values from Redis: a request with only allowed
    keys, checked values, limits within the node's, an http(s) URL; or a
    RequestDecodeError with a code — nothing else."""
    spider = DemoSpider()
    try:
        request = request_from_json(json.dumps(fields), spider, NODE)
    except RequestDecodeError as exc:
        assert exc.code and str(exc)
        return
    assert request.url.split(":", 1)[0].lower() in ("http", "https")
    for key, value in request.meta.items():
        assert key in STORED_META or key in DemoSpider.stored_meta_allow or (
            key in PLAYWRIGHT_META and key not in PUBLISHED_ONLY) or (
            key == "proxy" and value is None), key   # None: "no proxy", allowed
    assert request.meta.get("proxy") is None and "dont_obey_robotstxt" not in request.meta
    assert 0 < request.meta.get("download_timeout", 1) <= 30
    assert 0 < request.meta.get("download_maxsize", 1) <= 1000
    assert request.meta.get("depth", 0) >= 0


@hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=_fields.map(json.dumps), signed=st.booleans())
def test_fuzz_signed_and_unsigned_payloads(data, signed):
    """Whatever a payload holds, signed by a node or not: a request whose
    callbacks are methods of the spider (published ones when unproven), or a
    RequestDecodeError; never another exception. A signed one is proven."""
    spider = PrivateSpider()
    value = SIGNER.sign(data) if signed else data
    try:
        request, proven = load_request(value, spider, signer=SIGNER)
    except RequestDecodeError as exc:
        assert str(exc)
        return
    assert proven is signed
    for func in (request.callback, request.errback):
        assert func is None or getattr(func, "__self__", None) is spider
    if not proven:
        assert request.method in ("GET", "HEAD") and not request.body and not request.cookies
        assert request.url.split(":", 1)[0].lower() in ("http", "https")
