"""What data read from Redis (or MongoDB) may make a node do.

Two kinds of writer, told apart by proof (:mod:`crawlproject.signing`): what a
node of this crawl stored, signed with ``FRONTIER_SECRET``, comes back whole
(:class:`NodePolicy`: its callbacks must be the running spider's methods);
everything else (seeds, unproven payloads) gets the seed policy,
:class:`InputPolicy`: allow-lists of callbacks, meta keys, browser actions,
methods, headers and stored-request fields, within what the spider and the
operator published. A refusal raises :class:`Refused` with a short ``code`` (a
stats key) and a message naming what was refused.

Each allow-list in full: ``docs/frontier.md``, "What data read back may ask of
a node (crawlproject/policy.py)".

Size (over 600 lines): every allow-list a writer other than a node meets
(callbacks, meta keys and the check of each value, browser actions, the
request itself) and what a node's own data still must be, in one module, so
that one file says all that data read back may ask of a node.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from crawlproject.defaults import PLAYWRIGHT_PAGE_METHODS_ALLOW, setting

__all__ = ["Refused", "InputPolicy", "NodePolicy", "DEFAULT_PAGE_METHODS", "STORED_META",
           "PUBLISHED_ONLY", "published_callbacks", "SEED_HEADERS", "NEVER_SEED_HEADERS"]


class Refused(ValueError):
    """Data from Redis asks for something it may not do; ``code`` is a stats key."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


#: Page methods a payload may ask a rendering node to call, by default.
DEFAULT_PAGE_METHODS = frozenset(PLAYWRIGHT_PAGE_METHODS_ALLOW)
#: Never allowed, whatever the settings say: they read or write files, load
#: other URLs (``file://``, internal hosts) or run code outside the page.
NEVER_PAGE_METHODS = frozenset({
    "set_input_files", "pdf", "add_script_tag", "add_style_tag",
    "add_init_script", "route", "route_from_har", "unroute", "expose_binding",
    "expose_function", "goto", "go_back", "go_forward", "reload", "close",
    "set_content", "context", "video", "wait_for_event", "expect_download",
})
#: Keyword arguments a page method may get (no file paths).
PAGE_METHOD_KWARGS = frozenset({
    "timeout", "state", "strict", "button", "click_count", "delay", "force", "modifiers",
    "no_wait_after", "position", "trial", "wait_until", "arg", "polling", "has_text",
})
#: Browser-context options a payload may set (``playwright_context_kwargs``).
CONTEXT_KWARGS = frozenset({
    "user_agent", "locale", "timezone_id", "viewport", "screen", "no_viewport",
    "java_script_enabled", "ignore_https_errors", "extra_http_headers", "color_scheme",
    "reduced_motion", "forced_colors", "device_scale_factor", "is_mobile", "has_touch",
    "geolocation", "permissions", "bypass_csp", "offline",
    "base_url", "service_workers", "strict_selectors",
})
# Never in CONTEXT_KWARGS: "proxy" (a payload could route a node's browser
# through a proxy of its choice) and "http_credentials" (secrets in Redis). A
# rendered request's proxy comes from the proxy middleware, per download
# (crawlproject.rendering.middleware), and is never stored.
GOTO_KWARGS = frozenset({"timeout", "wait_until", "referer"})
#: ``playwright_*`` meta keys a request may carry, and how each is checked.
PLAYWRIGHT_META = frozenset({
    "playwright", "playwright_context", "playwright_context_kwargs", "playwright_include_page",
    "playwright_page_methods", "playwright_page_goto_kwargs", "playwright_page_event_handlers",
    # set by scrapy-playwright on a downloaded request: plain data
    "playwright_security_details", "playwright_suggested_filename",
})
#: Spider hooks Scrapy calls by name; never callbacks, even when a spider defines them.
NEVER_CALLBACKS = frozenset({
    "closed", "close", "start", "start_requests", "from_crawler", "update_settings",
    "handles_request", "make_request_from_seed", "log",
})
MAX_NAME = 100
MAX_CONTEXT_NAME = 64
#: Methods anyone may ask for (without a body); more only when published.
SEED_METHODS = frozenset({"GET", "HEAD"})
#: Headers a seed (or an unproven payload) may set, compared case-insensitively.
SEED_HEADERS = frozenset({
    "accept", "accept-encoding", "accept-language", "cache-control", "content-type", "if-modified-since",
    "if-none-match", "pragma", "referer", "user-agent",
})
#: Never from anyone but a node, whatever a setting says: credentials, and a
#: ``Host`` that would send the request to another virtual host than its URL's.
NEVER_SEED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "host"})
MAX_HEADERS = 64

