"""ProxyPoolMiddleware: every request through a proxy of a pool shared by all nodes.

The pool comes from ``PROXY_POOL`` (settings), ``PROXY_POOL_FILE`` (one URL a
line) and the Redis key ``{<spider>}:proxies`` (a set or a hash of URLs that
operators change while the crawl runs). ``http://`` and ``https://`` proxies,
with optional ``user:password``; SOCKS is refused (Scrapy cannot use it).
Entries are parsed strictly (:func:`crawlproject.proxies.parse_proxy`); a bad
one is logged (by fingerprint, never its text) and counted, never used. Proxies
from settings are the operator's; one from Redis must pass
``DOWNLOAD_ALLOWED_NETWORKS`` like a site (an IP refused here:
``proxy/invalid/address_refused``; a name when it is resolved, a failed proxy).

* **Choice** (in memory, :class:`~crawlproject.proxies.PoolView`): weighted
  random among proxies not retired and not banned for the request's host,
  favouring fast ones that succeed. ``meta["session"]`` keeps its proxy on
  every node (rendezvous hashing) and its cookie jar (``meta["cookiejar"]``).
  When every proxy is banned for the host, the request waits in the frontier
  until the first one is revived instead of hammering the site.
* **Bans** (:class:`~crawlproject.proxies.BanRules`): the proxy is banned for
  that host with an exponential, jittered backoff, and the request goes back
  to the frontier for another proxy, at most ``PROXY_BAN_MAX_TRIES`` times;
  then it is dead-lettered with reason ``banned``. A banned response never
  reaches the callback. A connection error counts as a failure, bans the proxy
  for the host the same way, and ``PROXY_RETIRE_AFTER`` of them in a row
  retire the proxy (``python -m crawlproject.cli proxies SPIDER``).
* **Shared state**: counters, latency, bans and retirements are sent to Redis
  and read back in one script call every ``PROXY_REFRESH_INTERVAL`` seconds,
  in the background (:mod:`crawlproject.proxies.store`); no Redis call per request.
* A 429 answered through a proxy bans that proxy for the host and is *not*
  passed on to :class:`~crawlproject.middlewares.slowdown.FrontierPolitenessMiddleware`:
  the site limits that exit address, not the crawl; when all proxies are
  banned the host waits anyway.

Sets ``meta["proxy"]`` (for Scrapy's HttpProxyMiddleware, 750),
``meta[PROXY_ID]`` (masked ``host:port``) and the transient
``meta[PROXY_CONTEXT]`` (for a browser context). Credentials are removed from
the request when it leaves the downloader, and never stored in the frontier
(:mod:`crawlproject.serialization` drops ``Proxy-Authorization``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from scrapy import Request, signals
from scrapy import exceptions as scrapy_exceptions
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import error as net_error
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

from crawlproject.backoff import backoff_delay
from crawlproject import acl
from crawlproject.connection import redis_from_settings, redis_params, redis_url_from_settings
from crawlproject.defaults import setting
from crawlproject.egress.policy import AddressPolicy, parse_address
from crawlproject.egress.resolver import policy_from_settings
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.middlewares.slowdown import retry_after_seconds
from crawlproject.identity.session import PROXY_CONTEXT, PROXY_ID, explicit_session
from crawlproject.proxies.pool import BanRules, Health, InvalidProxy, PoolView, Proxy, \
    entry_fingerprint, parse_proxy
from crawlproject.node import node_id
from crawlproject.proxies.store import HealthBatch, ProxyStateError, ProxyStore, Snapshot, \
    monotonic_deadline

logger = logging.getLogger(__name__)

#: Times a request was sent back for another proxy (stored: bounded across nodes).
BAN_TRIES = "proxy_ban_tries"
#: Errors that say the proxy (or the way to it) failed, not the site: Twisted's, and
#: the ones Scrapy >= 2.14 wraps them in (absent from older versions).
CONNECTION_ERRORS = (net_error.ConnectError, net_error.ConnectionLost, net_error.TimeoutError,
                     ResponseNeverReceived, ResponseFailed, TunnelError, ConnectionError,
                     *(getattr(scrapy_exceptions, name) for name in (
                         "DownloadConnectionRefusedError", "DownloadTimeoutError",
                         "DownloadFailedError", "CannotResolveHostError")
                       if hasattr(scrapy_exceptions, name)))
_SCRAPY_PROXY_META = ("proxy", "_auth_proxy", "_scheme_proxy")
#: Seconds between reads of the shared health hash (weights; O(pool) a read), and
#: six times that between "still in the pool" marks.
HEALTH_READ_PERIOD = 10.0


class ProxyPoolMiddleware:
    """Route requests through the shared proxy pool (see the module docstring)."""

    def __init__(self, crawler, *, static: list[Proxy], rules: BanRules, max_tries: int,
                 ban_base: float, ban_max: float, refresh_interval: float,
                 retire_after: int, latency_alpha: float, empty_max_wait: float = 300.0,
                 policy: AddressPolicy | None = None):
        self.crawler = crawler
        # Proxies from Redis are anyone's who can write it: an IP one must pass the
        # address policy like a site (a name is checked when it is resolved).
        self.policy = policy or AddressPolicy()
        self.stats = crawler.stats
        self.static = {p.id: p for p in static}
        self.rules = rules
        self.max_tries, self.ban_base, self.ban_max = max_tries, ban_base, ban_max
        self.refresh_interval = refresh_interval
        self.retire_after, self.latency_alpha = retire_after, latency_alpha
        self.view = PoolView()
        self.view.update(dict(self.static), {}, {}, {})
        self.batch = HealthBatch()
        self.store: ProxyStore | None = None
        self._parsed: dict[bytes, Proxy | None] = {}
        self._known_retired: set[str] = set()
        self._moved: dict[str, str] = {}
        self._logged: set = set()
        self._task: asyncio.Task | None = None
        self._closing: asyncio.Event | None = None
        # None: not logged yet (the first one at once, however recently the
        # machine booted: time.monotonic() counts from boot)
        self._last_wait_log: float | None = None
        self._refresh_failed = False
        self.empty_max_wait = empty_max_wait
        self.forget_after = max(3600.0, ban_max * 2)
        self._ban_version = 0          # the last ban change this node has read
        self._calls = 0
        self._last_forget = time.monotonic()
        # no usable proxy since (monotonic, Redis ms), and why; None: there is one
        self._empty_since: tuple[float, int] | None = None
        self._last_empty_log: float | None = None   # None: not logged in this state yet
        self._pool_problem = ""

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not setting(s, "PROXY_POOL_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        mw = cls(crawler, static=_static_pool(s, crawler.stats), rules=BanRules.from_settings(s),
                 max_tries=max(1, setting(s, "PROXY_BAN_MAX_TRIES")),
                 ban_base=setting(s, "PROXY_BAN_BACKOFF_BASE"),
                 ban_max=setting(s, "PROXY_BAN_BACKOFF_MAX"),
                 refresh_interval=setting(s, "PROXY_REFRESH_INTERVAL"),
                 retire_after=setting(s, "PROXY_RETIRE_AFTER"),
                 latency_alpha=setting(s, "PROXY_LATENCY_EWMA"),
                 empty_max_wait=setting(s, "PROXY_POOL_EMPTY_MAX_WAIT"),
                 policy=policy_from_settings(s))
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # -- background refresh ------------------------------------------------------
    def spider_opened(self, spider):
        """Start the refresh loop (one Redis call per interval)."""
        self.store = ProxyStore(redis_from_settings(self.crawler.settings, asyncio=True),
                                spider.name, retire_after=self.retire_after,
                                latency_alpha=self.latency_alpha,
                                forget_after=self.forget_after, node=node_id(self.crawler))
        self._redis_user = acl.redis_user(redis_url_from_settings(self.crawler.settings),
                                          redis_params(self.crawler.settings))
        self._closing = asyncio.Event()
        self._task = asyncio.ensure_future(self._loop())
        logger.info("Proxy pool: %d proxies from settings/file, more from %s (refreshed every "
                    "%gs)", len(self.static), self.store.keys.pool, self.refresh_interval,
                    extra={"spider": spider})

    async def spider_closed(self, spider) -> None:
        """Stop the loop and send this node's last events."""
        if self._task is None:
            return
        self._closing.set()
        await self._task
        self._empty_since = None  # a closed node no longer waits for a proxy
        await self.refresh()  # the last events of this node
        await self.store.client.aclose()

    async def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                await self.refresh()
                self._report_empty(time.monotonic())
            except Exception:  # one bad run never stops the refreshes
                self.stats.inc_value("proxy/refresh_errors")
                logger.exception("Proxy pool refresh failed; retrying in %gs",
                                 self.refresh_interval, extra={"spider": self.crawler.spider})
            try:
                await asyncio.wait_for(self._closing.wait(), self.refresh_interval)
            except asyncio.TimeoutError:
                pass

    async def refresh(self) -> None:
        """Send this node's events, read the shared state back; never raises."""
        batch, self.batch = self.batch, HealthBatch()
        self._calls += 1
        # "still in the pool" and the health hash cost O(pool): every few calls only
        every = max(1, round(HEALTH_READ_PERIOD / max(self.refresh_interval, 0.001)))
        with_health = every == 1 or self._calls % every == 1  # the first call reads it
        if self._calls % max(1, every * 6) == 1:
            for pid in self.view.proxies:
                batch.seen(pid)
        empty_ms = self._empty_since[1] if self._empty_since else None
        try:
            snapshot = await self.store.refresh(batch, since=self._ban_version,
                                                empty_since_ms=empty_ms,
                                                with_health=with_health)
        except ProxyStateError as exc:  # not transient: say so, and count as no Redis pool
            self.batch.merge(batch)
            self.stats.inc_value("proxy/refresh_errors")
            self._once(f"state:{exc}", "Proxy pool: %s", exc)
            self._pool_problem = str(exc)
            self._check_usable(int(time.time() * 1000))
            return
        except Exception as exc:  # Redis away: keep the events and the last view
            self.batch.merge(batch)
            self.stats.inc_value("proxy/refresh_errors")
            if acl.refusal(exc):  # an ACL refused a command: named (and counted) as such
                self.stats.inc_value("redis/noperm")
            if not self._refresh_failed:
                logger.warning("Proxy pool state not refreshed (%s); using the last one",
                               acl.describe(exc, self._redis_user),
                               extra={"spider": self.crawler.spider})
            self._refresh_failed = True
            return
        self._refresh_failed = False
        self.apply(snapshot)

    def apply(self, snap: Snapshot) -> None:
        """Take *snap* into the node's view: pool, health and retirements
        replaced, bans changed one by one (plus bans recorded since the flush)."""
        now = time.monotonic()
        self._warn_bad(snap.bad)
        self._pool_problem = ""
        proxies = dict(self.static)
        proxies.update(self._redis_pool(snap))
        health = self.view.health if snap.health is None else {
            pid: Health(ok=int(h.get("ok", 0)), failures=int(h.get("fail", 0)),
                        bans=int(h.get("ban", 0)), latency_ms=h.get("lat"),
                        consecutive_failures=int(h.get("consec", 0)))
            for pid, h in snap.health.items()}
        retired = {pid: str(r.get("reason", "")) for pid, r in snap.retired.items()}
        if snap.full:
            self.view.bans = {}
        for (pid, domain), ban in snap.bans.items():
            if ban is None:
                self.view.unban(pid, domain)
            else:
                self.view.ban(pid, domain, monotonic_deadline(ban[0], snap.now_ms, now), ban[1])
        self._ban_version = snap.ban_version
        for pid, domain, delay_ms, strikes in self.batch.bans:  # not flushed yet
            self.view.ban(pid, domain, now + delay_ms / 1000, strikes)
        if now - self._last_forget > 60:  # as Redis does (its REFRESH forgets them)
            self._last_forget = now
            self.view.forget(now - self.forget_after)
        self.view.update(proxies, health, retired)
        self._log_retired(retired, proxies)
        self.stats.set_value("proxy/pool_size", len(proxies))
        self.stats.set_value("proxy/retired", len(set(retired) & set(proxies)))
        self._check_usable(snap.now_ms)

    def _warn_bad(self, bad: list[tuple[str, str, str]]) -> None:
        """One WARNING and one count per bad stored value (left out, never used)."""
        for key, name, reason in bad:
            if ("bad", key, name) in self._logged or len(self._logged) > 10_000:
                continue  # bounded: stored garbage must not grow the node's memory
            self._logged.add(("bad", key, name))
            self.stats.inc_value("proxy/bad_state")
            logger.warning("Proxy pool: ignored %s field %r (%s); counted in proxy/bad_state",
                           key, name[:200], reason, extra={"spider": self.crawler.spider})

    def _check_usable(self, now_ms: int) -> None:
        """Start or end the "no usable proxy" state (checked at each refresh)."""
        if self.view.usable:
            if self._empty_since is not None:
                logger.warning("Proxy pool usable again (%d proxies) after %.0fs without one",
                               self.view.usable, time.monotonic() - self._empty_since[0],
                               extra={"spider": self.crawler.spider})
            self._empty_since = None
        elif self._empty_since is None:
            self._empty_since = (time.monotonic(), now_ms)
            self._last_empty_log = None
        self.stats.set_value("proxy/usable", self.view.usable)

    def _report_empty(self, now: float) -> None:
        """WARNING each minute while no proxy is usable."""
        if self._empty_since is None or (self._last_empty_log is not None
                                         and now - self._last_empty_log < 60):
            return
        self._last_empty_log = now
        waited = now - self._empty_since[0]
        logger.warning(
            "No usable proxy for %.0fs (pool of %d, %d retired%s): requests wait, then are "
            "dead-lettered as 'no_proxy' after PROXY_POOL_EMPTY_MAX_WAIT=%gs (%d so far); add "
            "proxies to %s or revive retired ones (crawlctl proxies %s --revive HOST:PORT)",
            waited, len(self.view.proxies), len(self.view.retired),
            f"; {self._pool_problem}" if self._pool_problem else "", self.empty_max_wait,
            self.stats.get_value("proxy/dead/no_proxy", 0), self.store.keys.pool,
            self.crawler.spider.name, extra={"spider": self.crawler.spider})

    def _redis_pool(self, snap: Snapshot) -> dict[str, Proxy]:
        if snap.pool_type not in ("set", "hash", "none"):
            self._pool_problem = (f"Redis key {self.store.keys.pool} is a {snap.pool_type}, "
                                  "expected a set or a hash of proxy URLs")
            self._once(f"type:{snap.pool_type}", "Proxy pool: %s; its entries are ignored",
                       self._pool_problem)
            return {}
        out = {}
        for raw in snap.entries:
            if raw not in self._parsed:
                self._parsed[raw] = self._parse(raw, f"{self.store.keys.pool} entry "
                                                     f"{entry_fingerprint(raw)}")
            if self._parsed[raw] is not None:
                out[self._parsed[raw].id] = self._parsed[raw]
        return out

    def _parse(self, raw, where: str) -> Proxy | None:
        try:
            proxy = parse_proxy(raw)
            ip = parse_address(proxy.host)
            refusal = self.policy.check(ip) if ip is not None else None
            if refusal is not None:
                raise InvalidProxy("address_refused", refusal.reason)
            return proxy
        except InvalidProxy as exc:
            _refuse(self.stats, where, exc)
            return None

    def _log_retired(self, retired: dict[str, str], proxies: dict[str, Proxy]) -> None:
        for pid in set(retired) - self._known_retired:
            if pid in proxies:
                logger.warning("Proxy %s retired: %s", pid, retired[pid],
                               extra={"spider": self.crawler.spider})
        self._known_retired = set(retired)

    def _once(self, key, msg: str, *args) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.error(msg, *args, extra={"spider": self.crawler.spider})

    # -- downloader middleware ---------------------------------------------------
    def process_request(self, request: Request, spider=None):
        _strip_auth(request)
        domain = urlparse_cached(request).hostname or ""
        now = time.monotonic()
        session = explicit_session(request)
        if session is not None:
            request.meta.setdefault("cookiejar", session)
            proxy = self._sticky(session, domain, now)
        else:
            proxy = self.view.choose(domain, now)
        if proxy is None:
            return self._wait(request, domain, now)
        request.meta["proxy"] = proxy.url
        request.meta[PROXY_ID] = proxy.id
        request.meta[PROXY_CONTEXT] = proxy.context()
        self.stats.inc_value("proxy/requests")
        return None

    def _sticky(self, session: str, domain: str, now: float) -> Proxy | None:
        proxy, home = self.view.sticky(session, domain, now)
        if proxy is not None and home is not None and proxy.id != home.id \
                and self._moved.get(session) != proxy.id:
            if len(self._moved) > 10_000:
                self._moved.clear()
            self._moved[session] = proxy.id
            self.stats.inc_value("proxy/sessions_moved")
            logger.info("Session %r moved from proxy %s to %s for %s (banned there)",
                        session[:100], home.id, proxy.id, domain,
                        extra={"spider": self.crawler.spider})
        return proxy

    def _wait(self, request: Request, domain: str, now: float) -> Request:
        """No usable proxy for *domain*: back to the frontier until one is revived,
        or dead-lettered as ``no_proxy`` once the pool has had no usable proxy
        for ``PROXY_POOL_EMPTY_MAX_WAIT`` seconds."""
        if self._empty_since is not None and now - self._empty_since[0] >= self.empty_max_wait:
            self._dead_letter(_clean(request), "no_proxy")
            if not self.stats.get_value("proxy/dead/no_proxy", 0) > 1:  # the rest: each minute
                logger.error("Gave up on %s: no usable proxy for %.0fs (dead-lettered as "
                             "'no_proxy', like every request while it lasts)", request.url,
                             now - self._empty_since[0], extra={"spider": self.crawler.spider})
            raise IgnoreRequest("no_proxy")
        wait = self.view.next_unban(domain, now)
        wait = min(self.ban_max, max(1.0, wait if wait is not None else 2 * self.refresh_interval))
        self.stats.inc_value("proxy/waits")
        if self._last_wait_log is None or now - self._last_wait_log > 30:
            self._last_wait_log = now
            logger.warning("No usable proxy for %s (pool of %d, %d retired): requests wait "
                           "%.1fs in the frontier (counted in proxy/waits)", domain,
                           len(self.view.proxies), len(self.view.retired), wait,
                           extra={"spider": self.crawler.spider})
        retry = _clean(request.replace(dont_filter=True))
        retry.meta[RETRY_DELAY_META] = wait
        return retry

    def process_response(self, request: Request, response, spider=None):
        proxy_id = request.meta.get(PROXY_ID)
        _strip_auth(request)
        if proxy_id is None or request.meta.get("proxy") is None:
            return response
        domain = urlparse_cached(request).hostname or ""
        location = response.headers.get(b"Location")
        reason = self.rules.classify(response.status, response.body,
                                     location.decode("latin-1") if location else None,
                                     response.url if request.meta.get("redirect_urls") else "")
        if reason is None:
            self.batch.success(proxy_id, request.meta.get("download_latency"))
            if self.view.strikes(proxy_id, domain):
                self.batch.clear(proxy_id, domain)
            self.stats.inc_value("proxy/responses")
            return response
        retry_after = retry_after_seconds(response.headers.get(b"Retry-After"))
        self._ban(proxy_id, domain, reason, retry_after)
        return self._reroute(request, "banned", dead_letter=True)

    def process_exception(self, request: Request, exception, spider=None):
        proxy_id = request.meta.get(PROXY_ID)
        _strip_auth(request)
        if proxy_id is None or not isinstance(exception, CONNECTION_ERRORS):
            return None
        self.batch.failure(proxy_id, type(exception).__name__)
        self.stats.inc_value("proxy/failures")
        self._ban(proxy_id, urlparse_cached(request).hostname or "", "connection", None)
        return self._reroute(request, "proxy_failed", dead_letter=False)

    def _ban(self, proxy_id: str, domain: str, reason: str, retry_after: float | None) -> None:
        strikes = self.view.strikes(proxy_id, domain) + 1
        delay = backoff_delay(strikes, self.ban_base, self.ban_max)
        if retry_after is not None:
            delay = min(self.ban_max, max(delay, retry_after))
        self.view.ban(proxy_id, domain, time.monotonic() + delay, strikes)
        self.batch.ban(proxy_id, domain, delay, strikes)
        self.stats.inc_value("proxy/bans")
        self.stats.inc_value(f"proxy/bans/{reason}")
        logger.info("Proxy %s banned for %s (%s, strike %d): not used there for %.0fs",
                    proxy_id, domain, reason, strikes, delay,
                    extra={"spider": self.crawler.spider})

    def _reroute(self, request: Request, why: str, dead_letter: bool):
        """Send *request* back to the frontier for another proxy, or give up."""
        tries = int(request.meta.get(BAN_TRIES, 0) or 0) + 1
        if tries < self.max_tries:
            retry = _clean(request.replace(dont_filter=True))
            retry.meta[BAN_TRIES] = tries
            self.stats.inc_value("proxy/rerouted")
            return retry
        _clean(request)
        if not dead_letter:  # connection errors: Scrapy's retries and dead letters take over
            return None
        self._dead_letter(request, "banned")
        logger.error("Gave up on %s: banned through %d proxies in a row (dead-lettered as "
                     "'banned')", request.url, tries, extra={"spider": self.crawler.spider})
        raise IgnoreRequest("banned")


    def _dead_letter(self, request: Request, reason: str) -> None:
        self.stats.inc_value(f"proxy/dead/{reason}")
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        mark_failed = getattr(scheduler, "mark_failed", None)
        if mark_failed is not None:
            mark_failed(request, reason, kind="download")


