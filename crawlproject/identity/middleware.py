"""IdentityMiddleware: one consistent browser identity per session.

Each session (:func:`crawlproject.identity.session.session_key`) gets one
:class:`~crawlproject.identity.useragents.Identity`: a User-Agent from
fake-useragent and the ``Accept*`` and (Chromium only) ``Sec-CH-UA*`` headers
that browser sends, chosen by a stable hash of the session key so that every
node picks the same one with no Redis round trip (``IDENTITY_ROTATION`` says
how often it changes). What the spider pins (``USER_AGENT``, a request's own
``User-Agent``, ``meta["dont_rotate_identity"]``) wins. The identity is put in
``request.meta[IDENTITY]`` (transient) for the rendering middleware and the
impersonating handler. Stats: ``identity/assigned``,
``identity/pinned/spider``, ``identity/pinned/request``.

The rules in full: ``docs/middlewares.md``, "The identity middleware
(crawlproject/identity/middleware.py)".
"""

from __future__ import annotations

import logging

from scrapy import signals
from scrapy.downloadermiddlewares.httpcompression import ACCEPTED_ENCODINGS
from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.httpobj import urlparse_cached

from crawlproject.defaults import IDENTITY_BROWSERS, IDENTITY_PLATFORMS, setting
from crawlproject.identity.session import IDENTITY, session_key
from crawlproject.identity.useragents import HINT_HEADERS, Identity, PoolFilter, load_pool, pick
from crawlproject.urls import is_loopback_host

logger = logging.getLogger(__name__)

DONT_ROTATE = "dont_rotate_identity"
#: Used when the settings do not say (this project's settings say the same).
DEFAULT_BROWSERS = tuple(IDENTITY_BROWSERS)
DEFAULT_PLATFORMS = tuple(IDENTITY_PLATFORMS)
# Per-node request counts of sessions (IDENTITY_ROTATION = N): the oldest are
# forgotten beyond this many, so a crawl of millions of hosts stays bounded.
_MAX_COUNTED_SESSIONS = 100_000


def parse_rotation(value) -> int:
    """``IDENTITY_ROTATION`` as requests per identity (0: the whole session)."""
    if value in (None, "", "session"):
        return 0
    if value == "request":
        return 1
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or isinstance(value, bool):
        raise ValueError(f'IDENTITY_ROTATION must be "session", "request" or a positive '
                         f"integer, got {value!r}")
    return number


