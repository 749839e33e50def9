"""The live crawl dashboard (``crawlctl dashboard``): a small aiohttp app.

Routes::

    GET  /                                   the spiders (one spider: its page)
    GET  /spider/{spider}                    the dashboard of one spider (server-rendered)
    GET  /api/spiders/{spider}/status        ``crawlctl status --json`` + ``proxies``, ``redis``
    GET  /api/spiders/{spider}/events        server-sent events: an ``update`` per read
    POST /api/spiders/{spider}/actions/{a}   pause | resume | drain | replay
    GET|POST /login, POST /logout            token sign-in (token mode only)
    GET  /static/...                         CSS, script, the vendored uPlot

The data is what ``crawlctl status --json`` reads (:mod:`crawlproject.dashboard.feed`);
the actions run the command line's own functions (:func:`crawlproject.ops.actions.control_command`,
:func:`crawlproject.ops.actions.replay_dead_letters`). Only the spiders the dashboard was
started for exist here: a spider name in a URL is never used as a Redis key
otherwise.

Safety, whatever the bind address (:mod:`crawlproject.dashboard.server` decides
whether credentials are required):

* with credentials configured every route but ``/login`` and ``/static/`` needs
  them (:mod:`crawlproject.dashboard.auth`); wrong or missing: 401;
* a POST needs the ``X-CSRF-Token`` header holding this process' random token
  (in the page's ``<meta name="csrf-token">``), which another site cannot read or
  send, and an ``Origin``, if sent, equal to the dashboard's own;
* without credentials (loopback only) the ``Host`` header must name a loopback
  host, so a DNS-rebinding page cannot read the dashboard either;
* a Content-Security-Policy that allows scripts and styles from ``/static/`` only;
* the Redis URL is shown with :func:`crawlproject.connection.redact_url`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from aiohttp import web

from crawlproject.dashboard import render
from crawlproject.dashboard.auth import COOKIE, Credentials, SignInLimiter
from crawlproject.dashboard.feed import SpiderFeed, read_snapshot, run_sampler
from crawlproject.dashboard.stored import StoredItems
from crawlproject.urls import is_loopback_host

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
REPLAY_MAX = 1000  # dead letters requeued per partition and click (as `crawlctl replay`)
SIGNIN_LIMIT, SIGNIN_WINDOW = 10, 60.0   # wrong tokens a client may send per window (s)


@dataclass
class DashboardConfig:
    """What one dashboard serves: spiders, where their state is, how often to read it."""

    spiders: list[str]
    redis_url: str
    cluster: bool = False
    credentials: Credentials = field(default_factory=Credentials)
    interval: float = 2.0
    window: float = 600.0


def create_app(config: DashboardConfig, client=None) -> web.Application:
    """The aiohttp application (*client*: a sync Redis client, else one from the URL)."""
    from crawlproject.ops.common import project_spider, seed_keys_of
    from crawlproject.connection import redact_url, redis_from_url

    client = client if client is not None else redis_from_url(config.redis_url,
                                                              cluster=config.cluster)
    where = redact_url(config.redis_url)

    def redact(text: str) -> str:
        return text.replace(config.redis_url, where)

    feeds = {}
    for spider in config.spiders:
        settings, spidercls = project_spider(spider)
        seeds = seed_keys_of(spider, settings, spidercls)
        stored = StoredItems(settings, spider)
        feeds[spider] = SpiderFeed(
            spider, lambda s=spider, k=seeds, m=stored: read_snapshot(client, s, k, m),
            config.interval, config.window, redact)
    app = web.Application(middlewares=[_headers, _guard], client_max_size=64 * 1024)
    app["config"], app["client"], app["feeds"], app["where"] = config, client, feeds, where
    app["csrf"] = secrets.token_urlsafe(32)
    app["signins"] = SignInLimiter(SIGNIN_LIMIT, SIGNIN_WINDOW)
    app.router.add_get("/", index)
    app.router.add_get("/spider/{spider}", spider_page)
    app.router.add_get("/api/spiders/{spider}/status", status)
    app.router.add_get("/api/spiders/{spider}/events", events)
    app.router.add_post("/api/spiders/{spider}/actions/{action}", action)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    app["streams"] = set()
    app.on_startup.append(_start_sampler)
    app.on_shutdown.append(_end_streams)
    app.on_cleanup.append(_stop_sampler)
    return app


# -- middlewares ----------------------------------------------------------------------
@web.middleware
async def _headers(request, handler):
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _secure(exc.headers, request.path)
        raise
    if not response.prepared:   # (an event stream sent its headers already)
        _secure(response.headers, request.path)
    return response


def _secure(headers, path: str) -> None:
    headers.setdefault("Content-Security-Policy", CSP)
    headers.setdefault("X-Content-Type-Options", "nosniff")
    # "same-origin": with "no-referrer" a browser sends "Origin: null" on our own POSTs
    headers.setdefault("Referrer-Policy", "same-origin")
    headers.setdefault("X-Frame-Options", "DENY")
    if not path.startswith("/static/"):
        headers.setdefault("Cache-Control", "no-store")


@web.middleware
async def _guard(request, handler):
    config: DashboardConfig = request.app["config"]
    creds = config.credentials
    if not creds.configured and not _loopback_host(request):
        # Only a loopback name reaches an open dashboard (no DNS rebinding).
        raise web.HTTPMisdirectedRequest(text="this dashboard answers loopback names only\n")
    if request.method == "POST" and not _same_origin(request):
        raise web.HTTPForbidden(text="cross-origin request refused\n")
    public = request.path.startswith("/static/") or request.path == "/login"
    if creds.configured and not public:
        limiter: SignInLimiter = request.app["signins"]
        presented = _presented(request)
        wait = limiter.retry_after(request.remote)
        if wait:   # every credential check counts: Basic, Bearer and cookie as the form
            if presented:
                limiter.failed(request.remote, refused=True)
                _report_signins(limiter)
            raise _too_many(request, wait)
        user = _user(request, creds)
        if user is None:
            if presented:   # (none at all: a browser's first request, not a guess)
                limiter.failed(request.remote)
                _report_signins(limiter)
            raise _unauthorized(request, creds)
        limiter.succeeded(request.remote)
        request["user"] = user
    if request.method == "POST" and request.path.startswith("/api/") and not hmac.compare_digest(
            request.headers.get("X-CSRF-Token", "").encode(), request.app["csrf"].encode()):
        raise web.HTTPForbidden(text="missing or wrong X-CSRF-Token header\n")
    return await handler(request)


def _user(request, creds: Credentials) -> str | None:
    user = creds.check_authorization(request.headers.get("Authorization"))
    if user is None and creds.check_cookie(request.cookies.get(COOKIE)):
        user = "token"
    return user


def _presented(request) -> bool:
    return bool(request.headers.get("Authorization") or request.cookies.get(COOKIE))


def _too_many(request, wait: int) -> web.HTTPException:
    headers = {"Retry-After": str(wait)}
    if "text/html" in request.headers.get("Accept", "") and request.method == "GET":
        return web.HTTPTooManyRequests(
            text=render.login_page(f"Too many wrong credentials: try again in {wait} s."),
            content_type="text/html", headers=headers)
    return web.HTTPTooManyRequests(text='{"error": "too many wrong credentials", '
                                   f'"retry_after": {wait}}}', content_type="application/json",
                                   headers=headers)


def _unauthorized(request, creds: Credentials) -> web.HTTPException:
    headers = {"WWW-Authenticate": 'Basic realm="crawlctl dashboard", charset="UTF-8"'} \
        if creds.password else {}
    if creds.token and "text/html" in request.headers.get("Accept", "") \
            and request.method == "GET":
        return web.HTTPUnauthorized(text=render.login_page(), content_type="text/html",
                                    headers=headers)
    return web.HTTPUnauthorized(text='{"error": "unauthorized"}', content_type="application/json",
                                headers=headers)


def _loopback_host(request) -> bool:
    try:
        name = urlsplit(f"//{request.host or ''}").hostname or ""
    except ValueError:
        return False
    return is_loopback_host(name)


def _same_origin(request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True   # not a browser's cross-site form or fetch (they send Origin on POST)
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and \
        parts.netloc.lower() == (request.host or "").lower()


# -- handlers -------------------------------------------------------------------------
def _feed(request) -> SpiderFeed:
    feed = request.app["feeds"].get(request.match_info["spider"])
    if feed is None:
        raise web.HTTPNotFound(text="no such spider on this dashboard\n")
    return feed


async def index(request):
    spiders = request.app["config"].spiders
    if len(spiders) == 1:
        raise web.HTTPFound(f"/spider/{quote(spiders[0], safe='')}")
    return web.Response(text=render.index_page(spiders, request.app["where"]),
                        content_type="text/html")


async def spider_page(request):
    feed = await _feed(request).current()
    config = request.app["config"]
    page = render.spider_page(feed, config.spiders, request.app["csrf"], request.app["where"],
                              config.window, request.get("user"))
    return web.Response(text=page, content_type="text/html")


async def status(request):
    feed = await _feed(request).current()
    if feed.latest is None:
        return web.json_response({"error": feed.error, "redis": request.app["where"]}, status=503)
    return web.json_response({**feed.latest, "error": feed.error, "redis": request.app["where"]},
                             dumps=lambda d: json.dumps(d, sort_keys=True))


async def events(request):
    """Server-sent events: ``update`` with ``version``, ``sample``, ``html`` after
    every read; ``html`` holds only the fragments that changed since this stream's
    last event (all of them in the first), and none at all when nothing changed
    but the sample. The browser's EventSource reconnects by itself (a new stream
    starts again with every fragment)."""
    feed = _feed(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    streams = request.app["streams"]
    streams.add(asyncio.current_task())   # cancelled at shutdown: no wait for the client
    version, sent = -1, {}
    try:
        await response.write(b"retry: 3000\n\n")
        while True:
            await feed.current()
            if feed.version != version:
                version = feed.version
                html = {name: fragment for name, fragment in render.fragments(feed).items()
                        if sent.get(name) != fragment}
                sent.update(html)
                payload = {"version": version, "error": feed.error,
                           "sample": feed.samples[-1] if feed.samples and not feed.error else None,
                           "html": html}
                await response.write(f"event: update\ndata: {json.dumps(payload)}\n\n".encode())
            await feed.wait_newer(version, timeout=feed.interval * 2)
    except ConnectionResetError:   # the browser went away
        pass
    finally:
        streams.discard(asyncio.current_task())
    return response


async def action(request):
    """Run one operator action through the command line's own code."""
    from crawlproject.ops.actions import control_command, replay_dead_letters
    from crawlproject.ops.common import frontier_partitions
    from crawlproject.control import ControlKeyError

    feed = _feed(request)
    name = request.match_info["action"]
    if name not in render.ACTIONS:
        raise web.HTTPNotFound(text="no such action\n")
    client = request.app["client"]
    who = f"dashboard:{request.get('user') or 'local'}@{socket.gethostname()}"
    if name == "replay":
        count = await asyncio.to_thread(
            lambda: replay_dead_letters(frontier_partitions(client, feed.spider), REPLAY_MAX))
        result = {"replayed": count, "message": f"{feed.spider}: requeued {count} dead letter(s)"}
    else:
        try:
            previous, state = await asyncio.to_thread(control_command, client, feed.spider,
                                                      name, who)
        except ControlKeyError as exc:   # a key of the wrong type: the CLI's --force fixes it
            return web.json_response({"spider": feed.spider, "action": name,
                                      "message": str(exc)}, status=409)
        result = {"previous": previous, "state": state,
                  "message": f"{feed.spider}: {previous} -> {state} (nodes follow within about "
                             "a second)"}
    logger.info("Dashboard action %s on %s by %s: %s", name, feed.spider, who, result["message"])
    await feed.refresh()
    return web.json_response({"spider": feed.spider, "action": name, **result})


