"""A shared proxy pool: parsing, ban detection and choice (no Scrapy, no Redis).

Plain classes used by :class:`~crawlproject.proxies.middleware.ProxyPoolMiddleware`,
the command-line tool and the tests; the shared state lives in Redis
(:mod:`crawlproject.proxies.store`).

* :func:`parse_proxy` turns an entry (``http://user:pass@host:port`` or
  ``https://...``) into a :class:`Proxy`, strictly: entries read from Redis are
  untrusted. SOCKS is refused: Scrapy's HTTP download handler speaks only to
  HTTP(S) proxies (``meta["proxy"]`` with ``socks5://`` would fail every
  download), so a ``socks*`` entry is a clear :class:`InvalidProxy`, never a crash.
* :class:`BanRules` decides whether a response is a ban (status codes, 503 only
  with a body marker, body markers, redirects to block pages). A 404 or a 500
  is never a ban.
* :class:`PoolView` is one node's cached copy of the pool and its shared health
  (refreshed in the background): it picks a proxy for a request in memory.

A proxy's *id* is ``host:port``: safe to log, to store and to show; the
credentials stay in :attr:`Proxy.username` / :attr:`Proxy.password` and never
leave the node except towards the proxy itself.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import random
import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from crawlproject import defaults
from crawlproject.defaults import setting

#: Proxy URL schemes Scrapy can use (HTTP forward proxies, plain or TLS).
SCHEMES = frozenset({"http", "https"})
#: Schemes an operator may write but Scrapy cannot use.
UNSUPPORTED_SCHEMES = frozenset({"socks", "socks4", "socks4a", "socks5", "socks5h"})
MAX_ENTRY_LENGTH = 2048
#: the ban "deadline" of a proxy not banned: long past on any clock (0.0 only
#: while time.monotonic(), which counts from boot, is not below it)
NOT_BANNED = -math.inf
#: Default ``PROXY_BAN_BODY_PATTERNS`` / ``PROXY_BAN_REDIRECT_PATTERNS``.
DEFAULT_BODY_PATTERNS = tuple(defaults.PROXY_BAN_BODY_PATTERNS)
DEFAULT_REDIRECT_PATTERNS = tuple(defaults.PROXY_BAN_REDIRECT_PATTERNS)
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?\Z")
_ENTRY = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,15})://"
                    r"(?:(?P<user>[^:@/?#\s]*)(?::(?P<password>[^@/?#\s]*))?@)?"
                    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^:@/?#\s\[\]]+)"
                    r"(?::(?P<port>[0-9]{1,5}))?/?\Z")


class InvalidProxy(ValueError):
    """A pool entry that cannot be used; ``code`` is a stats key. The message
    never repeats the entry (it may hold a password)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Proxy:
    """One usable proxy. ``repr`` and :attr:`id` never show the credentials."""

    scheme: str
    host: str
    port: int
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)

    @property
    def id(self) -> str:
        """Masked id (``host:port``), the proxy's name in Redis, logs and stats."""
        return f"{self.host}:{self.port}"

    @property
    def server(self) -> str:
        """``scheme://host:port`` without credentials (a browser context's ``server``)."""
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL with credentials, for ``meta["proxy"]`` (Scrapy's
        HttpProxyMiddleware moves them into a header at once)."""
        if not self.username:
            return self.server
        auth = quote(self.username, safe="") + ":" + quote(self.password, safe="")
        return f"{self.scheme}://{auth}@{self.host}:{self.port}"

    def context(self) -> dict[str, str]:
        """What a browser context needs (``server``, ``username``, ``password``)."""
        return {"server": self.server, "username": self.username, "password": self.password}


def parse_proxy(entry) -> Proxy:
    """Parse a pool entry strictly; raise :class:`InvalidProxy` for anything else.

    Accepted: ``http``/``https`` URL, a host name or an IP address (IPv6 in
    brackets), an explicit port 1-65535, optional ``user:password`` (percent-
    encoded), nothing after the port but an optional ``/``.
    """
    if isinstance(entry, bytes):
        try:
            entry = entry.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidProxy("not_utf8", "entry is not UTF-8 text") from None
    if not isinstance(entry, str):
        raise InvalidProxy("not_text", "entry is not text")
    entry = entry.strip()
    if not entry or len(entry) > MAX_ENTRY_LENGTH:
        raise InvalidProxy("bad_length", f"entry is empty or longer than {MAX_ENTRY_LENGTH}")
    match = _ENTRY.match(entry)
    if match is None:
        raise InvalidProxy("malformed", "not a proxy URL (scheme://[user:password@]host:port)")
    scheme = match["scheme"].lower()
    if scheme in UNSUPPORTED_SCHEMES:
        raise InvalidProxy("unsupported_scheme", f"{scheme}:// proxies are not supported: "
                           "Scrapy's HTTP download handler has no SOCKS support (use http/https)")
    if scheme not in SCHEMES:
        raise InvalidProxy("unsupported_scheme", "scheme is not http or https")
    host = _host(match["host"])
    if match["port"] is None or not 1 <= int(match["port"]) <= 65535:
        raise InvalidProxy("bad_port", "port missing or not in 1-65535")
    user, password = match["user"] or "", match["password"] or ""
    if password and not user:
        raise InvalidProxy("malformed", "password without a user name")
    return Proxy(scheme, host, int(match["port"]), unquote(user), unquote(password))


def _host(text: str) -> str:
    if text.startswith("["):
        try:
            return f"[{ipaddress.IPv6Address(text[1:-1]).compressed}]"
        except ValueError:
            raise InvalidProxy("bad_host", "not a valid IPv6 address") from None
    if _HOSTNAME.match(text) is None or text.replace(".", "").isdigit() and not _is_ipv4(text):
        raise InvalidProxy("bad_host", "not a valid host name or IPv4 address")
    return text.lower().rstrip(".")


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def entry_fingerprint(entry) -> str:
    """A short stable name for an entry that must not be shown (8 hex digits)."""
    data = entry if isinstance(entry, bytes) else str(entry).encode("utf-8", "replace")
    return hashlib.blake2b(data, digest_size=4).hexdigest()


# --------------------------------------------------------------------------- bans


@dataclass(frozen=True)
class BanRules:
    """What makes a response a ban (see the module docstring)."""

    codes: frozenset[int] = frozenset({403, 429})
    body_patterns: tuple[re.Pattern, ...] = ()
    redirect_patterns: tuple[re.Pattern, ...] = ()
    body_max_bytes: int = defaults.PROXY_BAN_BODY_MAX_BYTES

    @classmethod
    def from_settings(cls, settings) -> "BanRules":
        return cls(codes=frozenset(int(c) for c in setting(settings, "PROXY_BAN_HTTP_CODES")),
                   body_patterns=_compile(setting(
                       settings, "PROXY_BAN_BODY_PATTERNS"),
                       "PROXY_BAN_BODY_PATTERNS"),
                   redirect_patterns=_compile(setting(
                       settings, "PROXY_BAN_REDIRECT_PATTERNS"),
                       "PROXY_BAN_REDIRECT_PATTERNS"),
                   body_max_bytes=setting(settings, "PROXY_BAN_BODY_MAX_BYTES"))

    def classify(self, status: int, body: bytes = b"", location: str | None = None,
                 url: str = "") -> str | None:
        """The ban reason (``status_403``, ``body``, ``redirect``...) or None.

        *location* is a redirect's target; *url* the final URL of a request that
        was redirected (empty otherwise): either may be a known block page."""
        if 300 <= status < 400 and location and self._matches_redirect(location):
            return "redirect"
        if url and self._matches_redirect(url):  # a block page reached by a redirect
            return "redirect"
        if status in self.codes:
            return f"status_{status}"
        if self.body_patterns and (status == 503 or 200 <= status < 300):
            text = body[:self.body_max_bytes].decode("utf-8", "replace")
            if any(p.search(text) for p in self.body_patterns):
                return "body" if status != 503 else "status_503_body"
        return None

    def _matches_redirect(self, target: str) -> bool:
        return any(p.search(target) for p in self.redirect_patterns)


def _compile(patterns, name: str) -> tuple[re.Pattern, ...]:
    out = []
    for pattern in patterns or ():
        try:
            out.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"{name}: invalid regular expression {pattern!r}: {exc}") from None
    return tuple(out)


# --------------------------------------------------------------------------- choice


@dataclass
class Health:
    """Shared health of one proxy (all nodes), as last read from Redis."""

    ok: int = 0
    failures: int = 0
    bans: int = 0
    latency_ms: float | None = None
    consecutive_failures: int = 0

    def weight(self, default_latency: float) -> float:
        """Traffic share: higher for proxies that succeed and answer fast.

        Unknown latency counts as the pool's average, so a new proxy gets an
        ordinary share at once (and a measured latency soon)."""
        success = (self.ok + 1) / (self.ok + self.failures + 2)
        latency = self.latency_ms
        if latency is None or not math.isfinite(latency) or latency <= 0:
            latency = default_latency  # parsed strictly upstream; never a zero weight here
        return success / max(10.0, latency)


class PoolView:
    """One node's view of the pool: proxies, health, bans, retirements.

    Replaced wholesale by each background refresh (:meth:`update`); the choice
    (:meth:`choose`) is in memory. Ban deadlines are ``time.monotonic()``
    values of this process.
    """

    def __init__(self, rng: random.Random | None = None):
        self.rng = rng or random.Random()
        self.proxies: dict[str, Proxy] = {}
        self.health: dict[str, Health] = {}
        self.retired: dict[str, str] = {}
        # domain → proxy id → (until, strikes)
        self.bans: dict[str, dict[str, tuple[float, int]]] = {}
        self._live: list[Proxy] = []
        self._weights: list[float] = []

    def update(self, proxies: dict[str, Proxy], health: dict[str, Health],
               retired: dict[str, str],
               bans: dict[str, dict[str, tuple[float, int]]] | None = None) -> None:
        """Take a new snapshot and precompute the weights of live proxies
        (*bans* None: keep the bans, changed one by one by :meth:`ban` and
        :meth:`set_ban`)."""
        self.proxies, self.health, self.retired = proxies, health, retired
        if bans is not None:
            self.bans = bans
        self._live = [p for i, p in sorted(proxies.items()) if i not in retired]
        known = [h.latency_ms for i, h in health.items() if h.latency_ms and i in proxies]
        default = sum(known) / len(known) if known else 100.0
        self._weights = [self.health.get(p.id, Health()).weight(default) for p in self._live]

    @property
    def usable(self) -> int:
        """Proxies in the pool and not retired (banned or not)."""
        return len(self._live)

    def ban(self, proxy_id: str, domain: str, until: float, strikes: int) -> None:
        """Record a ban locally at once (Redis gets it with the next flush)."""
        self.bans.setdefault(domain, {})[proxy_id] = (until, strikes)

    def unban(self, proxy_id: str, domain: str) -> None:
        """Forget a ban and its strikes (deleted or forgotten in Redis)."""
        banned = self.bans.get(domain)
        if banned is not None:
            banned.pop(proxy_id, None)
            if not banned:
                del self.bans[domain]

    def forget(self, before: float) -> None:
        """Drop bans that ended before *before* (Redis forgets them alike)."""
        for domain in list(self.bans):
            for pid, (until, _) in list(self.bans[domain].items()):
                if until < before:
                    self.unban(pid, domain)

    def strikes(self, proxy_id: str, domain: str) -> int:
        return self.bans.get(domain, {}).get(proxy_id, (NOT_BANNED, 0))[1]

    def banned_until(self, proxy_id: str, domain: str, now: float) -> float | None:
        until = self.bans.get(domain, {}).get(proxy_id, (NOT_BANNED, 0))[0]
        return until if until > now else None

    def choose(self, domain: str, now: float) -> Proxy | None:
        """A weighted random choice among live proxies not banned for *domain*."""
        banned = self.bans.get(domain)
        if not banned:
            candidates, weights = self._live, self._weights
        else:
            pairs = [(p, w) for p, w in zip(self._live, self._weights)
                     if banned.get(p.id, (NOT_BANNED, 0))[0] <= now]
            candidates, weights = [p for p, _ in pairs], [w for _, w in pairs]
        if not candidates:
            return None
        if not 0 < sum(weights) < math.inf:  # defence: never raise on a request
            return self.rng.choice(candidates)
        return self.rng.choices(candidates, weights)[0]

    def sticky(self, session: str, domain: str, now: float) -> tuple[Proxy | None, Proxy | None]:
        """(chosen, home) for a session: rendezvous hashing over live proxies.

        *home* is the session's proxy when nothing is banned; *chosen* the
        first in the session's ranking not banned for *domain*. Every node
        ranks alike, so a session keeps one exit address across nodes; adding
        a proxy moves only the sessions it ranks first for."""
        ranked = sorted(self._live, key=lambda p: _rendezvous(session, p.id), reverse=True)
        home = ranked[0] if ranked else None
        banned = self.bans.get(domain, {})
        for proxy in ranked:
            if banned.get(proxy.id, (NOT_BANNED, 0))[0] <= now:
                return proxy, home
        return None, home

    def next_unban(self, domain: str, now: float) -> float | None:
        """Seconds until the first live proxy banned for *domain* is revived."""
        banned = self.bans.get(domain, {})
        waits = [banned[p.id][0] - now for p in self._live if p.id in banned]
        return max(0.0, min(waits)) if waits else None


def _rendezvous(session: str, proxy_id: str) -> int:
    digest = hashlib.blake2b(f"{session}\0{proxy_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
