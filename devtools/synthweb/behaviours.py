"""One handler per behaviour, each with its ground truth next to it (the
robots.txt variants in :mod:`~devtools.synthweb.robots`, the page features in
:mod:`~devtools.synthweb.features`; this module: the base pages every site
has, the redirect hops between sites, and the registry).

Every site has the *base* pages: ``/`` (links ``/p/1..pages``, ``/private/1``
and each feature's entry points), ``/p/N`` (links the next page and home) and
``/private/1`` (disallowed by the site's rules, when they reach the crawler).
robots.txt is answered by :func:`answer_robots` per the site's variant; each
feature of :data:`FEATURES` is a :class:`Feature` owning a path prefix: it
answers its paths, names the links the home page carries, and classifies its
paths into a :class:`Kind` (what a correct crawler does with them).

Handlers take the site (:class:`devtools.synthweb.server.RunningSite`: its
spec, origins and counters) and the aiohttp request, and return an aiohttp
response (or ``None``: not theirs).
"""

from __future__ import annotations

import re

from aiohttp import web

from devtools.synthweb import table as T
from devtools.synthweb.features import FEATURES, Bomb, Feature, _flood_page, bomb_body
from devtools.synthweb.pages import (MUST_FETCH, NEVER_STORED, SESSION_PARAMS, Kind, canonical,
                                     html, links, page, redirect)
from devtools.synthweb.robots import _gzip_padded, answer_robots, robots_apply, rules

__all__ = ["FEATURES", "Feature", "Kind", "MUST_FETCH", "NEVER_STORED", "SESSION_PARAMS",
           "answer_base", "answer_hops", "answer_robots", "canonical", "classify_base",
           "home_links", "html", "links", "page", "prepare", "redirect", "robots_apply", "rules"]


async def answer_hops(site, request, path: str) -> web.StreamResponse | None:
    """Chain and loop hops, served by every site (a chain passes through sites
    that have no feature of their own)."""
    if path.startswith("/_r/"):
        names = path[4:].split("/")
        if names == ["end"]:
            return page("End of the chain", ["/"])
        target = site.web.sites.get(names[0])
        if target is None or len(names) < 2:
            return page("Not found", status=404)
        rest = "/".join(names[1:])
        return redirect(f"{target.origin()}/_r/{rest}", 302)
    if path.startswith("/_loop/"):
        parts = path[7:].split("/")
        if len(parts) == 2 and parts[1] in site.web.sites:
            return redirect(f"{site.web.sites[parts[1]].origin()}/_loop/{parts[1]}/{parts[0]}",
                            302)
        return page("Not found", status=404)
    return None


def prepare(site) -> None:
    """Make *site*'s costly bodies now (bombs, flood, huge robots.txt), before
    serving: made on first request, they would stall the loop for ~0.3 s and
    skew the arrival times the log records."""
    spec = site.spec
    for name in spec.features:
        if isinstance(FEATURES[name], Bomb):
            bomb_body(FEATURES[name].encoding)
    if "flood" in spec.features:
        _flood_page()
    if spec.robots == "gzip-bomb":
        _gzip_padded(rules(site).encode(), T.BOMB_BYTES)


# -- the base pages -------------------------------------------------------------------


def home_links(site) -> list[str]:
    spec = site.spec
    hrefs = [f"/p/{i}" for i in range(1, spec.pages + 1)] + ["/private/1"]
    if spec.robots == "huge":
        hrefs.append("/late/1")
    for name in spec.features:
        hrefs += FEATURES[name].entry(site)
    return hrefs


async def answer_base(site, request, path: str) -> web.StreamResponse | None:
    spec = site.spec
    if path == "/":
        return page(f"{spec.name} home", home_links(site))
    m = re.fullmatch(r"/p/(\d+)", path)
    if m and 1 <= int(m.group(1)) <= spec.pages:
        i = int(m.group(1))
        return page(f"{spec.name} page {i}", [f"/p/{i % spec.pages + 1}", "/"])
    if path in ("/private/1", "/late/1"):
        return page(f"{spec.name} {path}", ["/"])
    return None


def classify_base(site, path: str) -> Kind | None:
    spec = site.spec
    if spec.redirect_all_to or (path.startswith(("/robots", "/r/")) and path.endswith(".txt")):
        return Kind.OPTIONAL
    if path.startswith("/r/") and spec.robots in ("chain", "chain6", "loop"):
        return Kind.OPTIONAL
    if path.startswith("/_loop/"):
        return Kind.TRAP
    if path.startswith("/_r/"):
        return Kind.REQUIRED if path == "/_r/end" and "chain" in spec.features else Kind.OPTIONAL
    if path == "/" or (re.fullmatch(r"/p/(\d+)", path)
                       and 1 <= int(path[3:]) <= spec.pages):
        return Kind.REQUIRED
    if path == "/private/1":
        applies = robots_apply(spec)
        return Kind.FORBIDDEN if applies else Kind.REQUIRED if applies is False else Kind.OPTIONAL
    if path == "/late/1" and spec.robots == "huge":
        return Kind.OPTIONAL   # past 500 KiB: a crawler may or may not read that rule
    return None
