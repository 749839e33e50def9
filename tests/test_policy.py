"""The input policy: which callbacks, seed meta and browser actions data from
Redis may ask for (no Redis needed: pure rules)."""

import pytest
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider

from crawlproject.policy import DEFAULT_PAGE_METHODS, InputPolicy, Refused, published_callbacks
from crawlproject.spiders.products import ProductsSpider
from crawlproject.spiders.seeded import RedisSpider


class Base(RedisSpider):
    name = "base"

    def parse(self, response):
        pass

    def parse_detail(self, response):
        pass

    def _private(self, response):
        pass

    def closed(self, reason):
        pass

    def start_requests(self):
        return []

    @staticmethod
    def helper(x):
        return x


class Child(Base):
    name = "child"
    parse_detail = None  # replaced by something that is not a method

    async def parse_async(self, response):
        pass


class Explicit(Base):
    name = "explicit"
    allowed_callbacks = ("parse", "_private")


def test_published_callbacks_are_public_methods_of_the_spiders_own_classes():
    assert published_callbacks(Base) == {"parse", "parse_detail"}
    assert published_callbacks(Child) == {"parse", "parse_async"}
    assert published_callbacks(ProductsSpider) == {"parse", "parse_product"}


@pytest.mark.parametrize("name", [
    "__init__", "_set_crawler", "close", "closed", "start", "start_requests", "from_crawler",
    "make_request_from_seed", "log", "update_settings", "_private", "helper", "logger",
    "settings", "crawler", "parse_detail_missing", "os.system", "__class__", "", "a" * 200,
])
def test_everything_else_is_refused(name):
    with pytest.raises(Refused) as info:
        InputPolicy(Base).check_callback(name)
    assert info.value.code == "callback_not_allowed"


def test_a_spider_without_its_own_parse_publishes_nothing():
    class Bare(RedisSpider):
        name = "bare"

    assert published_callbacks(Bare) == frozenset()
    assert published_callbacks(Spider) == frozenset()


def test_framework_spiders_methods_are_not_callbacks():
    class Crawl(CrawlSpider):
        name = "crawl"

        def parse_item(self, response):
            pass

    assert published_callbacks(Crawl) == {"parse_item"}   # not _parse, parse_start_url...


def test_explicit_allow_list_is_exact():
    policy = InputPolicy(Explicit)
    assert policy.check_callback("_private") == "_private"
    with pytest.raises(Refused):
        policy.check_callback("parse_detail")


def test_without_a_spider_names_are_checked_by_form():
    policy = InputPolicy()
    assert policy.check_callback("parse_x") == "parse_x"
    for bad in ("_set_crawler", "__init__", "closed", "start"):
        with pytest.raises(Refused):
            policy.check_callback(bad)


def test_seed_meta_is_an_allow_list():
    policy = InputPolicy.from_settings(Settings({"SEED_META_ALLOW": ["campaign"]}), Base)
    assert policy.check_seed_meta({"campaign": "x"}) == {"campaign": "x"}
    for key in ("proxy", "download_slot", "dont_filter", "playwright", "cookiejar",
                "crawlproject_callback_attempts", "_crawlproject_lease", "download_timeout"):
        with pytest.raises(Refused) as info:
            policy.check_seed_meta({key: "x"})
        assert info.value.code == "meta_not_allowed"


def test_spider_attribute_adds_to_the_seed_meta_allow_list():
    class Campaigns(Base):
        seed_meta_allow = ("job",)

    policy = InputPolicy.from_settings(Settings({"SEED_META_ALLOW": ["campaign"]}), Campaigns)
    assert policy.check_seed_meta({"campaign": 1, "job": 2}) == {"campaign": 1, "job": 2}


