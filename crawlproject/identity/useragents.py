"""Browser identities: a User-Agent from fake-useragent and the headers its browser sends.

No Scrapy here (the middleware, :mod:`crawlproject.identity.middleware`, is
the adapter). :func:`load_pool` filters fake-useragent's data file, which
ships in its wheel and is read from disk (``importlib.resources``): no network
call, ever. The pool is ordered by User-Agent string, so every node with the
same settings and the same fake-useragent version holds the same pool, and
:func:`pick` (a stable hash into it) gives the same identity for the same
session on every node without asking anyone.

An :class:`Identity` is derived from its User-Agent string alone
(:func:`identity_for`): the browser family decides ``Accept``,
``Accept-Language`` and ``Accept-Encoding``; Chromium agents get the three
low-entropy client hints Chromium sends by default (``Sec-CH-UA``,
``Sec-CH-UA-Mobile``, ``Sec-CH-UA-Platform``), with the brand versions taken
from the User-Agent; Firefox and WebKit (Safari, every iOS browser) send none.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

CHROMIUM, FIREFOX, SAFARI = "chromium", "firefox", "safari"

# Navigation-request headers by family, as the browsers send them by default
# (MDN "List of default Accept values"; Chromium's and Firefox's network
# defaults, en-US builds). Small on purpose: a spider that needs another
# language sets Accept-Language itself, and its value wins.
_HEADERS = {
    CHROMIUM: {
        "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,"
                  "image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7",
        "Accept-Language": "en-US,en;q=0.9",
    },
    FIREFOX: {
        "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        "Accept-Language": "en-US,en;q=0.5",
    },
    SAFARI: {
        "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        "Accept-Language": "en-US,en;q=0.9",
    },
}
# zstd is advertised from Chromium 123 and Firefox 126 on; Safari does not.
_ZSTD_SINCE = {CHROMIUM: 123, FIREFOX: 126}
_ENCODINGS = ("gzip", "deflate", "br")

# Chromium-based browsers: UA token -> their Sec-CH-UA brand (else Google Chrome).
_CHROMIUM_BRANDS = (("Edg/", "Microsoft Edge"), ("EdgA/", "Microsoft Edge"),
                    ("OPR/", "Opera"), ("YaBrowser/", "Yandex"),
                    ("SamsungBrowser/", "Samsung Internet"))
# UA token -> Sec-CH-UA-Platform; Android before Linux (Android UAs say "Linux; Android").
_PLATFORMS = (("Windows", "Windows"), ("Android", "Android"), ("CrOS", "Chrome OS"),
              ("Macintosh", "macOS"), ("Linux", "Linux"), ("X11", "Linux"))
# Chromium sends client hints from version 89 on; the GREASE brand algorithm
# below (components/embedder_support/user_agent_utils.cc) is the one of 103+,
# older versions used the fixed brand " Not A;Brand" v99 first.
_HINTS_SINCE, _GREASE_SINCE = 89, 103
_GREASE_CHARS = (" ", "(", ":", "-", ".", "/", ")", ";", "=", "?", "_")
_GREASE_VERSIONS = ("8", "99", "24")
_GREASE_ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
_CHROME = re.compile(r"Chrome/(\d+)")
_FIREFOX = re.compile(r"Firefox/(\d+)")

#: Header names of the client hints an identity may carry.
HINT_HEADERS = ("Sec-CH-UA", "Sec-CH-UA-Mobile", "Sec-CH-UA-Platform")


@dataclass(frozen=True)
class Identity:
    """One browser as a site sees it: User-Agent plus the headers that go with it."""

    id: str                                  # short stable hash of the User-Agent
    user_agent: str
    family: str                              # chromium, firefox or safari
    headers: tuple[tuple[str, str], ...]     # Accept, Accept-Language, Accept-Encoding
    hints: tuple[tuple[str, str], ...]       # Sec-CH-UA*; empty but for Chromium

    def as_meta(self, with_hints: bool = True) -> dict:
        """The transient ``meta`` form (``id``, ``user_agent``, ``headers``)."""
        headers = dict(self.headers)
        if with_hints:
            headers.update(self.hints)
        return {"id": self.id, "user_agent": self.user_agent, "headers": headers}


def family_of(user_agent: str) -> str:
    """chromium, firefox or safari (WebKit: Safari and every iOS browser)."""
    if _CHROME.search(user_agent):
        return CHROMIUM
    if _FIREFOX.search(user_agent):
        return FIREFOX
    return SAFARI


def identity_for(user_agent: str, encodings: Sequence[str] = _ENCODINGS + ("zstd",)) -> Identity:
    """The identity of *user_agent*; *encodings*: those the client can decode."""
    family = family_of(user_agent)
    headers = dict(_HEADERS[family])
    headers["Accept-Encoding"] = ", ".join(
        e for e in _browser_encodings(family, user_agent) if e in encodings)
    digest = hashlib.blake2b(user_agent.encode(), digest_size=6).hexdigest()
    hints = chromium_hints(user_agent) if family == CHROMIUM else ()
    return Identity(digest, user_agent, family, tuple(headers.items()), hints)


def _browser_encodings(family: str, user_agent: str) -> tuple[str, ...]:
    match = (_CHROME if family == CHROMIUM else _FIREFOX).search(user_agent)
    since = _ZSTD_SINCE.get(family)
    if since is not None and match and int(match.group(1)) >= since:
        return _ENCODINGS + ("zstd",)
    return _ENCODINGS


def chromium_hints(user_agent: str) -> tuple[tuple[str, str], ...]:
    """``Sec-CH-UA``, ``-Mobile`` and ``-Platform`` as that Chromium sends them."""
    major = int(_CHROME.search(user_agent).group(1))
    if major < _HINTS_SINCE:
        return ()
    brand, brand_major = "Google Chrome", major
    for token, name in _CHROMIUM_BRANDS:
        found = re.search(re.escape(token) + r"(\d+)", user_agent)
        if found:
            brand, brand_major = name, int(found.group(1))
            break
    platform = _platform(user_agent)
    mobile = "?1" if "Mobile" in user_agent else "?0"
    return (("Sec-CH-UA", _brand_list(major, brand, brand_major)),
            ("Sec-CH-UA-Mobile", mobile), ("Sec-CH-UA-Platform", f'"{platform}"'))


def _platform(user_agent: str) -> str:
    return next((p for token, p in _PLATFORMS if token in user_agent), "Unknown")


def _brand_list(major: int, brand: str, brand_major: int) -> str:
    chromium, own = ("Chromium", major), (brand, brand_major)
    if major < _GREASE_SINCE:
        entries = [(" Not A;Brand", 99), chromium, own]
    else:  # the GREASE brand and the order both follow from the major version
        grease = (f"Not{_GREASE_CHARS[major % 11]}A{_GREASE_CHARS[(major + 1) % 11]}Brand",
                  _GREASE_VERSIONS[major % 3])
        entries = [None, None, None]
        order = _GREASE_ORDERS[major % 6]
        entries[order[0]], entries[order[1]], entries[order[2]] = grease, chromium, own
    return ", ".join(f'"{name}";v="{version}"' for name, version in entries)


# --------------------------------------------------------------------------- pool


@dataclass(frozen=True)
class PoolFilter:
    """fake-useragent's own filters; an empty tuple means "any"."""

    browsers: tuple[str, ...] = ()
    os: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    min_version: float = 0.0
    min_percentage: float = 0.0