async def login_form(request):
    if not request.app["config"].credentials.token:
        raise web.HTTPNotFound(text="no token sign-in on this dashboard\n")
    return web.Response(text=render.login_page(), content_type="text/html")


async def login(request):
    creds: Credentials = request.app["config"].credentials
    if not creds.token:
        raise web.HTTPNotFound(text="no token sign-in on this dashboard\n")
    limiter: SignInLimiter = request.app["signins"]
    client = request.remote
    wait = limiter.retry_after(client)
    if wait:
        limiter.failed(client, refused=True)
        _report_signins(limiter)
        return web.Response(text=render.login_page(f"Too many wrong tokens: try again in "
                                                   f"{wait} s."), status=429,
                            headers={"Retry-After": str(wait)}, content_type="text/html")
    form = await request.post()
    if not creds.check_token(str(form.get("token", ""))):
        limiter.failed(client)
        _report_signins(limiter)
        return web.Response(text=render.login_page("Wrong token."), status=401,
                            content_type="text/html")
    limiter.succeeded(client)
    response = web.HTTPSeeOther("/")
    response.set_cookie(COOKIE, creds.cookie_value(), httponly=True, samesite="Strict",
                        secure=request.secure, path="/")
    raise response


def _report_signins(limiter: SignInLimiter) -> None:
    """One WARNING per client and window with its count of failed sign-ins;
    counts still open are reported when the window has passed; one for a lock
    of every client."""
    for client, count in limiter.due_reports():
        logger.warning("Dashboard sign-in with a wrong token or password from %s: %d attempt(s) "
                       "failed or refused since the last report (one report per %.0f s; after "
                       "%d wrong credentials in that time: 429)", client, count, limiter.window,
                       limiter.limit)
    until = limiter.global_until()
    if until is not None and (limiter.global_reported_at is None
                              or limiter.clock() - limiter.global_reported_at >= limiter.window):
        limiter.global_reported_at = limiter.clock()
        logger.warning("Dashboard: %d wrong credentials from all clients within %.0f s: every "
                       "client but those signed in before gets 429 for %.0f s (guessing from "
                       "many addresses)", limiter.global_limit, limiter.window,
                       until - limiter.clock())
    if limiter.pending and limiter.timer is None:
        def again():
            limiter.timer = None
            _report_signins(limiter)
        limiter.timer = asyncio.get_running_loop().call_later(limiter.window, again)


async def logout(request):
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


async def _start_sampler(app):
    app["sampler"] = asyncio.ensure_future(run_sampler(app["feeds"], app["config"].interval))


async def _end_streams(app):
    for task in list(app["streams"]):
        task.cancel()


async def _stop_sampler(app):
    app["sampler"].cancel()
    try:
        await app["sampler"]
    except asyncio.CancelledError:
        pass
    app["client"].close()