def test_allowed_playwright_seed_meta_is_still_checked():
    policy = InputPolicy.from_settings(
        Settings({"SEED_META_ALLOW": ["playwright", "playwright_page_methods",
                                      "playwright_context_kwargs"]}), Base)
    meta = policy.check_seed_meta({"playwright": True, "playwright_page_methods": [
        {"method": "wait_for_selector", "args": ["#app"], "kwargs": {"timeout": 5000}}]})
    (pm,) = meta["playwright_page_methods"]
    assert (pm.method, pm.args, pm.kwargs) == ("wait_for_selector", ("#app",), {"timeout": 5000})
    for bad in [
        {"playwright_page_methods": [{"method": "screenshot", "kwargs": {"path": "/tmp/x"}}]},
        {"playwright_page_methods": [{"method": "goto", "args": ["file:///etc/passwd"]}]},
        {"playwright_page_methods": [{"method": "click", "args": ["#a"], "kwargs": {"path": "x"}}]},
        {"playwright_context_kwargs": {"record_har_path": "/tmp/x.har"}},
        {"playwright_context_kwargs": {"user_data_dir": "/tmp/profile"}},
    ]:
        with pytest.raises(Refused):
            policy.check_seed_meta(bad)


def test_page_methods_allow_list_from_settings_never_allows_file_access():
    settings = Settings({"PLAYWRIGHT_PAGE_METHODS_ALLOW": ["evaluate", "set_input_files", "pdf"]})
    policy = InputPolicy.from_settings(settings, Base)
    assert policy.page_methods_allow == {"evaluate"}
    assert policy.page_method("evaluate", ["1 + 1"], {}).method == "evaluate"
    with pytest.raises(Refused):
        policy.page_method("wait_for_selector", ["#a"], {})       # not in this allow-list
    assert "evaluate" not in DEFAULT_PAGE_METHODS


def test_event_handlers_by_name_are_callbacks():
    policy = InputPolicy(Base)
    policy.check_meta({"playwright_page_event_handlers": {"dialog": "parse_detail"}})
    with pytest.raises(Refused):
        policy.check_meta({"playwright_page_event_handlers": {"dialog": "_set_crawler"}})
    with pytest.raises(Refused):
        policy.check_meta({"playwright_unknown_option": 1})


# -- stored requests: frontier payloads, page records, seeds made requests ----------------
NODE = Settings({"DOWNLOAD_TIMEOUT": 30, "DOWNLOAD_MAXSIZE": 1000, "DOWNLOAD_WARNSIZE": 100})


@pytest.mark.parametrize("meta, code", [
    ({"proxy": "http://127.0.0.1:9/"}, "proxy_not_allowed"),
    ({"dont_obey_robotstxt": True}, "meta_not_allowed"),
    ({"bindaddress": ["127.0.0.1", 0]}, "meta_not_allowed"),
    ({"playwright_include_page": True}, "meta_not_allowed"),
    ({"playwright_context": "ctx1"}, "meta_not_allowed"),
    ({"_crawlproject_original_meta": {}}, "meta_not_allowed"),
    ({"campaign2": "x"}, "meta_not_allowed"),
    ({"download_timeout": float("nan")}, "meta_value_not_allowed"),
    ({"download_timeout": -1}, "meta_value_not_allowed"),
    ({"download_maxsize": "big"}, "meta_value_not_allowed"),
    ({"depth": -5}, "meta_value_not_allowed"),
    ({"depth": True}, "meta_value_not_allowed"),
    ({"referrer_policy": "os.system"}, "meta_value_not_allowed"),
    ({"redirect_urls": "http://x/"}, "meta_value_not_allowed"),
    ({"session": {"x": 1}}, "meta_value_not_allowed"),
    ({"playwright": "yes"}, "meta_value_not_allowed"),
])
def test_stored_meta_is_an_allow_list_with_checked_values(meta, code):
    policy = InputPolicy.from_settings(NODE, Base)
    with pytest.raises(Refused) as info:
        policy.check_stored_meta(meta)
    assert info.value.code == code