_SCALARS = (str, int, float, bool, type(None))
STORED_SCHEMES = frozenset({"http", "https"})
MAX_URL = 8192
MAX_HOPS = 100         # redirect_urls / redirect_reasons entries
MAX_COUNT = 10_000     # depth, retry and redirect counters


def _bool(policy: "InputPolicy", key: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be true or false")
    return value


def _count(limit: int) -> Callable:
    def check(policy: "InputPolicy", key: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise Refused("meta_value_not_allowed",
                          f"meta {key!r} must be an integer from 0 to {limit}")
        return value
    return check


def _epoch(policy: "InputPolicy", key: str, value: Any) -> Any:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be a time (epoch seconds)")
    return value


def _text(limit: int) -> Callable:
    def check(policy: "InputPolicy", key: str, value: Any) -> Any:
        if not isinstance(value, str) or len(value) > limit:
            raise Refused("meta_value_not_allowed",
                          f"meta {key!r} must be text of at most {limit} characters")
        return value
    return check


def _jar(policy: "InputPolicy", key: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or len(str(value)) > 200:
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be a short name or number")
    return value


def _urls(policy: "InputPolicy", key: str, value: Any) -> Any:
    if (not isinstance(value, list) or len(value) > MAX_HOPS
            or not all(isinstance(v, str) and len(v) <= MAX_URL for v in value)):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be a short list of URLs")
    return value


def _reasons(policy: "InputPolicy", key: str, value: Any) -> Any:
    if (not isinstance(value, list) or len(value) > MAX_HOPS
            or not all(v is None or isinstance(v, (int, str)) and len(str(v)) <= 100
                       for v in value)):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be a short list")
    return value


def _statuses(policy: "InputPolicy", key: str, value: Any) -> Any:
    if (not isinstance(value, list) or len(value) > 1000
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be a list of status codes")
    return value


def _object(policy: "InputPolicy", key: str, value: Any) -> Any:
    # Checked value by value where it is used (crawlproject.recrawl.checked_state,
    # the session-cookie middleware): here only its shape.
    if not isinstance(value, dict):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be an object")
    return value


def _policy_name(policy: "InputPolicy", key: str, value: Any) -> Any:
    # A name, never a class path (Scrapy's referer middleware imports one).
    if not isinstance(value, str) or not value or len(value) > 40 or not all(
            c.isalnum() or c == "-" for c in value):
        raise Refused("meta_value_not_allowed", f"meta {key!r} must be a referrer policy name")
    return value


def _limit(setting: str) -> Callable:
    """A download limit may be tightened by a stored request, never loosened:
    larger values (and 0, "no limit") become the node's own."""
    def check(policy: "InputPolicy", key: str, value: Any) -> Any:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0):
            raise Refused("meta_value_not_allowed", f"meta {key!r} must be a number >= 0")
        bound = getattr(policy, setting)
        if bound and (value == 0 or value > bound):
            return bound
        return value
    return check


#: meta keys a stored request may carry without being published, with the
#: check of their value: what Scrapy's components (depth, redirects, retries,
#: timeouts, download slots, cookies, referrer policy), scrapy-playwright and
#: this project's (sessions, identity, proxy ban tries, callback retries,
#: rendering, recrawl) put on requests a node stores itself.
STORED_META: dict[str, Callable] = {
    "depth": _count(MAX_COUNT), "retry_times": _count(MAX_COUNT),
    "max_retry_times": _count(100), "redirect_times": _count(MAX_COUNT),
    "redirect_ttl": _count(MAX_COUNT), "redirect_urls": _urls, "redirect_reasons": _reasons,
    "download_slot": _text(200), "download_timeout": _limit("max_download_timeout"),
    "download_maxsize": _limit("max_download_size"),
    "download_warnsize": _limit("max_download_warnsize"),
    "handle_httpstatus_list": _statuses, "handle_httpstatus_all": _bool,
    "dont_redirect": _bool, "dont_retry": _bool, "dont_merge_cookies": _bool,
    "dont_cache": _bool, "is_start_request": _bool, "verbatim_url": _bool,
    "cookiejar": _jar, "referrer_policy": _policy_name,
    "session": _text(200), "session_cookies": _object, "dont_rotate_identity": _bool,
    "proxy_ban_tries": _count(MAX_COUNT), "crawlproject_callback_attempts": _count(MAX_COUNT),
    "recrawl": _object, "render": _bool, "render_wait_for": _text(1000),
    "playwright": _bool,
    "robotstxt_fetch": _bool, "robotstxt_waits": _count(MAX_COUNT),
    "robotstxt_since": _epoch,
    "sitemap": _object, "sitemap_lastmod": _text(40),   # crawlproject.sitemaps checks them
}
#: Meta keys any seed may carry without being published: plain data, no
#: behaviour (a page's ``lastmod`` from a sitemap: crawlproject.sitemaps).
SEED_DATA_META = frozenset({"sitemap_lastmod"})
#: Browser keys a stored request may carry only when the spider or the
#: operator published them: an included page stays open until the callback
#: closes it (payloads holding every browser context would stall rendering), a
#: named context outlives the request.
PUBLISHED_ONLY = frozenset({"playwright_include_page", "playwright_context"})


def _is_framework(cls: type) -> bool:
    """A base class of the framework (its methods are never callbacks)."""
    module = getattr(cls, "__module__", "") or ""
    return (cls is object or module == "scrapy" or module.startswith(("scrapy.", "scrapy_redis.",
                                                                       "scrapy_playwright."))
            or module == "crawlproject.spiders.seeded")


@functools.lru_cache(maxsize=256)
def published_callbacks(spidercls: type) -> frozenset[str]:
    """Names a seed or payload may use as callback or errback of *spidercls*."""
    explicit = getattr(spidercls, "allowed_callbacks", None)
    if explicit is not None:
        if isinstance(explicit, str):
            explicit = (explicit,)
        return frozenset(n for n in explicit if isinstance(n, str) and not n.startswith("__")
                         and callable(getattr(spidercls, n, None)))
    framework = set()
    for cls in spidercls.__mro__:
        if _is_framework(cls):
            framework.update(vars(cls))
    names = set()
    for cls in reversed(spidercls.__mro__):
        if _is_framework(cls):
            continue
        for name, attr in vars(cls).items():
            if (not name.startswith("_") and inspect.isfunction(attr)
                    and name not in NEVER_CALLBACKS
                    and (name == "parse" or name not in framework)):
                names.add(name)
            elif name in names and not inspect.isfunction(attr):
                names.discard(name)  # a subclass replaced the method by something else
    return frozenset(names)


@dataclass(frozen=True)
class InputPolicy:
    """The allow-lists that apply to one spider's seeds and payloads.

    ``spidercls`` None (scrapy-redis' ``SCHEDULER_SERIALIZER`` interface, which
    never sees the spider) checks callbacks by name only: identifiers without
    a leading underscore that are not framework hooks.
    """

    spidercls: type | None = None
    seed_meta_allow: frozenset[str] = frozenset()
    page_methods_allow: frozenset[str] = DEFAULT_PAGE_METHODS
    #: meta keys a stored request may carry besides :data:`STORED_META`.
    stored_meta_allow: frozenset[str] = frozenset()
    #: proxies (``scheme://host:port``) a stored request may name.
    proxy_allow: frozenset[str] = frozenset()
    #: methods allowed (besides :data:`SEED_METHODS`, the only ones without a body).
    methods_allow: frozenset[str] = frozenset()
    #: header names (lower case) allowed besides :data:`SEED_HEADERS`.
    headers_allow: frozenset[str] = frozenset()
    # The node's own download limits (0: none), which stored requests may only tighten.
    max_download_timeout: float = 180.0
    max_download_size: int = 1024 * 1024 * 1024
    max_download_warnsize: int = 32 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings, spidercls: type | None = None) -> "InputPolicy":
        """``SEED_META_ALLOW`` + ``spidercls.seed_meta_allow``;
        ``PLAYWRIGHT_PAGE_METHODS_ALLOW`` (default :data:`DEFAULT_PAGE_METHODS`);
        for stored requests also ``STORED_META_ALLOW`` + ``spidercls.stored_meta_allow``,
        ``STORED_PROXY_ALLOW`` and the node's ``DOWNLOAD_TIMEOUT``,
        ``DOWNLOAD_MAXSIZE``, ``DOWNLOAD_WARNSIZE``; ``SEED_METHODS_ALLOW`` +
        ``spidercls.seed_methods_allow``, ``SEED_HEADERS_ALLOW`` +
        ``spidercls.seed_headers_allow``."""
        get = functools.partial(setting, settings)
        meta = set(_names(get("SEED_META_ALLOW")))
        meta.update(_names(getattr(spidercls, "seed_meta_allow", None) or ()))
        stored = set(_names(get("STORED_META_ALLOW")))
        stored.update(_names(getattr(spidercls, "stored_meta_allow", None) or ()))
        pages = get("PLAYWRIGHT_PAGE_METHODS_ALLOW")
        pages_allowed = frozenset(_names(pages)) if pages else DEFAULT_PAGE_METHODS
        proxies = frozenset(filter(None, map(_proxy_key, get("STORED_PROXY_ALLOW"))))
        methods = {m.upper() for m in _names(get("SEED_METHODS_ALLOW"))}
        methods.update(m.upper() for m in _names(getattr(spidercls, "seed_methods_allow", None)
                                                    or ()))
        headers = {h.lower() for h in _names(get("SEED_HEADERS_ALLOW"))}
        headers.update(h.lower() for h in _names(getattr(spidercls, "seed_headers_allow", None)
                                                    or ()))
        limits = {}
        if settings is not None:
            limits = dict(max_download_timeout=max(0.0, settings.getfloat("DOWNLOAD_TIMEOUT")),
                          max_download_size=max(0, settings.getint("DOWNLOAD_MAXSIZE")),
                          max_download_warnsize=max(0, settings.getint("DOWNLOAD_WARNSIZE")))
        return cls(spidercls, frozenset(meta), pages_allowed - NEVER_PAGE_METHODS,
                   frozenset(meta | stored), proxies, frozenset(methods),
                   frozenset(headers - NEVER_SEED_HEADERS), **limits)

    @classmethod
    def from_crawler(cls, crawler) -> "InputPolicy":
        return cls.from_settings(crawler.settings, crawler.spidercls)

    # -- callbacks -----------------------------------------------------------
    def check_callback(self, name: Any, what: str = "callback") -> str:
        """Return *name* if it may be called as a *what*; raise :class:`Refused`."""
        if not isinstance(name, str) or not name.isidentifier() or len(name) > MAX_NAME:
            raise Refused("callback_not_allowed",
                          f"{what} must be a method name, got {short_repr(name)}")
        if self.spidercls is None:
            if name.startswith("_") or name in NEVER_CALLBACKS:
                raise Refused("callback_not_allowed",
                              f"{what} {name!r} is not a spider callback")
            return name
        if name not in published_callbacks(self.spidercls):
            raise Refused("callback_not_allowed",
                          f"{what} {name!r} is not a callback published by spider "
                          f"{self.spidercls.__name__} (public methods of the spider's own "
                          f"classes, or its allowed_callbacks)")
        return name

    def resolve(self, spider, name: str, what: str = "callback"):
        """The bound method *name* of *spider*, if it may be a *what*."""
        self.check_callback(name, what)
        return getattr(spider, name)

    # -- meta -----------------------------------------------------------------
    def check_seed_meta(self, meta: dict) -> dict:
        """Seed meta: allowed keys only; browser keys checked and page methods
        given as ``{"method", "args", "kwargs"}`` objects made into PageMethods."""
        for key in meta:
            if key not in self.seed_meta_allow and key not in SEED_DATA_META:
                raise Refused("meta_not_allowed",
                              f"meta key {short_repr(key)} is not allowed in seeds (allow it with "
                              f"the SEED_META_ALLOW setting or the spider's seed_meta_allow)")
        meta = dict(meta)
        methods = meta.get("playwright_page_methods")
        if methods is not None:
            meta["playwright_page_methods"] = [
                pm if _is_page_method(pm) else self._page_method_from_json(pm)
                for pm in _page_method_list(methods)]
        return self.check_stored_meta(meta)  # values: the same checks as any stored request

    # -- stored requests ----------------------------------------------------------
    def check_url(self, url: Any) -> str:
        """*url* if a stored request may fetch it: absolute ``http(s)`` with a host."""
        if not isinstance(url, str) or len(url) > MAX_URL:
            raise Refused("bad_url", f"url must be text of at most {MAX_URL} characters")
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError as exc:
            raise Refused("bad_url", f"unparseable URL {url[:200]!r}: {exc}") from None
        if parts.scheme.lower() not in STORED_SCHEMES:
            raise Refused("scheme_not_allowed",
                          f"URL scheme {parts.scheme[:20]!r} is not allowed (http, https only)")
        if not host:
            raise Refused("bad_url", f"URL {url[:200]!r} has no host")
        return url

    def check_same_site(self, url: str, record_url: Any) -> None:
        """A page record's request must fetch the record's own site: same
        scheme, host and port as *record_url* (the URL the record is kept under)."""
        if not isinstance(record_url, str) or _site(url) != _site(record_url):
            raise Refused("other_site",
                          f"request URL {url[:200]!r} is not on the site of its page record "
                          f"{str(record_url)[:200]!r}")

    def check_stored(self, d: dict) -> dict:
        """A request dict rebuilt from stored data (``meta`` decoded, ``body``
        bytes, ``headers`` by name): its URL, callbacks, method, body, headers,
        cookies and meta, as :meth:`check_stored_meta` returns it."""
        self.check_url(d.get("url"))
        for key in ("callback", "errback"):
            if d.get(key) is not None:
                self.check_callback(d[key], key)
        self.check_request(d.get("method") or "GET", d.get("headers") or {},
                           d.get("body") or b"", d.get("cookies"))
        return {**d, "meta": self.check_stored_meta(d.get("meta") or {})}

    def check_request(self, method: Any, headers: dict, body: Any = b"",
                      cookies: Any = None) -> None:
        """What anyone but a node may ask of the request itself: ``GET``/``HEAD``
        without a body unless a method is published (``SEED_METHODS_ALLOW``,
        the spider's ``seed_methods_allow``); headers from an allow-list,
        never credentials nor ``Host``; no cookies. Raise :class:`Refused`."""
        if not isinstance(method, str) or method.upper() not in SEED_METHODS | self.methods_allow:
            raise Refused("method_not_allowed",
                          f"method {short_repr(method)} is not allowed (GET and HEAD; publish "
                          "more with SEED_METHODS_ALLOW or the spider's seed_methods_allow)")
        if body and method.upper() not in self.methods_allow:
            raise Refused("body_not_allowed",
                          f"a {method.upper()} request from anyone but a node of the crawl "
                          "carries no body (publish a method with SEED_METHODS_ALLOW)")
        if cookies:
            raise Refused("header_not_allowed", "cookies are not allowed in a seed or an "
                                                "unproven stored request")
        if len(headers) > MAX_HEADERS:
            raise Refused("header_not_allowed", f"more than {MAX_HEADERS} headers")
        for name in headers:
            text = name.decode("latin-1") if isinstance(name, bytes) else str(name)
            lower = text.strip().lower()
            if lower in NEVER_SEED_HEADERS or lower not in SEED_HEADERS | self.headers_allow:
                raise Refused("header_not_allowed",
                              f"header {short_repr(text)} is not allowed in a seed or an unproven "
                              "stored request (allowed: "
                              f"{', '.join(sorted(SEED_HEADERS | self.headers_allow))}; "
                              "SEED_HEADERS_ALLOW adds more; credentials and Host never)")

    def check_stored_meta(self, meta: dict) -> dict:
        """The meta of a stored request, every key allowed and every value
        checked (download limits capped at the node's own); raise :class:`Refused`."""
        out = {}
        for key, value in meta.items():
            check = STORED_META.get(key)
            if key == "proxy":
                value = self._check_proxy(value)
            elif check is not None:
                value = check(self, key, value)
            elif not (key in self.stored_meta_allow
                      or key in PLAYWRIGHT_META and key not in PUBLISHED_ONLY):
                raise Refused("meta_not_allowed",
                              f"meta key {short_repr(key)} is not allowed in a stored request "
                              "(publish it with the STORED_META_ALLOW setting or the spider's "
                              "stored_meta_allow)")
            out[key] = value
        self.check_meta(out)
        return out

    def _check_proxy(self, value: Any) -> str | None:
        if value is None:  # Scrapy's "no proxy for this request", even from the environment
            return None
        key = _proxy_key(value)
        if key is None or key not in self.proxy_allow:
            raise Refused("proxy_not_allowed",
                          f"meta 'proxy' {short_repr(value)} is not allowed in a stored request "
                          "(the operator lists the proxies stored requests may name in "
                          "STORED_PROXY_ALLOW)")
        return value

    def check_meta(self, meta: dict) -> None:
        """Any request meta read from Redis: the ``playwright_*`` keys."""
        for key, value in meta.items():
            if not isinstance(key, str) or not key.startswith("playwright"):
                continue
            if key not in PLAYWRIGHT_META:
                raise Refused("meta_not_allowed", f"meta key {short_repr(key)} is not allowed")
            check = getattr(self, f"_check_{key}", None)
            if check is not None and value is not None:
                check(value)

    def _check_playwright_context(self, value: Any) -> None:
        if not isinstance(value, str) or not value or len(value) > MAX_CONTEXT_NAME:
            raise Refused("meta_not_allowed", "playwright_context must be a short name")

    def _check_playwright_context_kwargs(self, value: Any) -> None:
        _check_options(value, CONTEXT_KWARGS, "playwright_context_kwargs")

    def _check_playwright_page_goto_kwargs(self, value: Any) -> None:
        _check_options(value, GOTO_KWARGS, "playwright_page_goto_kwargs")

    def _check_playwright_page_event_handlers(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise Refused("meta_not_allowed", "playwright_page_event_handlers must be an object")
        for event, handler in value.items():
            if isinstance(handler, str) or not callable(handler):
                self.check_callback(handler, f"page event handler for {short_repr(event)}")

    def _check_playwright_page_methods(self, value: Any) -> None:
        for pm in _page_method_list(value):
            if not _is_page_method(pm):
                raise Refused("page_method_not_allowed",
                              f"playwright_page_methods holds a {type(pm).__name__}, "
                              "not a PageMethod")
            self.check_page_method(pm.method, pm.args, pm.kwargs)

    # -- page methods -----------------------------------------------------------
    def check_page_method(self, method: Any, args: Iterable, kwargs: dict) -> None:
        """Raise :class:`Refused` unless ``page.<method>(*args, **kwargs)`` is allowed."""
        if not isinstance(method, str) or method not in self.page_methods_allow:
            raise Refused("page_method_not_allowed",
                          f"page method {short_repr(method)} is not allowed (allowed: "
                          f"{', '.join(sorted(self.page_methods_allow))}; see "
                          "PLAYWRIGHT_PAGE_METHODS_ALLOW)")
        for arg in args:
            if not isinstance(arg, _SCALARS):
                raise Refused("page_method_not_allowed",
                              f"page method {method!r}: positional arguments must be plain values")
        if not isinstance(kwargs, dict):
            raise Refused("page_method_not_allowed", f"page method {method!r}: bad kwargs")
        _check_options(kwargs, PAGE_METHOD_KWARGS, f"page method {method!r}")

    def page_method(self, method: Any, args: Any, kwargs: Any):
        """A checked scrapy-playwright ``PageMethod``."""
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            raise Refused("page_method_not_allowed", "a page method needs args (list) and "
                                                     "kwargs (object)")
        self.check_page_method(method, args, kwargs)
        from scrapy_playwright.page import PageMethod

        return PageMethod(method, *args, **kwargs)

    def _page_method_from_json(self, value: Any):
        if not isinstance(value, dict) or set(value) - {"method", "args", "kwargs"}:
            raise Refused("page_method_not_allowed",
                          'a seed page method is {"method": ..., "args": [...], "kwargs": {...}}')
        return self.page_method(value.get("method"), value.get("args", []),
                                value.get("kwargs", {}))


class NodePolicy:
    """What a node of this crawl stored, proven by its signature: it comes
    back whole. Callbacks and errbacks must still be methods of the running
    spider (any of them, private ones too: ``CrawlSpider._callback``), a
    request class must be a Scrapy request class, and meta keys that only
    make sense inside one process are dropped by the caller; nothing else is
    refused (the spider made it)."""

    def __init__(self, spider=None):
        self.spider = spider

    def check_callback(self, name: Any, what: str = "callback") -> str:
        """*name* if it names a method of the running spider."""
        if not isinstance(name, str) or not name.isidentifier() or len(name) > MAX_NAME \
                or (name.startswith("__") and name.endswith("__")):
            raise Refused("callback_not_allowed", f"{what} must be a method name, got "
                                                  f"{short_repr(name)}")
        if self.spider is not None:
            method = getattr(self.spider, name, None)
            if not inspect.ismethod(method) or method.__self__ is not self.spider:
                raise Refused("callback_not_allowed",
                              f"{what} {name!r} is not a method of spider "
                              f"{type(self.spider).__name__}")
        return name

    def page_method(self, method: Any, args: Any, kwargs: Any):
        """The ``PageMethod`` the spider stored, unchecked."""
        if not isinstance(method, str) or not isinstance(args, (list, tuple)) \
                or not isinstance(kwargs, dict):
            raise Refused("page_method_not_allowed", "malformed page method")
        from scrapy_playwright.page import PageMethod

        return PageMethod(method, *args, **kwargs)

    def request_class(self, path: Any) -> type:
        """The request class a node stored (any Scrapy ``Request`` subclass)."""
        from scrapy.utils.misc import load_object
        from scrapy import Request

        if not isinstance(path, str) or len(path) > 300:
            raise Refused("class_not_allowed", "request class must be a dotted path")
        try:
            cls = load_object(path)
        except Exception as exc:  # noqa: BLE001 - a class of another version of the spider
            raise Refused("class_not_allowed", f"request class {path[:100]!r}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Request)):
            raise Refused("class_not_allowed", f"{path[:100]!r} is not a request class")
        return cls


def _check_options(value: Any, allowed: frozenset[str], what: str) -> None:
    if not isinstance(value, dict):
        raise Refused("meta_not_allowed", f"{what} must be an object")
    for key in value:
        if key not in allowed:
            raise Refused("meta_not_allowed", f"{what}: option {short_repr(key)} is not allowed "
                                              f"(allowed: {', '.join(sorted(allowed))})")


def _page_method_list(value: Any) -> list:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return list(value)
    raise Refused("page_method_not_allowed", "playwright_page_methods must be a list")


def _is_page_method(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == "PageMethod" and cls.__module__.startswith("scrapy_playwright")


def _site(url: str) -> tuple | None:
    try:
        parts = urlsplit(url)
        return parts.scheme.lower(), parts.hostname, parts.port or {"http": 80, "https": 443}.get(
            parts.scheme.lower())
    except ValueError:
        return None


def _proxy_key(value: Any) -> str | None:
    """``scheme://host:port`` of a proxy URL (no credentials), or None."""
    if not isinstance(value, str) or len(value) > MAX_URL:
        return None
    site = _site(value if "://" in value else f"http://{value}")
    if site is None or site[0] not in STORED_SCHEMES or not site[1]:
        return None
    return f"{site[0]}://{site[1]}:{site[2]}"


def _names(values: Iterable) -> list[str]:
    return [v.strip() for v in values if isinstance(v, str) and v.strip()]


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to 80 characters, for error messages that quote input."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
