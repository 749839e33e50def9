"""Seed parsing: plain URLs, scrapy-redis JSON, malformed input."""

import json

import pytest

from crawlproject.seeds import InvalidSeed, parse_seed


def test_plain_url():
    seed = parse_seed(b"http://127.0.0.1:8000/list/1")
    assert seed.url == "http://127.0.0.1:8000/list/1"
    assert seed.method == "GET" and seed.dont_filter is True


def test_plain_url_is_stripped_and_made_safe():
    assert parse_seed("  http://127.0.0.1/a b?q=é \n".replace(" b", "%20b")).url == \
        "http://127.0.0.1/a%20b?q=%C3%A9"


def test_json_seed_all_fields():
    raw = json.dumps({
        "url": "http://127.0.0.1/x", "meta": {"job": "42"}, "method": "post",
        "headers": {"X-Token": "t"}, "priority": 5, "callback": "parse_product",
        "dont_filter": False, "page": "2",
    })
    seed = parse_seed(raw.encode())
    assert (seed.url, seed.method, seed.priority) == ("http://127.0.0.1/x", "POST", 5)
    assert seed.meta == {"job": "42"} and seed.headers == {"X-Token": "t"}
    assert seed.callback == "parse_product" and seed.dont_filter is False
    assert seed.formdata == {"page": "2"}  # scrapy-redis: extra keys are form data


@pytest.mark.parametrize("raw,code", [
    (b"", "empty"),
    (b"   ", "empty"),
    (b"not a url", "bad_url"),
    (b"ftp://127.0.0.1/file", "bad_url"),
    (b"http://", "bad_url"),
    (b'{"url": "http://127.0.0.1/", ', "bad_json"),
    (b'{"meta": {}}', "no_url"),
    (b'["http://127.0.0.1/"]', "bad_json"),
    (b'{"url": 5}', "bad_url"),
    (b'{"url": "http://127.0.0.1/", "meta": []}', "bad_field"),
    (b'{"url": "http://127.0.0.1/", "priority": "high"}', "bad_field"),
    (b'{"url": "http://127.0.0.1/", "callback": "os.system"}', "bad_field"),
    (b'{"url": "http://127.0.0.1/", "method": "EXPLODE"}', "bad_field"),
    (b"\xff\xfe\x00", "bad_encoding"),
    (b"http://127.0.0.1/" + b"a" * 70000, "too_large"),
])
def test_malformed_seeds_are_rejected_with_a_reason(raw, code):
    with pytest.raises(InvalidSeed) as info:
        parse_seed(raw)
    assert info.value.code == code
    assert str(info.value)


# -- untrusted seeds: nothing a seed holds may raise anything but InvalidSeed --

import string  # noqa: E402

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402
from scrapy import Request  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402

from crawlproject.seeds import request_from_seed  # noqa: E402
from crawlproject.spiders.products import ProductsSpider  # noqa: E402


@pytest.fixture(scope="module")
def spider():
    crawler = get_crawler(ProductsSpider, {"SEED_META_ALLOW": ["campaign"],
                                           "REDIS_URL": "redis://127.0.0.1:1/0"})
    return crawler._create_spider()


def build(spider, raw):
    return request_from_seed(raw, spider, spider.seed_policy, check=spider._check_storable)


@pytest.mark.parametrize("raw,code", [
    ('{"url": "http://127.0.0.1/", "headers": {"X-A": [1, {}]}}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "headers": {"X-A": 5}}', "bad_field"),
    ("http://[::1", "bad_url"),
    ('{"url": "http://[::1/x"}', "bad_url"),
    ('{"url": "http://127.0.0.1:99999999/"}', "bad_url"),
    ('{"url": "http://127.0.0.1/", "priority": 100000}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "priority": 1e400}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "dont_filter": "no"}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "page": {"a": 1}}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "body": "x", "page": "2"}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "callback": "__init__"}', "callback_not_allowed"),
    ('{"url": "http://127.0.0.1/", "callback": "_set_crawler"}', "callback_not_allowed"),
    ('{"url": "http://127.0.0.1/", "callback": "close"}', "callback_not_allowed"),
    ('{"url": "http://127.0.0.1/", "callback": "start"}', "callback_not_allowed"),
    ('{"url": "http://127.0.0.1/", "errback": "make_request_from_seed"}', "callback_not_allowed"),
    ('{"url": "http://127.0.0.1/", "callback": "no_such_method"}', "callback_not_allowed"),
    ('{"url": "http://127.0.0.1/", "meta": {"proxy": "http://evil:1"}}', "meta_not_allowed"),
    ('{"url": "http://127.0.0.1/", "meta": {"download_slot": "x"}}', "meta_not_allowed"),
    ('{"url": "http://127.0.0.1/", "meta": {"playwright": true, "playwright_context_kwargs":'
     ' {"record_har_path": "/tmp/x.har"}}}', "meta_not_allowed"),
    ('{"url": "http://127.0.0.1/", "cb_kwargs": {"x": {"__t__": "PageMethod"}}, '
     '"meta": {"campaign": {"__t__": "bytes", "b64": "!!"}}}', None),
    ('{"url": "http://127.0.0.1/", "method": "POST", "body": 5}', "bad_field"),
    ('{"url": "http://127.0.0.1/", "meta": {"campaign": 1e999}}', None),
])
def test_bad_seeds_are_rejected_with_a_reason_never_raised(spider, raw, code):
    try:
        request = build(spider, raw)
    except InvalidSeed as exc:
        assert code is None or exc.code == code, (exc.code, str(exc))
        assert str(exc)
    else:
        assert code is None, f"accepted: {request}"
        assert isinstance(request, Request)


