"""Which impersonation profile reproduces a User-Agent (no Scrapy, no network).

A *profile* is one of curl_cffi's native targets (``chrome131``,
``safari184_ios``...): the TLS ClientHello, HTTP/2 settings and header order of
one browser version. :func:`profile_for` maps a User-Agent string to the profile
of the same browser and version, or None when the library has none:

* Chrome: the same major version, an Android profile for an Android agent,
  the profile of the agent's OS when the library has one per OS (151, 152);
* Edge: Edge's own profile of that version, else Chrome's of the same
  Chromium version (Edge sends what Chromium's network stack sends; its own
  headers, client hints included, come from the identity);
* Firefox: the same major version (desktop agents only);
* Safari: the same version (``26.0.1``, else major.minor), iOS profiles for
  iPhone and iPad agents.

The table comes from curl_cffi itself (:func:`available_profiles`), so every
node with the same curl_cffi version maps a User-Agent to the same profile.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

EXTRA = "pip install '/path/to/checkout[impersonate]' (this package's checkout or wheel)"
_CHROME = re.compile(r"Chrome/(\d+)")
_EDGE = re.compile(r"Edg(?:e|A|iOS)?/(\d+)")
_FIREFOX = re.compile(r"Firefox/(\d+)")
_SAFARI = re.compile(r"Version/(\d+)\.(\d+)(?:\.(\d+))?.*Safari/")


class ImpersonationUnavailable(RuntimeError):
    """Impersonation was asked for, but curl_cffi is not installed."""


@dataclass(frozen=True)
class Profile:
    """One native target of the library."""

    name: str          # the target name passed to curl_cffi
    browser: str       # chrome, edge, firefox, safari, tor
    version: str       # "131", "18.4", "26.0.1"
    os: str            # Windows, macOS, Android, iOS


def load_library():
    """curl_cffi, or :class:`ImpersonationUnavailable` naming the extra."""
    try:
        import curl_cffi
    except ImportError as exc:
        raise ImpersonationUnavailable(
            f"IMPERSONATE_ENABLED needs curl_cffi ({exc}): {EXTRA}") from None
    return curl_cffi


@functools.lru_cache(maxsize=1)
def available_profiles() -> dict[str, Profile]:
    """curl_cffi's native targets by name (its deprecated aliases left out)."""
    load_library()
    from curl_cffi.fingerprints import NATIVE_IMPERSONATE_TARGETS

    return {t["target_name"]: Profile(t["target_name"], t["browser"].lower(),
                                      str(t["version"]).removesuffix(".0")
                                      if t["browser"] == "Firefox" else str(t["version"]),
                                      t["os"])
            for t in NATIVE_IMPERSONATE_TARGETS}


def profile_for(user_agent: str, profiles: dict[str, Profile] | None = None) -> str | None:
    """The profile that reproduces *user_agent*, or None (see the module docstring)."""
    if profiles is None:
        profiles = available_profiles()
    return _profile_for(user_agent, tuple(sorted(profiles.values(), key=lambda p: p.name)))


@functools.lru_cache(maxsize=4096)
def _profile_for(user_agent: str, profiles: tuple[Profile, ...]) -> str | None:
    os_name = _os(user_agent)
    chrome = _CHROME.search(user_agent)
    if chrome:
        edge = _EDGE.search(user_agent)
        if edge and os_name not in ("Android", "iOS"):
            found = _pick(profiles, "edge", edge.group(1), os_name)
            if found:
                return found
        return _pick(profiles, "chrome", chrome.group(1), os_name)
    firefox = _FIREFOX.search(user_agent)
    if firefox:
        return _pick(profiles, "firefox", firefox.group(1), os_name)
    safari = _SAFARI.search(user_agent)
    if safari and "Chromium" not in user_agent:
        major, minor, patch = safari.groups()
        for version in ([f"{major}.{minor}.{patch}"] if patch else []) + [f"{major}.{minor}"]:
            found = _pick(profiles, "safari", version, os_name)
            if found:
                return found
    return None


def _pick(profiles, browser: str, version: str, os_name: str) -> str | None:
    same = [p for p in profiles if p.browser == browser and p.version == version]
    mobile = os_name in ("Android", "iOS")
    if mobile:
        same = [p for p in same if p.os == os_name]
    else:
        same = [p for p in same if p.os not in ("Android", "iOS")]
    if not same:
        return None
    # A desktop browser's TLS and HTTP/2 do not depend on the desktop OS; where the
    # library has one profile per OS, take the agent's.
    exact = [p for p in same if p.os == os_name]
    return (exact or same)[0].name


def _os(user_agent: str) -> str:
    if "Android" in user_agent:
        return "Android"
    if "iPhone" in user_agent or "iPad" in user_agent:
        return "iOS"
    if "Macintosh" in user_agent or "Mac OS X" in user_agent:
        return "macOS"
    if "Windows" in user_agent:
        return "Windows"
    return "Linux"
