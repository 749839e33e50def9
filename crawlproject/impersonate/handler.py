"""ImpersonateDownloadHandler: http(s) downloads that look like the identity's browser on the wire.

The identity middleware (610) puts the session's profile in the identity it
gives the request; this handler sends the request with curl_cffi under that
profile (the browser version's TLS ClientHello, HTTP/2 settings and header
order), or the profile of its own User-Agent, else
``IMPERSONATE_DEFAULT_PROFILE``. Redirects, cookies, decoding, timeouts, size
limits, signals, proxies and the header limits stay Scrapy's and this
project's; connections are pooled per explicit session; failures are counted
in ``impersonate/errors/<reason>`` and, with ``IMPERSONATE_FALLBACK``,
downloaded again by Scrapy's own client.

What stays Scrapy's, plain http, pools, rendering and failures in full:
``docs/middlewares.md``, "The impersonating download handler
(crawlproject/impersonate/handler.py)".
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import ipaddress
import logging
import time
import weakref
from collections import OrderedDict
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from scrapy.core.downloader.handlers._base_streaming import BaseStreamingDownloadHandler
from scrapy.http import Headers
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object

from crawlproject.defaults import setting
from crawlproject.egress.policy import parse_address
from crawlproject.egress.resolver import checked_addresses
from crawlproject.identity.session import IDENTITY, explicit_session
from crawlproject.identity.useragents import HINT_HEADERS
import crawlproject.impersonate.errors as errors
from crawlproject.impersonate.profiles import available_profiles, load_library, profile_for
from crawlproject.limits import report_for
from crawlproject.limits.headers import HeaderLimits

logger = logging.getLogger(__name__)

#: Connection pools of explicit sessions and cookie jars kept open at most, and the
#: seconds one stays open unused (curl_cffi wakes each pool's libcurl 10 times a second).
MAX_SESSION_POOLS = 256
IDLE_POOL_SECONDS = 60.0
#: Headers the request decides: a profile's default is removed when the request has
#: none (Accept-Encoding: Scrapy must be able to decode the answer; client hints:
#: the identity sends them only where Chromium would, and a pinned User-Agent
#: must not be contradicted by the profile's).
FOLLOW_REQUEST = ("Accept-Encoding", *HINT_HEADERS)
_HANDLERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_HTTP_VERSIONS = {1: "HTTP/1.0", 2: "HTTP/1.1", 3: "HTTP/2", 30: "HTTP/3"}
_TLS_CODES = frozenset({35, 58, 59, 60, 66, 77, 80, 83, 90, 91, 98, 101})
_LIBRARY_CODES = frozenset({2, 4, 27, 43, 48})
#: The handler Scrapy's own client is built from for IMPERSONATE_FALLBACK: Scrapy's,
#: with the header bounds.
PLAIN_HANDLER = "crawlproject.limits.headers.BoundedHTTP11DownloadHandler"


class ImpersonateDownloadHandler(BaseStreamingDownloadHandler):
    """Download http(s) requests with the session's browser profile (see docs/middlewares.md)."""

    supports_per_request_bindaddress = False

    @classmethod
    def from_crawler(cls, crawler):
        """One instance for http and https: one set of connection pools."""
        handlers = _HANDLERS.setdefault(crawler, [])
        if not handlers:
            handlers.append(cls(crawler))
        return handlers[0]

    def __init__(self, crawler):
        super().__init__(crawler)
        s = crawler.settings
        self.stats = crawler.stats
        self.profiles = available_profiles()
        self.default_profile = setting(s, "IMPERSONATE_DEFAULT_PROFILE") or None
        if self.default_profile and self.default_profile not in self.profiles:
            raise ValueError(f"IMPERSONATE_DEFAULT_PROFILE {self.default_profile!r} is not a "
                             f"profile of curl_cffi {load_library().__version__} (known: "
                             f"{', '.join(sorted(self.profiles))})")
        self.fallback = setting(s, "IMPERSONATE_FALLBACK")
        self.verify = s.getbool("DOWNLOAD_VERIFY_CERTIFICATES")
        self.bind_host = self._get_bind_address_host()
        self.pools = SessionPools(self._new_session, MAX_SESSION_POOLS,
                                  self._pool_size_total, self._pool_size_per_host)
        self._plain = None
        self._told: set[tuple[str, str]] = set()
        self.header_limits = HeaderLimits.from_settings(s)
        self.limits = report_for(crawler)
        self._closing = False

    # ---- BaseStreamingDownloadHandler

    async def download_request(self, request):
        """Download *request* under its profile (see docs/middlewares.md)."""
        try:
            profile = self._profile(request)
            timeout = request.meta.get("download_timeout", self._DEFAULT_CONNECT_TIMEOUT)
            try:
                response = await asyncio.wait_for(self._fetch(request, profile, timeout),
                                                  timeout)
            except asyncio.TimeoutError as exc:
                raise errors.DownloadTimeout(
                    f"Getting {request.url} took longer than {timeout} seconds.") from exc
        except errors.ImpersonateError as exc:
            self._failed(request, exc)
            if self.fallback and exc.fallback:
                return await self._fall_back(request, exc)
            raise
        except (errors.ImpersonateNetworkError, errors.ImpersonateTunnelError) as exc:
            self._failed(request, exc)
            if isinstance(exc, errors.HeadersTooLarge):
                self.limits.refused(request, exc.reason, "%s", exc)
            raise
        self._count(request, response, profile)
        return response

    async def _fetch(self, request, profile: str, timeout: float):
        start = time.monotonic()
        async with self._open(request, profile, timeout) as response:
            request.meta["download_latency"] = time.monotonic() - start
            return await self._read_response(response, request)

    def _make_request(self, request, timeout):
        return self._open(request, self._profile(request), timeout)

    async def _read_response(self, response, request):
        # libcurl bounds the header section (300 KiB, 5000 headers): the settings,
        # when lower, are checked here, before any of the body is read.
        items = response.headers.multi_items()
        size = sum(len(name) + len(value) + 4 for name, value in items)
        try:
            self.header_limits.check(size, len(items), request.url)
        except errors.ResponseHeadersTooLarge as exc:
            raise errors.HeadersTooLarge(str(exc)) from exc
        return await super()._read_response(response, request)

    @staticmethod
    def _extract_headers(response) -> Headers:
        return Headers(list(response.headers.multi_items()))

    @staticmethod
    def _build_base_response_args(response, request, headers):
        try:
            ip = ipaddress.ip_address(response.primary_ip) if response.primary_ip else None
        except ValueError:
            ip = None
        return {"status": response.status_code, "url": request.url, "headers": headers,
                "ip_address": ip, "protocol": _HTTP_VERSIONS.get(response.http_version)}

    @staticmethod
    def _iter_body_chunks(response):
        return response.aiter_content()

    @staticmethod
    def _is_dataloss_exception(exc: Exception) -> bool:
        return getattr(exc, "code", None) == 18     # CURLE_PARTIAL_FILE

    @staticmethod
    def _check_deps_installed() -> None:
        load_library()

    async def close(self) -> None:
        """Close the pools and Scrapy's client if a fallback used it (once: Scrapy calls
        it for each scheme)."""
        if self._closing:
            return
        self._closing = True
        await self.pools.close()
        if self._plain is not None:
            await self._plain.close()

    # ---- the request

    def _profile(self, request) -> str:
        identity = request.meta.get(IDENTITY)
        profile = identity.get("profile") if isinstance(identity, dict) else None
        if profile is None:
            agent = request.headers.get(b"User-Agent")
            profile = (profile_for(agent.decode("latin-1"), self.profiles) if agent else None
                       ) or self.default_profile
            if profile is None:
                raise errors.ImpersonateProfileError(
                    f"no impersonation profile for {request.url}: its User-Agent "
                    f"({_text(agent)}) is no browser version curl_cffi reproduces and "
                    f"IMPERSONATE_DEFAULT_PROFILE is not set", "no_profile")
        if profile not in self.profiles:
            raise errors.ImpersonateProfileError(
                f"impersonation profile {profile!r} is not one of curl_cffi "
                f"{load_library().__version__}")
        return profile

    @asynccontextmanager
    async def _open(self, request, profile: str, timeout: float):
        proxy, proxy_auth = self._proxy(request)
        kwargs = dict(headers=_headers(request), data=request.body or None, timeout=timeout,
                      allow_redirects=False, impersonate=profile, default_headers=True,
                      accept_encoding=None, proxy=proxy, proxy_auth=proxy_auth,
                      verify=self.verify, interface=self.bind_host)
        pin = _PIN.set(await self._pinned(request, proxy))
        pool = self.pools.acquire(request)
        opened = False
        try:
            # libcurl would send a URL's user:pw@ as Authorization (crawlproject.urls)
            from crawlproject.urls import strip_userinfo
            url = strip_userinfo(request.url)
            async with pool.session.stream(request.method, url, **kwargs) as response:
                opened = True
                try:
                    yield response
                finally:
                    # Stop a transfer Scrapy no longer reads (maxsize, stop_download,
                    # an error): closing the stream would otherwise wait for all of it.
                    if getattr(response, "quit_now", None) is not None:
                        response.quit_now.set()
        except Exception as exc:
            raise translate(exc, request, proxy, opened) from exc
        finally:
            self.pools.release(pool)
            _PIN.reset(pin)

    async def _pinned(self, request, proxy: str | None) -> list[str] | None:
        """libcurl resolves names itself: the host it connects to (the proxy, else
        the URL's) is resolved through the address guard first and libcurl is
        pinned to the checked addresses (``CURLOPT_RESOLVE`` entries), so it
        cannot reach anything else (a name that resolves elsewhere the second time)."""
        parts = urlsplit(proxy) if proxy else urlparse_cached(request)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = await checked_addresses(self.crawler, request, host, port)
        if addresses is None or parse_address(host) is not None:
            return None  # no guard in this process, or an IP: nothing to resolve
        if not addresses:
            raise errors.CannotResolve(f"{request.url}: no address found for {host}")
        shown = ",".join(f"[{a}]" if ":" in a else a for a in addresses)
        return [f"{host}:{port}:{shown}"]

    def _proxy(self, request) -> tuple[str | None, tuple[str, str] | None]:
        proxy, auth = self._extract_proxy(request)
        if not proxy or not auth:
            return proxy, None
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "basic":
            raise errors.ImpersonateError(f"Proxy-Authorization scheme {scheme!r}: only Basic "
                                          f"credentials can be given to libcurl")
        user, _, password = base64.b64decode(token).decode(self._proxy_auth_encoding).partition(":")
        return proxy, (user, password)

    def _new_session(self, connections: int):
        # trust_env off: Scrapy's HttpProxyMiddleware already turned *_proxy variables into
        # meta["proxy"]; libcurl must not add them to requests that have none.
        return _pinned_session_class()(max_clients=connections, trust_env=False,
                                       discard_cookies=True, allow_redirects=False,
                                       verify=self.verify, curl_options=_curl_options())

    # ---- outcome

    def _count(self, request, response, profile: str) -> None:
        self.stats.inc_value("impersonate/responses")
        self.stats.inc_value(f"impersonate/profile/{profile}")
        protocol = (response.protocol or "").lower().replace("http/", "http")
        if protocol:
            self.stats.inc_value(f"impersonate/protocol/{protocol}")
        if protocol == "http1.1" and urlparse_cached(request).scheme == "https":
            self.stats.inc_value("impersonate/http1_only")
            self._tell(request, "http1_only", logging.INFO,
                       "%s answered over HTTP/1.1 (ALPN offered h2 as the browser does): its "
                       "TLS fingerprint is the browser's, no HTTP/2 fingerprint is shown there")

    def _failed(self, request, exc) -> None:
        self.stats.inc_value(f"impersonate/errors/{exc.reason}")
        if not isinstance(exc, errors.ImpersonateError):
            return  # a network error: Scrapy's retry middleware logs it
        if self.fallback and exc.fallback:
            then = "downloaded with Scrapy's own client and fingerprint (IMPERSONATE_FALLBACK)"
        else:
            then = ("retried like any download error, never with Scrapy's own fingerprint "
                    "(IMPERSONATE_FALLBACK is off)" if exc.fallback else "retried")
        self._tell(request, exc.reason, logging.WARNING,
                   "Impersonated download from %s failed (%s): %s; %s", exc.reason, exc, then)

    async def _fall_back(self, request, exc):
        self.stats.inc_value(f"impersonate/fallback/{exc.reason}")
        if self._plain is None:
            self._plain = build_from_crawler(load_object(PLAIN_HANDLER), self.crawler)
        response = await self._plain.download_request(request)
        response.flags.append("impersonate_fallback")
        return response

    def _tell(self, request, what: str, level: int, message: str, *args) -> None:
        # Once per site and kind of event: the stats count every one.
        url = urlparse_cached(request)
        if (url.netloc, what) in self._told:
            return
        if len(self._told) > 10_000:
            self._told.clear()
        self._told.add((url.netloc, what))
        logger.log(level, message, f"{url.scheme}://{url.netloc}", *args,
                   extra={"spider": self.crawler.spider})