def load_pool(flt: PoolFilter, encodings: Sequence[str] = _ENCODINGS + ("zstd",)
              ) -> tuple[Identity, ...]:
    """Every distinct User-Agent fake-useragent has for *flt*, sorted, as identities.

    Raises ``ValueError`` naming the known values when a filter names a
    browser, OS or platform the data does not have, or nothing matches."""
    from fake_useragent import UserAgent

    ua = UserAgent(browsers=flt.browsers or None, os=flt.os or None,
                   platforms=flt.platforms or None, min_version=flt.min_version,
                   min_percentage=flt.min_percentage)
    _check_names(ua.data_browsers, flt)
    # fake-useragent 2.2.0 (pinned) has no public "all matches" call; this is
    # the filter behind its .random, so the pool is exactly what it would draw from.
    # A few entries of the data file are wrapped in quotes: a tell-tale a site would see.
    agents = sorted({entry["useragent"].strip().strip('"') for entry in ua._filter_useragents()})
    # The data holds some made-up agents (an iPhone running "Chrome/39"): a
    # Chromium agent must name a platform Chromium runs on, or hints would lie.
    agents = [a for a in agents if family_of(a) != CHROMIUM or _platform(a) != "Unknown"]
    if not agents:
        raise ValueError(f"no User-Agent matches the identity filters {flt}")
    return tuple(identity_for(agent, encodings) for agent in agents)


def _check_names(data: Iterable[dict], flt: PoolFilter) -> None:
    data = list(data)
    for field, key in (("browsers", "browser"), ("os", "os"), ("platforms", "type")):
        known = {entry[key] for entry in data if entry.get(key)}
        unknown = [name for name in getattr(flt, field) if name not in known]
        if unknown:
            raise ValueError(f"unknown identity {field} {unknown}; known: {sorted(known)}")


def pick(pool: Sequence[Identity], session: str, bucket: int = 0, salt: str = "") -> Identity:
    """The identity of *session* in rotation *bucket*: a stable hash, the same on every node."""
    digest = hashlib.blake2b(f"{salt}\x1f{session}\x1f{bucket}".encode(), digest_size=8).digest()
    return pool[int.from_bytes(digest, "big") % len(pool)]
