"""A multi-host demo site: one small site per loopback address, all in one process.

Used to prove per-host politeness (request rate, requests in flight, ``Retry-After``
blocks) across crawler nodes. Every address is a distinct host for Scrapy and for
the frontier; on Linux any ``127.0.0.x`` works without setup.

Pages of each host (``text/html; charset=utf-8``), a pure function of the host,
its page count and ``per_page``:

``/`` and ``/list/N``
    Listing page N (``/`` is page 1): ``per_page`` links ``<a class="page"
    href="/p/I">`` and ``<a class="next" rel="next" href="/list/N+1">``.
``/p/N``
    ``<h1 class="title">`` and three ``<a class="link" href="/p/M">`` links to
    pages of the same host (the first and last are the same link, on purpose),
    plus ``<a class="home" href="/">``.
``/robots.txt``
    Allows everything; with ``--host-crawl-delay HOST=S`` it also asks for
    ``Crawl-delay: S``. Anything else answers 404.

Faults a host can be started with (both answers are recorded like any other):

*transient 503s* (``--fail-every N``, per host ``--host-fail-every HOST=N``)
    page ``/p/M`` with ``M % N == 0`` answers 503 without ``Retry-After`` the
    first time it is requested (since the last reset), 200 afterwards: every
    N-th page fails once, the same pages in every run;
*429 under load* (``--host-overload HOST=K,S``)
    a request that arrives while K requests to HOST are already being answered
    gets 429 with ``Retry-After: S`` at once (no latency; it is not counted as
    in flight).

Every request is recorded as a :class:`Hit`: host (the local address it arrived
on), path, status, arrival time and completion time, both from
``time.monotonic()`` in the site process (CLOCK_MONOTONIC on Linux: the same
clock as the test process' ``time.monotonic()``; :meth:`MultiHostSite.now` reads
it anyway). Latency (``--latency-ms``, per host ``--host-latency``) is added with
``reactor.callLater``, never blocking. A host can be *throttled* at run time: it
answers 429 or 503, with ``Retry-After``, to its next K requests and/or for S
seconds. With ``--record-headers`` each request also keeps the client's address
and the request headers of :data:`RECORDED_HEADERS` (read as :class:`Seen`
records): what identity and Referer tests compare.

A separate control listener on 127.0.0.1 (its own port, so control traffic never
counts against a crawled host) serves JSON: ``GET /requests?since=N&epoch=E``,
``GET /now``, ``POST /reset``, ``POST /throttle?host=&status=&retry_after=&count=&seconds=``,
``POST /unthrottle[?host=]``.

Command line::

    python -m devtools.demo.hosts --hosts 127.0.0.2,127.0.0.3 --pages 100 \\
        [--host-pages 127.0.0.2=2000] [--per-page 50] [--latency-ms 0] \\
        [--host-latency 127.0.0.3=200] [--record-headers] [--fail-every 50] \\
        [--host-fail-every 127.0.0.2=10] [--host-overload 127.0.0.3=2,5]

prints one line ``HOSTS_SITE={"control": URL, "hosts": {host: URL}}`` and serves
until SIGTERM/SIGINT (or stdin EOF with ``--exit-on-stdin-eof``). All hosts share
one port when one is free on every address; otherwise each gets its own.

Python API: :class:`MultiHostSite` (subprocess, context manager), :class:`Hit`,
:class:`Seen`, and the pure :func:`expected_paths`, :func:`max_in_window`, :func:`max_overlap`.

Size (over 600 lines): the multi-host site with its request log and the
waits tests use on it; development only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Sequence

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from devtools.demo.site import (
    NOT_FOUND, ROBOTS_TXT, Page, QuietSite, _html, _install_stop_triggers, _layout, _mix,
    _non_negative, _positive,
)

DEFAULT_HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 12))
DEFAULT_PAGES = 100
PER_PAGE = 50
BLOCK_STATUSES = (429, 503)
LINE_PREFIX = "HOSTS_SITE="
_SAME_PORT_ATTEMPTS = 20
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: Request headers kept with ``--record-headers`` (lower case).
RECORDED_HEADERS = ("user-agent", "accept", "accept-language", "accept-encoding", "sec-ch-ua",
                    "sec-ch-ua-mobile", "sec-ch-ua-platform", "referer")


# --------------------------------------------------------------------------- content


def listing_count(pages: int, per_page: int = PER_PAGE) -> int:
    """Number of listing pages of a host with *pages* pages (at least 1)."""
    return max(1, math.ceil(pages / per_page))


def listing_path(n: int) -> str:
    """Path of listing page *n* (1-based)."""
    return "/" if n == 1 else f"/list/{n}"


def expected_paths(pages: int, per_page: int = PER_PAGE) -> set[str]:
    """Every path a complete crawl of one host fetches: its listings and pages."""
    listings = {listing_path(n) for n in range(1, listing_count(pages, per_page) + 1)}
    return listings | {f"/p/{n}" for n in range(1, pages + 1)}


def page_links(host: str, n: int, pages: int) -> list[int]:
    """The pages ``/p/n`` of *host* links to: next, one pseudo-random, next again."""
    following = n % pages + 1
    other = 1 + _mix(zlib.crc32(host.encode()), n) % pages
    return [following, other, following]


def render_listing(host: str, n: int, pages: int, per_page: int) -> str | None:
    """HTML of listing page *n*, or ``None`` if there is no such page."""
    count = listing_count(pages, per_page)
    if not 1 <= n <= count:
        return None
    first = (n - 1) * per_page + 1
    items = "\n".join(f'<li><a class="page" href="/p/{i}">Page {i}</a></li>'
                      for i in range(first, min(first + per_page, pages + 1)))
    nav = f'<a class="next" rel="next" href="/list/{n + 1}">Next</a>' if n < count else ""
    body = f"<h1>{host} - listing {n} of {count}</h1>\n<ul>\n{items}\n</ul>\n<nav>{nav}</nav>"
    return _layout(f"{host} - listing {n}", body)


def render_page(host: str, n: int, pages: int) -> str:
    """HTML of page ``/p/n`` of *host*."""
    links = "".join(f'<li><a class="link" href="/p/{m}">Page {m}</a></li>'
                    for m in page_links(host, n, pages))
    body = (f'<h1 class="title">Page {n} of {host}</h1>\n<ul>{links}</ul>\n'
            '<p><a class="home" href="/">Home</a></p>')
    return _layout(f"{host} - page {n}", body)


def render_path(host: str, path: str, pages: int, per_page: int,
                crawl_delay: int = 0) -> Page:
    """Pure routing for one host: the 200 or 404 answer to *path* (a robots.txt
    asking for *crawl_delay* seconds between requests if that is above 0)."""
    if path == "/robots.txt":
        robots = ROBOTS_TXT + (f"Crawl-delay: {crawl_delay}\n" if crawl_delay else "")
        return Page(200, "text/plain; charset=utf-8", robots.encode("ascii"))
    number = _number_after(path, "/list/")
    listing = render_listing(host, 1 if path == "/" else number or 0, pages, per_page)
    if listing is not None:
        return _html(200, listing)
    number = _number_after(path, "/p/")
    if number is not None and number <= pages:
        return _html(200, render_page(host, number, pages))
    return NOT_FOUND


def _number_after(path: str, prefix: str) -> int | None:
    tail = path[len(prefix):] if path.startswith(prefix) else ""
    # Canonical numbers only: "/p/01" is another URL and must answer 404.
    return int(tail) if tail.isdigit() and tail[0] != "0" and len(tail) < 10 else None


# --------------------------------------------------------------------------- state


@dataclass
class Throttle:
    """A host answering *status* until its count or its time runs out."""

    status: int
    retry_after: int | None
    remaining: int | None  # requests still to block; None: no count limit
    until: float | None  # site clock; None: no time limit

    def take(self, now: float) -> bool:
        """Whether this request is blocked (and count it if so)."""
        if self.until is not None and now >= self.until:
            return False
        if self.remaining is not None:
            if self.remaining <= 0:
                return False
            self.remaining -= 1
        return True


class Recorder:
    """Every request the site received, in arrival order, and the active throttles.

    A row is ``[host, path, status, t, done, retry_after]``, plus ``[client,
    headers]`` when headers are recorded; ``done`` is set when the answer is sent
    or the client goes away. ``epoch`` changes at each reset,
    so a reader's incremental copy knows when to start over.
    """

    def __init__(self) -> None:
        self.rows: list[list] = []
        self.throttles: dict[str, Throttle] = {}
        self.failed: set[tuple[str, str]] = set()  # transient faults already served
        self.in_flight: dict[str, int] = {}
        self.epoch = 0

    def reset(self) -> None:
        """Forget every row, throttle and served transient fault."""
        self.rows, self.throttles, self.failed = [], {}, set()
        self.epoch += 1

    def fails_once(self, host: str, path: str, every: int) -> bool:
        """Whether ``/p/M`` (``M % every == 0``) fails now: only its first request."""
        number = _number_after(path, "/p/")
        if not every or number is None or number % every or (host, path) in self.failed:
            return False
        self.failed.add((host, path))
        return True

    def block(self, host: str, now: float) -> Throttle | None:
        """The throttle that blocks this request to *host*, if any."""
        throttle = self.throttles.get(host)
        return throttle if throttle is not None and throttle.take(now) else None

    def since(self, start: int, epoch: int) -> dict:
        """Rows from *start* on; all rows if *epoch* is not the current one."""
        start = start if epoch == self.epoch else 0
        return {"epoch": self.epoch, "since": start, "rows": self.rows[start:]}


# --------------------------------------------------------------------------- server


@dataclass(frozen=True)
class HostsConfig:
    """What every host serves: page counts and latencies by host, listing size."""

    pages: Mapping[str, int]
    latency_ms: Mapping[str, int]
    per_page: int = PER_PAGE
    record_headers: bool = False
    crawl_delay: Mapping[str, int] = field(default_factory=dict)   # robots.txt, seconds
    fail_every: Mapping[str, int] = field(default_factory=dict)    # 503 once on /p/M, M % N == 0
    overload: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # (K, Retry-After s)


class HostsResource(Resource):
    """The crawled side: every path of every host (the host is the local address)."""

    isLeaf = True

    def __init__(self, config: HostsConfig, recorder: Recorder, reactor) -> None:
        super().__init__()
        self.config, self.recorder, self.reactor = config, recorder, reactor

    def render(self, request):
        """Record the request, pick the answer, send it now or after the latency."""
        now = time.monotonic()
        host = request.getHost().host
        path = request.path.decode("utf-8", "replace")
        overloaded = self._overloaded(host)
        page, headers, retry_after = overloaded or self._answer(host, path, now)
        row = [host, path, page.status, now, None, retry_after]
        if self.config.record_headers:
            row.append(_seen(request))
        self.recorder.rows.append(row)
        latency = self.config.latency_ms.get(host, 0)
        if latency <= 0 or overloaded:
            row[4] = time.monotonic()
            return _send(request, page, headers)
        flying = self.recorder.in_flight
        flying[host] = flying.get(host, 0) + 1
        call = self.reactor.callLater(latency / 1000, self._finish, request, page, headers, row)
        request.notifyFinish().addErrback(lambda _: self._gone(call, row))
        return NOT_DONE_YET

    def _overloaded(self, host: str) -> tuple[Page, dict, int] | None:
        limit = self.config.overload.get(host)
        if limit is None or self.recorder.in_flight.get(host, 0) < limit[0]:
            return None
        retry_after = limit[1]
        body = _layout("Too many requests", "<h1>429</h1>")
        return _html(429, body), {"retry-after": str(retry_after)}, retry_after

    def _answer(self, host: str, path: str, now: float) -> tuple[Page, dict, int | None]:
        throttle = self.recorder.block(host, now)
        if throttle is not None:
            headers = {} if throttle.retry_after is None else {"retry-after": str(throttle.retry_after)}
            body = _layout("Slow down", f"<h1>{throttle.status}</h1>")
            return _html(throttle.status, body), headers, throttle.retry_after
        if self.recorder.fails_once(host, path, self.config.fail_every.get(host, 0)):
            return _html(503, _layout("Unavailable", "<h1>503</h1>")), {}, None
        return (render_path(host, path, self.config.pages[host], self.config.per_page,
                            self.config.crawl_delay.get(host, 0)), {}, None)

    def _finish(self, request, page: Page, headers: dict, row: list) -> None:
        row[4] = time.monotonic()
        self._landed(row[0])
        request.write(_send(request, page, headers))
        request.finish()

    def _gone(self, call, row: list) -> None:
        # The client gave up (timeout, node killed): the request is no longer in flight.
        if call.active():
            call.cancel()
            row[4] = time.monotonic()
            self._landed(row[0])

    def _landed(self, host: str) -> None:
        flying = self.recorder.in_flight
        flying[host] = max(0, flying.get(host, 0) - 1)


def _seen(request) -> list:
    """``[client address, {header: value}]`` of the recorded headers present."""
    headers = {}
    for name in RECORDED_HEADERS:
        value = request.getHeader(name)
        if value is not None:
            headers[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    return [request.getClientAddress().host, headers]


def _send(request, page: Page, headers: Mapping[str, str]) -> bytes:
    # twisted.web knows no reason phrase for 429: name it, clients log it.
    request.setResponseCode(page.status, HTTPStatus(page.status).phrase.encode("ascii"))
    request.setHeader(b"content-type", page.content_type.encode("ascii"))
    request.setHeader(b"content-length", str(len(page.body)).encode("ascii"))
    for name, value in headers.items():
        request.setHeader(name.encode("ascii"), value.encode("ascii"))
    return page.body


class ControlResource(Resource):
    """The test side's JSON endpoints (see the module docstring)."""

    isLeaf = True

    def __init__(self, config: HostsConfig, recorder: Recorder) -> None:
        super().__init__()
        self.config, self.recorder = config, recorder

    def render(self, request):
        """Route one control call; 400 with a message for bad arguments."""
        path = request.path.decode("utf-8", "replace").strip("/")
        args = {k.decode(): v[-1].decode() for k, v in request.args.items()}
        try:
            status, data = 200, self._route(path, args)
        except (KeyError, ValueError) as exc:
            status, data = 400, {"error": str(exc)}
        body = json.dumps(data).encode("utf-8")
        return _send(request, Page(status, "application/json", body), {})

    def _route(self, path: str, args: dict[str, str]) -> dict:
        if path == "requests":
            return self.recorder.since(int(args.get("since", 0)), int(args.get("epoch", -1)))
        if path == "now":
            return {"now": time.monotonic()}
        if path == "reset":
            self.recorder.reset()
            return {"epoch": self.recorder.epoch}
        if path == "throttle":
            return self._throttle(args)
        if path == "unthrottle":
            if "host" in args:
                self.recorder.throttles.pop(self._host(args["host"]), None)
            else:
                self.recorder.throttles.clear()
            return {}
        raise KeyError(f"no control endpoint {path!r}")

    def _throttle(self, args: dict[str, str]) -> dict:
        host, status = self._host(args["host"]), int(args.get("status", 429))
        if status not in BLOCK_STATUSES:
            raise ValueError(f"status must be one of {BLOCK_STATUSES}, got {status}")
        count = int(args["count"]) if "count" in args else None
        seconds = float(args["seconds"]) if "seconds" in args else None
        if count is None and seconds is None:
            raise ValueError("give count, seconds or both")
        retry_after = int(args["retry_after"]) if args.get("retry_after") else None
        now = time.monotonic()
        until = now + seconds if seconds is not None else None
        self.recorder.throttles[host] = Throttle(status, retry_after, count, until)
        return {"armed_at": now, "until": until}

    def _host(self, host: str) -> str:
        if host not in self.config.pages:
            raise KeyError(f"not a host of this site: {host!r}")
        return host