#: The ``CURLOPT_RESOLVE`` entries of the request being sent by this task (curl_cffi
#: 0.17 takes low-level options per session only, and a session serves many hosts).
_PIN: contextvars.ContextVar = contextvars.ContextVar("crawlproject_curl_resolve",
                                                      default=None)
_PINNED_SESSION = None


def _curl_options() -> dict:
    """Set after the profile's own options (curl_cffi applies a session's last)."""
    from curl_cffi import CurlHttpVersion, CurlOpt

    # HTTP/2 over TLS only, HTTP/1.1 on plain http (no "Upgrade: h2c", as browsers);
    # no decoding by libcurl, which would decompress with no size limit (Scrapy's
    # HttpCompressionMiddleware decodes within DOWNLOAD_MAXSIZE).
    return {CurlOpt.HTTP_VERSION: CurlHttpVersion.V2TLS, CurlOpt.HTTP_CONTENT_DECODING: 0}


def _pinned_session_class():
    """curl_cffi's ``AsyncSession`` whose handles take the pinned addresses of
    the request they are taken for (:data:`_PIN`), before libcurl resolves anything."""
    global _PINNED_SESSION
    if _PINNED_SESSION is None:
        from curl_cffi import CurlOpt
        from curl_cffi.requests import AsyncSession

        class PinnedSession(AsyncSession):
            async def pop_curl(self):
                curl = await super().pop_curl()
                entries = _PIN.get()
                if entries:
                    curl.setopt(CurlOpt.RESOLVE, entries)
                return curl

        _PINNED_SESSION = PinnedSession
    return _PINNED_SESSION