def test_a_good_seed_becomes_its_request(spider):
    request = build(spider, json.dumps({
        "url": "http://127.0.0.1/p", "callback": "parse_product", "priority": 7,
        "meta": {"campaign": "x"}, "headers": {"Accept-Language": "da"}}))
    assert request.callback == spider.parse_product and request.priority == 7
    assert request.meta == {"campaign": "x"} and request.headers["Accept-Language"] == b"da"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(["url", "meta", "method", "body", "headers", "priority", "callback",
                         "errback", "dont_filter", "cb_kwargs", "page", "__t__"])
_url = st.one_of(
    st.just("http://127.0.0.1/x"), st.just("http://[::1"), st.just("https://[zz]/"),
    st.text(alphabet=string.printable, max_size=30).map(lambda t: "http://" + t),
    st.text(max_size=30),
)


@st.composite
def json_seeds(draw):
    seed = draw(st.dictionaries(_keys, _json, max_size=6))
    if draw(st.booleans()):
        seed["url"] = draw(_url)
    for key in ("meta", "headers", "cb_kwargs"):
        if draw(st.booleans()):
            seed[key] = draw(st.dictionaries(st.text(max_size=12), _json, max_size=3))
    if draw(st.booleans()):
        seed["callback"] = draw(st.sampled_from(
            ["parse", "parse_product", "__init__", "_set_crawler", "close", "closed", "start",
             "logger", "crawler", "from_crawler", "__class__", "x y"]))
    return json.dumps(seed)


@hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.one_of(json_seeds(), st.binary(max_size=60), st.text(max_size=60)))
def test_fuzz_any_seed_is_a_request_or_an_invalid_seed(spider, raw):
    try:
        request = build(spider, raw)
    except InvalidSeed as exc:
        assert exc.code and str(exc)
        return
    assert isinstance(request, Request)
    assert request.callback in (None, spider.parse, spider.parse_product)
    assert set(request.meta) <= {"campaign"}


@pytest.fixture(scope="module")
def lax_spider():
    """An operator who lets seeds set risky keys: their values are still checked."""
    crawler = get_crawler(ProductsSpider, {
        "SEED_META_ALLOW": ["campaign", "proxy", "download_timeout", "download_maxsize", "depth",
                            "cookiejar", "playwright"],
        "DOWNLOAD_TIMEOUT": 30, "DOWNLOAD_MAXSIZE": 1000, "REDIS_URL": "redis://127.0.0.1:1/0"})
    return crawler._create_spider()


_risky_meta = st.dictionaries(
    st.sampled_from(["campaign", "proxy", "download_timeout", "download_maxsize", "depth",
                     "cookiejar", "playwright", "playwright_include_page", "dont_obey_robotstxt"]),
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["http://127.0.0.9:1", "file:///etc/passwd"]), max_size=4)


@hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(url=st.sampled_from(["http://127.0.0.1/x", "file:///etc/passwd", "ftp://127.0.0.1/"]),
       meta=_risky_meta)
def test_fuzz_seed_meta_goes_through_the_stored_request_policy(lax_spider, url, meta):
    try:
        request = build(lax_spider, json.dumps({"url": url, "meta": meta}))
    except InvalidSeed as exc:
        assert exc.code and str(exc)
        return
    assert request.url.startswith("http://")
    assert set(request.meta) <= {"campaign", "download_timeout", "download_maxsize", "depth",
                                 "cookiejar", "playwright", "proxy"}
    assert request.meta.get("proxy") is None   # only "no proxy": none is in STORED_PROXY_ALLOW
    assert 0 < request.meta.get("download_timeout", 1) <= 30
    assert 0 < request.meta.get("download_maxsize", 1) <= 1000
    assert request.meta.get("depth", 0) >= 0


@pytest.mark.parametrize("idle, said", [(0, "idle close: never)"),
                                        (60, "idle close: after 60 s idle)"),
                                        (2.5, "idle close: after 2.5 s idle)")])
def test_the_seed_log_line_says_when_the_node_closes_idle(caplog, idle, said):
    """Issue 48: the node logged "idle close nevers". (No Redis call is made here:
    the client connects on its first command.)"""
    import logging

    crawler = get_crawler(ProductsSpider, {"MAX_IDLE_TIME_BEFORE_CLOSE": idle,
                                           "REDIS_URL": "redis://127.0.0.1:7150/0"})
    with caplog.at_level(logging.INFO, logger="crawlproject.spiders.seeded"):
        ProductsSpider.from_crawler(crawler)
    line = next(r.getMessage() for r in caplog.records if "Reading seeds" in r.getMessage())
    assert line.endswith(said), line
