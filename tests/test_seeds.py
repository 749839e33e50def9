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