class IdentityMiddleware:
    """Give each request its session's browser identity (see docs/middlewares.md)."""

    def __init__(self, crawler, pool: tuple[Identity, ...], rotation: int = 0, salt: str = "",
                 defaults: dict[str, str] | None = None, compression: bool = True,
                 pinned: str | None = None, profiles: dict[str, str] | None = None):
        self.crawler, self.pool, self.rotation, self.salt = crawler, pool, rotation, salt
        # identity id -> impersonation profile (None: not impersonating)
        self.profiles = profiles
        self.defaults = {k.lower(): v for k, v in (defaults or {}).items()}
        self.compression, self.pinned = compression, pinned
        self._by_ua = {i.user_agent.encode("latin-1", "replace"): i for i in pool}
        default_ua = self.defaults.get("user-agent")
        self._default_ua = default_ua.encode("latin-1", "replace") if default_ua else None
        self._counts: dict[str, int] = {}

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not setting(s, "IDENTITY_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        flt = PoolFilter(tuple(setting(s, "IDENTITY_BROWSERS")),
                         tuple(setting(s, "IDENTITY_OS")),
                         tuple(setting(s, "IDENTITY_PLATFORMS")),
                         setting(s, "IDENTITY_MIN_VERSION"), setting(s, "IDENTITY_MIN_PERCENTAGE"))
        encodings = [e.decode() for e in ACCEPTED_ENCODINGS]
        explicit_ua = (s.getpriority("USER_AGENT") or 0) > SETTINGS_PRIORITIES["default"]
        pool, profiles = load_pool(flt, encodings), None
        if setting(s, "IMPERSONATE_ENABLED"):
            pool, profiles = _impersonated(pool, flt, s)
        mw = cls(crawler, pool, parse_rotation(setting(s, "IDENTITY_ROTATION")),
                 str(setting(s, "IDENTITY_SALT")), _scrapy_defaults(s),
                 s.getbool("COMPRESSION_ENABLED"), "USER_AGENT setting" if explicit_ua else None,
                 profiles)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        return mw

    def spider_opened(self, spider) -> None:
        """Note a spider-level ``user_agent``; log what the crawl will look like."""
        if getattr(spider, "user_agent", None):
            self.pinned = "spider's user_agent attribute"
        if self.pinned:
            logger.info("User-Agent pinned by the %s: identities off", self.pinned,
                        extra={"spider": spider})
        else:
            logger.info("Identities: %d User-Agents%s, a new one per %s", len(self.pool),
                        f" ({len(set(self.profiles.values()))} impersonation profiles)"
                        if self.profiles else "",
                        f"{self.rotation} request(s) of a session" if self.rotation else "session",
                        extra={"spider": spider})

    def process_request(self, request, spider=None):
        """Set the session's identity headers unless the User-Agent is pinned."""
        stats = self.crawler.stats
        if self.pinned:
            stats.inc_value("identity/pinned/spider")
            return None
        current = request.headers.get(b"User-Agent")
        previous = self._by_ua.get(current) if current is not None else None
        if request.meta.get(DONT_ROTATE) or (
                previous is None and current is not None and current != self._default_ua):
            stats.inc_value("identity/pinned/request")
            return None
        identity = self.choose(request)
        hints = _hints_allowed(request)
        self._apply(request.headers, identity, previous, hints)
        request.meta[IDENTITY] = meta = identity.as_meta(hints)
        if self.profiles is not None:
            meta["profile"] = self.profiles[identity.id]
        stats.inc_value("identity/assigned")
        return None

    def choose(self, request) -> Identity:
        """The identity of *request*'s session in its current rotation bucket."""
        session = session_key(request)
        bucket = self._count(session) // self.rotation if self.rotation else 0
        return pick(self.pool, session, bucket, self.salt)

    def _count(self, session: str) -> int:
        # A plain dict keeps insertion order: re-inserting makes a session the
        # newest, and the first key is the one seen least recently.
        count = self._counts.pop(session, 0)
        self._counts[session] = count + 1
        if len(self._counts) > _MAX_COUNTED_SESSIONS:
            del self._counts[next(iter(self._counts))]
        return count

    def _apply(self, headers, identity: Identity, previous: Identity | None, hints: bool) -> None:
        headers[b"User-Agent"] = identity.user_agent
        stale = dict(previous.headers) if previous is not None else {}
        for name, value in identity.headers:
            if name == "Accept-Encoding" and not self.compression:
                continue  # Scrapy would not decode what the browser asks for
            current = headers.get(name)
            if current is None or _text(current) in (self.defaults.get(name.lower()),
                                                      stale.get(name)):
                headers[name] = value
        # Hints never contradict the User-Agent: a previous identity's go.
        for name in HINT_HEADERS:
            headers.pop(name, None)
        if hints:
            for name, value in identity.hints:
                headers[name] = value


def _impersonated(pool: tuple[Identity, ...], flt: PoolFilter, settings
                  ) -> tuple[tuple[Identity, ...], dict[str, str]]:
    """The identities whose browser version the impersonation library reproduces,
    and their profiles; an error at start if the filters leave none."""
    from crawlproject.impersonate.addon import handler_installed
    from crawlproject.impersonate.profiles import available_profiles, profile_for

    if not handler_installed(settings):
        raise ValueError("IMPERSONATE_ENABLED is on but http/https are not downloaded by "
                         "crawlproject.impersonate's handler: add ADDONS = "
                         '{"crawlproject.impersonate.ImpersonateAddon": 0}')
    available = available_profiles()
    profiles = {i.id: profile_for(i.user_agent, available) for i in pool}
    kept = tuple(i for i in pool if profiles[i.id])
    if not kept:
        raise ValueError(f"IMPERSONATE_ENABLED: no User-Agent of the identity filters {flt} is "
                         f"a browser version curl_cffi reproduces ({', '.join(sorted(available))})")
    return kept, {i.id: profiles[i.id] for i in kept}


def _scrapy_defaults(settings) -> dict[str, str]:
    """Header values Scrapy's own middlewares set when a request has none."""
    defaults = {str(k): str(v) for k, v in settings.getdict("DEFAULT_REQUEST_HEADERS").items()}
    defaults["Accept-Encoding"] = ", ".join(e.decode() for e in ACCEPTED_ENCODINGS)
    defaults["User-Agent"] = str(settings.get("USER_AGENT") or "")
    return defaults


def _text(value: bytes) -> str:
    return value.decode("latin-1")


def _hints_allowed(request) -> bool:
    # Chromium sends client hints only to secure contexts: HTTPS, or loopback.
    parsed = urlparse_cached(request)
    return parsed.scheme == "https" or is_loopback_host(parsed.hostname or "")