def _static_pool(settings, stats) -> list[Proxy]:
    """Proxies from ``PROXY_POOL`` and ``PROXY_POOL_FILE`` (bad entries skipped)."""
    entries = [(f"PROXY_POOL[{i}]", e) for i, e in enumerate(setting(settings, "PROXY_POOL"))]
    path = setting(settings, "PROXY_POOL_FILE")
    if path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"PROXY_POOL_FILE {path}: cannot be read: "
                             f"{type(exc).__name__}") from None
        entries += [(f"{path}:{n}", line) for n, line in enumerate(lines, 1)
                    if line.strip() and not line.lstrip().startswith("#")]
    out = []
    for where, entry in entries:
        try:
            out.append(parse_proxy(entry))
        except InvalidProxy as exc:
            _refuse(stats, where, exc)
    return out


def _refuse(stats, where: str, exc: InvalidProxy) -> None:
    stats.inc_value(f"proxy/invalid/{exc.code}")
    logger.error("Proxy %s refused: %s", where, exc)


def _strip_auth(request: Request) -> None:
    """Forget the proxy credentials a request carries (Scrapy moved them to a
    header; the browser context dict holds them too)."""
    request.headers.pop(b"Proxy-Authorization", None)
    request.meta.pop(PROXY_CONTEXT, None)


def _clean(request: Request) -> Request:
    """*request* without any trace of its proxy (a fresh choice comes next)."""
    _strip_auth(request)
    for key in (*_SCRAPY_PROXY_META, PROXY_ID, "download_latency"):
        request.meta.pop(key, None)
    return request