def test_what_the_nodes_components_store_is_allowed():
    policy = InputPolicy.from_settings(NODE, Base)
    meta = {"depth": 3, "retry_times": 1, "redirect_times": 1, "redirect_ttl": 19,
            "redirect_urls": ["http://a/"], "redirect_reasons": [301], "download_slot": "a",
            "download_timeout": 30, "handle_httpstatus_list": [404], "cookiejar": "s1",
            "session": "s1", "session_cookies": {"k": "v"}, "dont_rotate_identity": True,
            "proxy_ban_tries": 2, "crawlproject_callback_attempts": 1, "recrawl": {"etag": "x"},
            "render": True, "render_wait_for": ".p", "playwright": True,
            "referrer_policy": "no-referrer", "is_start_request": True, "verbatim_url": False}
    assert policy.check_stored_meta(meta) == meta


def test_stored_download_limits_are_only_ever_tightened():
    policy = InputPolicy.from_settings(NODE, Base)
    out = policy.check_stored_meta({"download_timeout": 1e9, "download_maxsize": 0,
                                    "download_warnsize": 10})
    assert out == {"download_timeout": 30, "download_maxsize": 1000, "download_warnsize": 10}
    assert policy.check_stored_meta({"download_timeout": 5}) == {"download_timeout": 5}


def test_published_keys_and_allowed_proxies_pass():
    class Published(Base):
        stored_meta_allow = ("playwright_include_page", "tags")

    settings = Settings({"STORED_META_ALLOW": ["playwright_context"], "SEED_META_ALLOW": ["c"],
                         "STORED_PROXY_ALLOW": ["http://user:pw@127.0.0.9:8080"]})
    policy = InputPolicy.from_settings(settings, Published)
    meta = {"playwright_include_page": True, "playwright_context": "c1", "tags": [1], "c": 2,
            "proxy": "http://127.0.0.9:8080"}
    assert policy.check_stored_meta(meta) == meta
    with pytest.raises(Refused, match="STORED_PROXY_ALLOW"):
        policy.check_stored_meta({"proxy": "http://127.0.0.9:8081"})
    # None is Scrapy's "no proxy, not even the environment's": always allowed.
    assert InputPolicy().check_stored_meta({"proxy": None}) == {"proxy": None}
    with pytest.raises(Refused):  # still checked: a context name, not an object
        policy.check_stored_meta({"playwright_context": {"x": 1}})


@pytest.mark.parametrize("url", [
    "file:///etc/passwd", "ftp://127.0.0.1/x", "data:text/html,hi", "javascript:alert(1)",
    "s3://bucket/key", "http://", "//127.0.0.1/x", "/relative", 5, None, "http://[::1/",
])
def test_stored_urls_are_http_or_https_only(url):
    with pytest.raises(Refused):
        InputPolicy().check_url(url)


def test_a_page_records_request_must_fetch_its_own_site():
    policy = InputPolicy()
    policy.check_same_site("http://127.0.0.1/p/1?x", "http://127.0.0.1:80/p/1")
    for other in ("http://127.0.0.2/p/1", "https://127.0.0.1/p/1", "http://127.0.0.1:81/p/1",
                  "file:///p/1", None):
        with pytest.raises(Refused) as info:
            policy.check_same_site("http://127.0.0.1/p/1", other)
        assert info.value.code == "other_site"


def test_seed_meta_values_get_the_stored_checks():
    settings = Settings({"SEED_META_ALLOW": ["proxy", "download_timeout", "depth"],
                         "DOWNLOAD_TIMEOUT": 30})
    policy = InputPolicy.from_settings(settings, Base)
    assert policy.check_seed_meta({"download_timeout": 1e9}) == {"download_timeout": 30}
    for meta in ({"proxy": "http://127.0.0.9:1"}, {"depth": -1}):
        with pytest.raises(Refused):
            policy.check_seed_meta(meta)