def listen_all(reactor, hosts: Sequence[str], factory) -> dict[str, int]:
    """Listen on every host; one shared port when possible. Returns ``{host: port}``."""
    for _ in range(_SAME_PORT_ATTEMPTS):
        ports = _listen_same_port(reactor, hosts, factory)
        if ports is not None:
            return ports
    # Some address has that port taken each time: a port of its own per host.
    return {h: reactor.listenTCP(0, factory, backlog=1024, interface=h).getHost().port
            for h in hosts}


def _listen_same_port(reactor, hosts: Sequence[str], factory) -> dict[str, int] | None:
    from twisted.internet.error import CannotListenError

    first = reactor.listenTCP(0, factory, backlog=1024, interface=hosts[0])
    port, listeners = first.getHost().port, [first]
    try:
        for host in hosts[1:]:
            listeners.append(reactor.listenTCP(port, factory, backlog=1024, interface=host))
    except CannotListenError:
        for listener in listeners:
            listener.stopListening()
        return None
    return {host: port for host in hosts}


def _host_values(pairs: Iterable[str], option: str) -> dict[str, int]:
    out = {}
    for pair in pairs:
        host, sep, value = pair.partition("=")
        if not sep or not host:
            raise argparse.ArgumentTypeError(f"{option} takes HOST=N, got {pair!r}")
        out[host] = _non_negative(value)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Multi-host demo site.")
    parser.add_argument("--hosts", default=",".join(DEFAULT_HOSTS),
                        help="comma-separated local addresses, one site each")
    parser.add_argument("--pages", type=_positive, default=DEFAULT_PAGES, help="pages per host")
    parser.add_argument("--host-pages", action="append", default=[], metavar="HOST=N")
    parser.add_argument("--per-page", type=_positive, default=PER_PAGE)
    parser.add_argument("--latency-ms", type=_non_negative, default=0)
    parser.add_argument("--host-latency", action="append", default=[], metavar="HOST=MS")
    parser.add_argument("--host-crawl-delay", action="append", default=[], metavar="HOST=S",
                        help="robots.txt of HOST asks for S seconds between requests")
    parser.add_argument("--fail-every", type=_non_negative, default=0, metavar="N",
                        help="page /p/M with M %% N == 0 answers 503 once (0: never)")
    parser.add_argument("--host-fail-every", action="append", default=[], metavar="HOST=N")
    parser.add_argument("--host-overload", action="append", default=[], metavar="HOST=K,S",
                        help="429 with Retry-After S while K requests to HOST are in flight")
    parser.add_argument("--exit-on-stdin-eof", action="store_true")
    parser.add_argument("--record-headers", action="store_true",
                        help="keep each request's client address and identity/Referer headers")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> HostsConfig:
    """The :class:`HostsConfig` of a parsed command line."""
    hosts = [h for h in args.hosts.split(",") if h]
    pages = {h: args.pages for h in hosts} | _host_values(args.host_pages, "--host-pages")
    latency = {h: args.latency_ms for h in hosts} | _host_values(args.host_latency, "--host-latency")
    crawl_delay = _host_values(args.host_crawl_delay, "--host-crawl-delay")
    fail_every = {h: args.fail_every for h in hosts} | _host_values(args.host_fail_every,
                                                                    "--host-fail-every")
    overload = _overload_values(args.host_overload)
    unknown = (set(pages) | set(latency) | set(crawl_delay) | set(fail_every)
               | set(overload)) - set(hosts)
    if unknown or len(set(hosts)) != len(hosts) or not hosts:
        raise SystemExit(f"hosts must be distinct and listed in --hosts: {sorted(unknown) or hosts}")
    if min(pages.values()) < 1:
        raise SystemExit("every host needs at least one page")
    return HostsConfig(pages, latency, args.per_page, args.record_headers, crawl_delay,
                       fail_every, overload)