class _Pool:
    __slots__ = ("key", "session", "inflight", "used")

    def __init__(self, key, session, now: float):
        self.key, self.session, self.inflight, self.used = key, session, 0, now


class SessionPools:
    """curl_cffi sessions (each a libcurl connection pool): one shared, one per
    explicit session or cookie jar; a session's is closed once unused for
    *idle* seconds, or, beyond *limit*, the least recently used idle one first."""

    def __init__(self, factory, limit: int, shared_connections: int = 0,
                 session_connections: int = 0, idle: float = IDLE_POOL_SECONDS,
                 clock=time.monotonic):
        self.factory, self.limit, self.idle, self.clock = factory, limit, idle, clock
        self.shared_connections = shared_connections
        self.session_connections = session_connections
        self.shared: _Pool | None = None
        self.by_key: OrderedDict[tuple, _Pool] = OrderedDict()   # least recently used first
        self._closing: set = set()

    def acquire(self, request) -> _Pool:
        key, now = pool_key(request), self.clock()
        if key is None:
            if self.shared is None:
                self.shared = _Pool(None, self.factory(self.shared_connections or 100), now)
            pool = self.shared
        else:
            self._evict(now)
            pool = self.by_key.get(key)
            if pool is None:
                pool = self.by_key[key] = _Pool(
                    key, self.factory(self.session_connections or 6), now)
            self.by_key.move_to_end(key)
        pool.inflight += 1
        pool.used = now
        return pool

    def release(self, pool: _Pool) -> None:
        pool.inflight -= 1
        pool.used = self.clock()

    def __len__(self) -> int:
        return len(self.by_key) + (self.shared is not None)

    def _evict(self, now: float) -> None:
        # Oldest use first: stop at the first pool that is recent and not over the limit.
        for key in list(self.by_key):
            pool = self.by_key[key]
            over = len(self.by_key) >= self.limit
            if not over and now - pool.used < self.idle:
                return
            if pool.inflight == 0 and (over or now - pool.used >= self.idle):
                task = asyncio.ensure_future(self.by_key.pop(key).session.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        pools = list(self.by_key.values()) + ([self.shared] if self.shared else [])
        self.by_key.clear()
        self.shared = None
        for pool in pools:
            await pool.session.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def pool_key(request) -> tuple | None:
    """The connection pool of *request*: its explicit session or cookie jar, else shared."""
    session = explicit_session(request)
    if session is not None:
        return ("session", session)
    jar = request.meta.get("cookiejar")
    return ("cookiejar", str(jar)) if jar is not None else None


def _headers(request) -> list[tuple[str, str | None]]:
    out = [(name.decode("latin-1"), value.decode("latin-1"))
           for name, values in request.headers.items()
           if name.lower() != b"proxy-authorization" for value in values]
    present = {name.lower() for name, _ in out}
    # None: libcurl removes the profile's default of that name.
    out += [(name, None) for name in FOLLOW_REQUEST if name.lower() not in present]
    return out


def translate(exc: Exception, request, proxy: str | None, opened: bool = True) -> Exception:
    """Scrapy's exception (or ours) for a curl_cffi failure. Scrapy's own (raised
    while it read the body) pass unchanged; anything else curl_cffi raised before
    the transfer started (an argument it refused) is a library error."""
    from curl_cffi import CurlError
    from curl_cffi.requests.exceptions import ImpersonateError as LibraryProfileError

    text = f"{request.url}: {exc}"
    if not isinstance(exc, CurlError):
        return exc if opened else errors.ImpersonateError(f"{text} ({type(exc).__name__})")
    code = int(getattr(exc, "code", 0) or 0)
    if isinstance(exc, LibraryProfileError):
        return errors.ImpersonateProfileError(text)
    if code in _TLS_CODES:
        return errors.ImpersonateTLSError(text)
    if code in (16, 92):
        return errors.ImpersonateHTTP2Error(text)
    if code == 28:
        return errors.DownloadTimeout(text)
    if proxy and (code in (5, 97) or (code in (7, 56) and "CONNECT tunnel" in str(exc))):
        return errors.ImpersonateTunnelError(text)
    if code == 6:
        return errors.CannotResolve(text)
    if code == 7:
        return errors.ConnectionRefused(text)
    if code == 18:
        return errors.DataLoss(text)
    if (code == 100 and not opened) or (code == 56 and "response headers" in str(exc)):
        # CURLE_TOO_LARGE before the body: too many headers or one too long
        return errors.HeadersTooLarge(text)
    if code == 1:
        return errors.UnsupportedScheme(text)
    if code in _LIBRARY_CODES or not code:
        return errors.ImpersonateError(text)
    return errors.ConnectionFailed(text)


def _text(value) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else "none"
