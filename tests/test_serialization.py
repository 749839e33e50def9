"""JSON request codec: round trips, refusals, and hostile payloads."""

import json

import pytest
from scrapy import Request, Spider
from scrapy.http import FormRequest
from scrapy_playwright.page import PageMethod

from crawlproject import serialization
from crawlproject.serialization import (
    RequestDecodeError,
    RequestEncodeError,
    request_from_json,
    request_to_json,
)


class DemoSpider(Spider):
    name = "demo"

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
    back = request_from_json(request_to_json(request, spider), spider)
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
    back = request_from_json(request_to_json(request, spider), spider)
    assert type(back) is FormRequest and back.body == b"q=x"


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
    request = Request("http://127.0.0.1/", callback=spider.parse_item, meta={"k": "v"})
    data = serialization.dumps(request.to_dict(spider=spider))
    assert isinstance(data, str) and "pickle" not in data
    d = serialization.loads(data)
    assert d["meta"] == {"k": "v"} and d["callback"] == "parse_item"