def _overload_values(pairs: Iterable[str]) -> dict[str, tuple[int, int]]:
    out = {}
    for pair in pairs:
        host, _, value = pair.partition("=")
        limit, _, retry_after = value.partition(",")
        try:
            out[host] = (_positive(limit), _non_negative(retry_after))
        except (argparse.ArgumentTypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"--host-overload takes HOST=K,S (K >= 1), got {pair!r}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    """Serve every host and the control endpoint; print the address line first."""
    args = parse_args(argv)
    config = config_from_args(args)
    from twisted.internet import reactor

    recorder = Recorder()
    ports = listen_all(reactor, list(config.pages), QuietSite(HostsResource(config, recorder, reactor)))
    control = reactor.listenTCP(0, QuietSite(ControlResource(config, recorder)), interface="127.0.0.1")
    line = {"control": f"http://127.0.0.1:{control.getHost().port}/",
            "hosts": {h: f"http://{h}:{p}/" for h, p in ports.items()}}
    print(LINE_PREFIX + json.dumps(line), flush=True)
    _install_stop_triggers(reactor, args.exit_on_stdin_eof)
    reactor.run(installSignalHandlers=False)
    return 0


# --------------------------------------------------------------------------- analysis


class Hit(NamedTuple):
    """One request the site received (times from the site's monotonic clock)."""

    host: str
    path: str
    status: int
    t: float  # arrival
    done: float | None  # answer sent or client gone; None while in flight
    retry_after: int | None  # set on throttled answers that carried Retry-After


class Seen(NamedTuple):
    """Who asked for a page, and with which headers (sites run with ``record_headers``)."""

    host: str
    path: str
    client: str  # the crawler's source address
    headers: dict  # lower-case names of RECORDED_HEADERS that were sent


def max_in_window(times: Sequence[float], window_s: float) -> int:
    """The most of *times* that any half-open window ``[a, a + window_s)`` holds.

    Half-open, so requests exactly ``1/r`` apart give ``r * window_s`` per window.
    """
    ordered = sorted(times)
    best = 0
    for i, start in enumerate(ordered):
        # An optimal window can always start at a request.
        best = max(best, bisect.bisect_left(ordered, start + window_s, i) - i)
    return best


def max_overlap(intervals: Iterable[tuple[float, float | None]]) -> int:
    """The most intervals ``[start, end)`` open at once (``end=None``: still open)."""
    events = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((math.inf if end is None else end, -1))
    # At equal times the end sorts first: back-to-back requests do not overlap.
    best = current = 0
    for _, step in sorted(events):
        current += step
        best = max(best, current)
    return best


# --------------------------------------------------------------------------- subprocess


class MultiHostSite:
    """The multi-host site in a subprocess (``python -m devtools.demo.hosts``).

    *pages*, *latency_ms* and *fail_every* (transient 503s, 0: none) are one
    value for every host or ``{host: value}`` (hosts left out get the defaults);
    *overload* maps a host to ``(K, S)``: 429 with ``Retry-After: S`` while K of
    its requests are in flight (a host with latency). Use as a context manager, or call
    :meth:`start` / :meth:`stop`. ``urls`` maps each host to its base URL
    (ending with ``/``).
    """

    def __init__(self, hosts: Sequence[str] = DEFAULT_HOSTS,
                 pages: int | Mapping[str, int] = DEFAULT_PAGES, per_page: int = PER_PAGE,
                 latency_ms: int | Mapping[str, int] = 0, start_timeout: float = 20.0,
                 record_headers: bool = False,
                 crawl_delay: Mapping[str, int] | None = None,
                 fail_every: int | Mapping[str, int] = 0,
                 overload: Mapping[str, tuple[int, int]] | None = None) -> None:
        self.hosts = list(hosts)
        self.pages = _per_host(self.hosts, pages, DEFAULT_PAGES)
        self.latency_ms = _per_host(self.hosts, latency_ms, 0)
        self.per_page, self.start_timeout = per_page, start_timeout
        self.record_headers = record_headers
        self.crawl_delay = dict(crawl_delay or {})
        self.fail_every = _per_host(self.hosts, fail_every, 0)
        self.overload = {h: (int(k), int(s)) for h, (k, s) in (overload or {}).items()}
        _per_host(self.hosts, self.overload, (0, 0))  # unknown hosts: ValueError
        self.urls: dict[str, str] = {}
        self.control_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self._hits: list[Hit] = []
        self._seen: list[Seen | None] = []
        self._epoch = -1

    # -- process ------------------------------------------------------------------

    def command(self) -> list[str]:
        """The argv used to launch the subprocess."""
        cmd = [sys.executable, "-m", "devtools.demo.hosts", "--hosts", ",".join(self.hosts),
               "--per-page", str(self.per_page), "--exit-on-stdin-eof"]
        if self.record_headers:
            cmd.append("--record-headers")
        for host in self.hosts:
            cmd += ["--host-pages", f"{host}={self.pages[host]}",
                    "--host-latency", f"{host}={self.latency_ms[host]}"]
        for host, seconds in self.crawl_delay.items():
            cmd += ["--host-crawl-delay", f"{host}={seconds}"]
        for host, every in self.fail_every.items():
            if every:
                cmd += ["--host-fail-every", f"{host}={every}"]
        for host, (limit, retry_after) in self.overload.items():
            cmd += ["--host-overload", f"{host}={limit},{retry_after}"]
        return cmd

    def start(self) -> MultiHostSite:
        """Launch the server and wait for its address line; ``RuntimeError`` on failure."""
        if self._proc is not None:
            raise RuntimeError("MultiHostSite already started")
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, env=env, text=True, encoding="utf-8")
        try:
            info = json.loads(self._await_line())
        except BaseException:
            self.stop()
            raise
        self.control_url, self.urls = info["control"], info["hosts"]
        return self

    def _await_line(self) -> str:
        lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, args=(self._proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(self._failure(f"no address after {self.start_timeout}s")) from None
            if line is None:
                raise RuntimeError(self._failure(f"exited with code {self._proc.wait(5)}"))
            if line.startswith(LINE_PREFIX):
                return line[len(LINE_PREFIX):]

    def _failure(self, reason: str) -> str:
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace").strip()
        return f"multi-host site failed to start ({reason}): {' '.join(self.command())}\n{err}"

    def stop(self) -> int | None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s); return its exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        self._stderr.close()
        return code

    def __enter__(self) -> MultiHostSite:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- addresses ----------------------------------------------------------------

    def url(self, host: str, path: str = "/") -> str:
        """Absolute URL of *path* on *host*."""
        return self.urls[host].rstrip("/") + "/" + path.lstrip("/")

    def root_urls(self) -> list[str]:
        """The home page of every host (the seeds of a complete crawl)."""
        return [self.urls[h] for h in self.hosts]

    def expected_paths(self, host: str) -> set[str]:
        """Every path a complete crawl fetches on *host*."""
        return expected_paths(self.pages[host], self.per_page)

    # -- control ------------------------------------------------------------------

    def _control(self, endpoint: str, method: str = "GET", **params) -> dict:
        if self.control_url is None:
            raise RuntimeError("MultiHostSite not started")
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        req = urllib.request.Request(f"{self.control_url}{endpoint}?{query}", method=method,
                                     data=b"" if method == "POST" else None)
        try:
            with _NO_PROXY.open(req, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise ValueError(json.loads(err.read()).get("error", str(err))) from None

    def now(self) -> float:
        """The site's clock (``time.monotonic()`` in its process)."""
        return self._control("now")["now"]

    def reset(self) -> None:
        """Forget every recorded request and every throttle."""
        self._control("reset", "POST")

    def throttle(self, host: str, status: int = 429, retry_after: int | None = 5,
                 count: int | None = None, seconds: float | None = None) -> float:
        """Make *host* answer *status* (429 or 503) with ``Retry-After: retry_after``
        (none if ``None``) to its next *count* requests and/or for *seconds*
        (whichever ends first). Replaces the host's previous throttle; returns the
        site time it started."""
        reply = self._control("throttle", "POST", host=host, status=status, count=count,
                              seconds=seconds, retry_after=retry_after)
        return reply["armed_at"]

    def unthrottle(self, host: str | None = None) -> None:
        """End the throttle of *host* (of every host if ``None``)."""
        self._control("unthrottle", "POST", host=host)

    # -- records ------------------------------------------------------------------

    def requests(self, host: str | None = None) -> list[Hit]:
        """Every request received since the last reset (of *host* only if given),
        in arrival order. Only rows not yet seen complete are transferred."""
        settled = 0
        while settled < len(self._hits) and self._hits[settled].done is not None:
            settled += 1
        reply = self._control("requests", since=settled, epoch=self._epoch)
        self._epoch = reply["epoch"]
        self._hits = self._hits[:reply["since"]] + [Hit(*row[:6]) for row in reply["rows"]]
        self._seen = self._seen[:reply["since"]] + [
            Seen(row[0], row[1], *row[6]) if len(row) > 6 else None for row in reply["rows"]]
        return [h for h in self._hits if host is None or h.host == host]

    def seen(self, host: str | None = None) -> list[Seen]:
        """Client and headers of every request (to *host*), in arrival order; the
        site must run with ``record_headers=True``."""
        if not self.record_headers:
            raise RuntimeError("MultiHostSite(record_headers=True) records headers")
        self.requests()
        return [s for s in self._seen if s is not None and (host is None or s.host == host)]

    def wait_for_requests(self, count: int, host: str | None = None,
                          timeout: float = 30.0) -> list[Hit]:
        """Wait until at least *count* requests (to *host*) arrived; return them all."""
        deadline = time.monotonic() + timeout
        while len(hits := self.requests(host)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(hits)} of {count} requests to {host or 'any host'} "
                                   f"after {timeout}s")
            time.sleep(0.05)
        return hits

    def per_host_times(self, host: str) -> list[float]:
        """Arrival times of every request to *host*, in order."""
        return [h.t for h in self.requests(host)]

    def max_in_window(self, host: str, window_s: float) -> int:
        """The most requests to *host* that any window of *window_s* seconds saw."""
        return max_in_window(self.per_host_times(host), window_s)

    def max_in_flight(self, host: str) -> int:
        """The most requests to *host* the site was answering at once."""
        return max_overlap((h.t, h.done) for h in self.requests(host))

    def served_after(self, host: str, t: float) -> list[Hit]:
        """Requests to *host* that arrived strictly after site time *t*."""
        return [h for h in self.requests(host) if h.t > t]

    def blocks(self, host: str) -> list[Hit]:
        """The throttled answers *host* served (429/503), with when and Retry-After."""
        return [h for h in self.requests(host) if h.status in BLOCK_STATUSES]


def _per_host(hosts: Sequence[str], value: int | Mapping[str, int], default: int) -> dict[str, int]:
    if isinstance(value, Mapping):
        unknown = set(value) - set(hosts)
        if unknown:
            raise ValueError(f"not hosts of this site: {sorted(unknown)}")
        return {h: value.get(h, default) for h in hosts}
    return {h: value for h in hosts}


if __name__ == "__main__":
    sys.exit(main())
