"""robots.txt: one answer per variant of :data:`devtools.synthweb.table.ROBOTS`.

``/robots.txt`` per the site's variant, and the paths the variants go
through: ``/robots-2024.txt`` (moved on the same host), ``/r/N`` and
``/r/a``/``/r/b`` (chains and a loop), ``/robots-for/<site>.txt`` (another
site's rules, served by the first site: a redirect to another host).
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from functools import lru_cache

from aiohttp import web

from devtools.synthweb import table as T
from devtools.synthweb.pages import page, redirect



def rules(site) -> str:
    """The site's robots.txt rules (wherever they are served from)."""
    spec = site.spec
    lines = ["User-agent: *", "Disallow: /private/"]
    if spec.crawl_delay:
        lines.append(f"Crawl-delay: {spec.crawl_delay:g}")
    if "sitemap" in spec.features:
        lines.append(f"Sitemap: {site.origin()}/sitemap-index.xml")
    return "\n".join(lines) + "\n"


def _text(body: str | bytes, **headers) -> web.Response:
    body = body.encode() if isinstance(body, str) else body
    return web.Response(body=body, content_type="text/plain", headers=headers or None)


@lru_cache(maxsize=None)
def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, 6)


@lru_cache(maxsize=4)
def _gzip_padded(head: bytes, size: int) -> bytes:
    """*head* then comment lines up to *size* bytes, gzip-compressed (streamed:
    the padding is never whole in memory)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(head)]
    chunk = (b"#" * 1023 + b"\n") * 1024
    left = size - len(head)
    while left > 0:
        out.append(z.compress(chunk[:left]))
        left -= len(chunk)
    out.append(z.flush())
    return b"".join(out)


def huge_robots(site) -> bytes:
    """The rules, comments past 500 KiB, then a rule beyond what a crawler must parse."""
    head = rules(site).encode()
    pad = (b"# padding, padding, padding, padding, padding, padding, padding.\n"
           * (T.ROBOTS_HUGE_BYTES // 64 + 1))[: T.ROBOTS_HUGE_BYTES - len(head)]
    return head + pad + b"Disallow: /late/\n"


async def answer_robots(site, request, path: str) -> web.StreamResponse | None:
    """robots.txt and the paths its variants redirect through; ``None`` for others."""
    spec, variant = site.spec, site.spec.robots
    if path.startswith("/robots-for/") and path.endswith(".txt"):
        other = site.web.sites.get(path[len("/robots-for/"):-4])
        return _text(rules(other)) if other else page("Not found", status=404)
    if path == "/robots-2024.txt" and variant == "redirect-same":
        return _text(rules(site))
    if path.startswith("/r/") and variant in ("chain", "chain6", "loop"):
        return _robots_hop(site, path[3:])
    if path != "/robots.txt":
        return None
    n = site.count("robots")
    if variant == "direct":
        return _text(rules(site))
    if variant == "redirect-same":
        return redirect("/robots-2024.txt")
    if variant == "redirect-other":
        first = site.web.first
        return redirect(f"{first.origin()}/robots-for/{spec.name}.txt")
    if variant == "redirect-scheme":
        if request.scheme == "http":
            return redirect(f"{site.origin('https')}/robots.txt")
        return _text(rules(site))
    if variant in ("chain", "chain6"):
        return redirect("/r/1", 302)
    if variant == "loop":
        return redirect("/r/a", 302)
    if variant in ("404", "none"):
        return page("Not found", status=404)
    if variant == "403":
        return page("Forbidden", status=403)
    if variant == "5xx-then-ok":
        if n <= T.ROBOTS_5XX_COUNT:
            return page("Unavailable", status=503)
        return _text(rules(site))
    if variant == "slow":
        await asyncio.sleep(T.ROBOTS_SLOW_S)
        return _text(rules(site))
    if variant == "huge":
        return _text(huge_robots(site))
    if variant == "gzip":
        return _text(_gzip(rules(site).encode()), **{"Content-Encoding": "gzip"})
    if variant == "gzip-bomb":
        return _text(_gzip_padded(rules(site).encode(), T.BOMB_BYTES),
                     **{"Content-Encoding": "gzip"})
    raise AssertionError(variant)


def _robots_hop(site, rest: str) -> web.Response:
    variant = site.spec.robots
    if variant == "loop":
        return redirect("/r/b" if rest == "a" else "/r/a", 302)
    hops = 3 if variant == "chain" else 6
    k = int(rest) if rest.isdigit() else hops
    if k < hops:
        return redirect(f"/r/{k + 1}", 302)
    return _text(rules(site))


def robots_apply(spec) -> bool | None:
    """Whether the site's own rules reach a correct crawler (see ROBOTS)."""
    if spec.redirect_all_to:
        return None   # the site serves nothing of its own
    return T.ROBOTS[spec.robots]
