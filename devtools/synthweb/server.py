"""Serve a table of synthetic sites, all in one thread of the calling process.

:class:`SyntheticWeb` binds every site on its own loopback address
(``127.0.0.40`` + index), http and https (a self-signed certificate made at
start, naming every address), runs them on one asyncio loop in a daemon
thread (aiohttp), and records every request as a :class:`Hit`: arrival and
completion time (``time.monotonic()``: the same clock as the caller's),
site, scheme, method, target, status, peer and request headers.

    with SyntheticWeb(web(10)) as synth:
        synth.seeds()           # the home pages to crawl from
        ...                     # crawl
        synth.hits("control")   # what the site saw

Nothing here blocks the caller's reactor: requests are answered on the
thread's loop; the log is read under a lock.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from aiohttp import web as aioweb

from devtools.synthweb import behaviours as B
from devtools.synthweb.table import SiteSpec

FIRST_ADDRESS = 40          # 127.0.0.40 ...
#: site names under this domain with ``hostnames=True`` (resolved by :meth:`SyntheticWeb.hosts_file`)
HOST_DOMAIN = "synth.test"
LAST_ADDRESS = 250
#: request headers kept in the log (lower case); all of them with record_all_headers
KEPT_HEADERS = ("host", "user-agent", "accept-encoding", "cookie", "referer", "authorization")
#: features that act on every page of their site (not on paths of their own)
SITE_WIDE = ("cookies", "retry-after")
#: response headers kept in the log
KEPT_RESPONSE = ("Location", "Retry-After", "Content-Encoding", "X-Robots-Tag", "Set-Cookie")


@dataclass
class Hit:
    """One request a site received."""

    t: float                 # arrival, time.monotonic()
    site: str
    scheme: str
    method: str
    target: str              # path and query as sent
    peer: str
    headers: dict
    status: int | None = None
    done: float | None = None   # response finished (or client gone)
    response: dict = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The canonical path (session ids removed): what the ground truth classifies."""
        return B.canonical(self.target)


class RunningSite:
    """One site of a :class:`SyntheticWeb`: its spec, address, ports and counters."""

    def __init__(self, web: "SyntheticWeb", spec: SiteSpec, address: str):
        self.web, self.spec, self.address = web, spec, address
        #: the name in its URLs: the address, or ``<name>.synth.test`` (``hostnames=True``)
        self.host = f"{spec.name}.{HOST_DOMAIN}" if web.hostnames else address
        self.ports: dict[str, int] = {}
        self.counters: Counter = Counter()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def scheme(self) -> str:
        return "https" if self.spec.https else "http"

    def origin(self, scheme: str | None = None) -> str:
        scheme = scheme or self.scheme
        return f"{scheme}://{self.host}:{self.ports.get(scheme, 0)}"

    def url(self, path: str = "/", scheme: str | None = None) -> str:
        return self.origin(scheme) + path

    def seed(self) -> str:
        """The URL a crawl starts from: the http origin of an http → https site."""
        return self.url("/", "http" if self.spec.http_to_https else None)

    def count(self, what: str) -> int:
        """Count one more *what* (robots.txt fetches, 429s given ...); the new count."""
        self.counters[what] += 1
        return self.counters[what]

    async def handle(self, request: aioweb.Request) -> aioweb.StreamResponse:
        hit = self.web._record(self, request)
        try:
            response = await self.answer(request)
        except Exception:
            hit.status = 500
            raise
        finally:
            hit.done = time.monotonic()
        hit.status = response.status
        hit.response = {k: response.headers[k] for k in KEPT_RESPONSE if k in response.headers}
        return response

    async def answer(self, request: aioweb.Request) -> aioweb.StreamResponse:
        spec = self.spec
        target = request.raw_path
        path = B.canonical(target).split("?", 1)[0]
        if spec.redirect_all_to:
            return B.redirect(self.web.sites[spec.redirect_all_to].origin() + target)
        if spec.http_to_https and request.scheme == "http":
            return B.redirect(self.origin("https") + target)
        if spec.latency_ms:
            await asyncio.sleep(spec.latency_ms / 1000)
        for handler in (B.answer_robots, B.answer_hops):
            response = await handler(self, request, path)
            if response is not None:
                return response
        for name in SITE_WIDE:   # before any page
            if name in spec.features:
                response = await B.FEATURES[name].answer(self, request, path)
                if response is not None:
                    return response
        response = await B.answer_base(self, request, path)
        if response is not None:
            return response
        for name in spec.features:
            if name not in SITE_WIDE:
                response = await B.FEATURES[name].answer(self, request, path)
                if response is not None:
                    return response
        return B.page("Not found", status=404)


class SyntheticWeb:
    """The sites of *specs*, served on 127.0.0.40, .41, ... (http and https).

    ``sitemaps``: the ground truth counts sitemap-only pages as required (a
    spider that reads sitemaps). ``port``: every address serves http on
    *port* and https on *port* + 1 (default: a free port per listener).
    ``hostnames``: the sites' URLs name ``<site>.synth.test`` instead of the
    address; only a process whose ``/etc/hosts`` is :meth:`hosts_file` (a
    network namespace: ``unshare -n -m``) reaches them."""

    def __init__(self, specs: Iterable[SiteSpec], sitemaps: bool = False,
                 port: int | None = None, first_address: int = FIRST_ADDRESS,
                 record_all_headers: bool = False, hostnames: bool = False):
        specs = list(specs)
        if first_address + len(specs) - 1 > LAST_ADDRESS:
            raise ValueError(f"at most {LAST_ADDRESS - first_address + 1} sites")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("site names must be unique")
        self.sitemaps = sitemaps
        self.hostnames = hostnames
        self.port = port
        self.record_all_headers = record_all_headers
        self.sites: dict[str, RunningSite] = {
            s.name: RunningSite(self, s, f"127.0.0.{first_address + i}")
            for i, s in enumerate(specs)}
        self.by_host = {**{s.address: s for s in self.sites.values()},
                        **{s.host: s for s in self.sites.values()}}
        self.closing = False
        self._hits: list[Hit] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[aioweb.AppRunner] = []
        self._tmp: tempfile.TemporaryDirectory | None = None
        #: the self-signed certificate (PEM) once started: what a client verifying TLS trusts
        self.cert_file: Path | None = None

    # -- the sites ----------------------------------------------------------------------
    @property
    def first(self) -> RunningSite:
        """The first site: it also serves other sites' redirected robots.txt."""
        return next(iter(self.sites.values()))

    def site(self, name: str) -> RunningSite:
        return self.sites[name]

    def seeds(self) -> list[str]:
        """The home pages a crawl starts from (sites reached only through
        another one are not seeds)."""
        return [s.seed() for s in self.sites.values() if s.spec.seed]

    def hosts_file(self) -> str:
        """``/etc/hosts`` lines naming every site (with ``hostnames=True``): its
        name, and the name with a trailing dot (the resolver of a namespace
        without DNS would not strip it)."""
        lines = ["127.0.0.1 localhost"]
        lines += [f"{s.address} {s.spec.name}.{HOST_DOMAIN} {s.spec.name}.{HOST_DOMAIN}."
                  for s in self.sites.values()]
        return "\n".join(lines) + "\n"

    def site_of(self, netloc: str) -> RunningSite | None:
        """The site serving *netloc* (``host:port``; a host name in any case,
        with or without a trailing dot; userinfo ignored)."""
        host, _, port = netloc.rpartition("@")[2].rpartition(":")
        site = self.by_host.get(host.strip("[]").rstrip(".").lower())
        return site if site and int(port or 0) in site.ports.values() else None

    # -- the log -------------------------------------------------------------------------
    def _record(self, site: RunningSite, request: aioweb.Request) -> Hit:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        headers = ({k.lower(): v for k, v in request.headers.items()} if self.record_all_headers
                   else {k: request.headers[k] for k in KEPT_HEADERS if k in request.headers})
        hit = Hit(time.monotonic(), site.name, request.scheme, request.method, request.raw_path,
                  f"{peer[0]}:{peer[1]}" if peer else "", headers)
        with self._lock:
            self._hits.append(hit)
        return hit

    def hits(self, site: str | None = None) -> list[Hit]:
        """Every request received so far (of *site*), in arrival order."""
        with self._lock:
            return [h for h in self._hits if site is None or h.site == site]

    def reset(self) -> None:
        """Forget the log and every site's counters (robots.txt 5xx, 429s)."""
        def clear():
            with self._lock:
                self._hits.clear()
            for site in self.sites.values():
                site.counters.clear()
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(_call(clear), self._loop).result(10)
        else:
            clear()

    def wait_for(self, predicate, timeout: float = 30.0, interval: float = 0.02) -> list[Hit]:
        """Wait until ``predicate(hits)`` is true; the hits. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            hits = self.hits()
            if predicate(hits):
                return hits
            if time.monotonic() > deadline:
                raise TimeoutError(f"not seen in {timeout}s; {len(hits)} requests received")
            time.sleep(interval)

    # -- start / stop --------------------------------------------------------------------
    def start(self) -> "SyntheticWeb":
        self._tmp = tempfile.TemporaryDirectory(prefix="synthweb-")
        context = tls_context([s.address for s in self.sites.values()], Path(self._tmp.name),
                              [s.host for s in self.sites.values()] if self.hostnames else [])
        self.cert_file = Path(self._tmp.name) / "cert.pem"
        sockets = self._bind()
        for site in self.sites.values():
            B.prepare(site)   # after _bind: a body may name the site's origin
        ready = threading.Event()
        failure: list[BaseException] = []

        def run():
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(sockets, context))
            except BaseException as exc:   # reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="synthweb", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise RuntimeError(f"synthetic web did not start: {failure[0]!r}") from failure[0]
        return self

    def _bind(self) -> list[tuple[RunningSite, str, socket.socket]]:
        out = []
        for site in self.sites.values():
            for offset, scheme in enumerate(("http", "https")):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((site.address, self.port + offset if self.port else 0))
                site.ports[scheme] = sock.getsockname()[1]
                out.append((site, scheme, sock))
        return out

    async def _serve(self, sockets, context) -> None:
        for site, scheme, sock in sockets:
            # Long URLs (the trap goes past 4 KiB) and long cookies are the
            # behaviours under test, not the server's business.
            app = aioweb.Application(handler_args={"max_line_size": 65536,
                                                   "max_field_size": 65536})
            app.router.add_route("*", "/{tail:.*}", site.handle)
            runner = aioweb.AppRunner(app, access_log=None, shutdown_timeout=0.5)
            await runner.setup()
            await aioweb.SockSite(runner, sock, ssl_context=context if scheme == "https"
                                  else None).start()
            self._runners.append(runner)

    async def _cleanup(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def stop(self) -> None:
        self.closing = True
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "SyntheticWeb":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def _call(fn):
    return fn()


def tls_context(addresses: list[str], directory: Path, names: list[str] = ()) -> ssl.SSLContext:
    """A server context with a self-signed certificate (EC P-256, one day)
    naming every address in *addresses* and host name in *names*."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "synthweb")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
                + [x509.DNSName(n) for n in names]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context
