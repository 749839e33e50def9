"""The table of behaviours: what each synthetic site does, as data.

A :class:`SiteSpec` is one site: a name, a robots.txt variant (:data:`ROBOTS`),
page features (:data:`FEATURES`), an optional crawl delay, and site-wide
switches (a redirect of every request to another site, http → https).
:func:`catalogue` is the table the benchmark crawls: one site per behaviour,
plus a few mixes; :func:`web` cuts or pads it to *n* sites.

What the variants mean for a correct crawler (RFC 9309, and what Nutch,
Heritrix or StormCrawler do) is in :mod:`devtools.synthweb.truth`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: robots.txt variants: name -> whether its rules (``Disallow: /private/``)
#: reach the crawler (True: they apply; False: "unavailable", allow all;
#: None: either reading is defensible, the rule's page is not counted).
ROBOTS = {
    "direct": True,          # 200 with the rules
    "redirect-same": True,   # 301 to /robots-2024.txt on the same host
    "redirect-other": True,  # 301 to another site's /robots-for/<name>.txt (apex -> www, CDN)
    "redirect-scheme": True,  # http 301 to the https origin's /robots.txt
    "chain": True,           # three 302s on the same host, then the rules
    "chain6": False,         # six 302s: more than five hops, "unavailable" (RFC 9309 2.3.1.2)
    "loop": False,           # 302 /r/a -> /r/b -> /r/a ...: unavailable
    "404": False,            # 4xx: allow all (RFC 9309 2.3.1.3)
    "403": False,
    "5xx-then-ok": True,     # 503 to its first ROBOTS_5XX_COUNT requests, then the rules
    "slow": True,            # the rules after ROBOTS_SLOW_S seconds
    "huge": True,            # the rules first, then > 500 KiB of comments, then /late/ (either)
    "gzip": True,            # Content-Encoding: gzip
    "gzip-bomb": None,       # the rules, then 64 MiB of comments, gzip (~140 KiB on the wire)
    "none": False,           # no robots.txt at all: 404 (a site-wide redirect's own)
}

#: page features a site can have (each a handler in :mod:`devtools.synthweb.behaviours`)
FEATURES = ("calendar", "repeat", "sessionid", "longurl", "bomb-gzip", "bomb-br", "drip",
            "headers", "flood", "cookies", "gone", "retry-after", "meta", "sitemap",
            "chain", "loop", "host-variants")


@dataclass(frozen=True)
class SiteSpec:
    """One synthetic site.

    ``pages``: plain pages ``/p/1..pages`` linked from the home page (each
    links the next one and home); ``robots``: a key of :data:`ROBOTS`;
    ``features``: keys of :data:`FEATURES`; ``crawl_delay``: a
    ``Crawl-delay`` line in its rules; ``redirect_all_to``: every request
    (robots.txt too) answers 301 to the same path on that site (apex ->
    www); ``https``: the site's own URLs are https (``http_to_https``: its
    http origin answers 301 to them); ``seed``: its home page is a seed
    (False for a site reached only through another one); ``chain_via``:
    the sites a ``chain``/``loop`` feature's redirects go through.
    """

    name: str
    robots: str = "direct"
    pages: int = 4
    features: tuple[str, ...] = ()
    crawl_delay: float | None = None
    redirect_all_to: str | None = None
    https: bool = False
    http_to_https: bool = False
    seed: bool = True
    chain_via: tuple[str, ...] = ()
    latency_ms: int = 0

    def __post_init__(self):
        if self.robots not in ROBOTS:
            raise ValueError(f"{self.name}: unknown robots variant {self.robots!r}")
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"{self.name}: unknown features {sorted(unknown)}")


#: tunables of the behaviours (the ground truth reads the same values)
ROBOTS_5XX_COUNT = 2
ROBOTS_SLOW_S = 2.0
ROBOTS_HUGE_BYTES = 600 * 1024
RETRY_AFTER_S = 3
RETRY_AFTER_COUNT = 2
BOMB_BYTES = 64 * 2**20
DRIP_INTERVAL_S = 0.5
DRIP_MAX_S = 600.0
HEADER_COUNT = 10_000
FLOOD_LINKS = 100_000
CALENDAR_MONTHS = 3          # months with events (2026-01..); the rest of the calendar is a trap
#: trap pages (calendar months without events, flood targets, loop hops) a
#: correct crawler may still fetch on one site before its budget stops it
TRAP_ALLOWANCE = 20


def catalogue() -> list[SiteSpec]:
    """One site per behaviour (the first rows matter most: :func:`web` with a
    small *n* keeps them), then mixes."""
    rows = [
        SiteSpec("control", pages=8),
        SiteSpec("robots-redirect-same", robots="redirect-same"),
        SiteSpec("robots-redirect-other", robots="redirect-other"),
        SiteSpec("robots-chain", robots="chain"),
        SiteSpec("apex", robots="none", redirect_all_to="www"),
        SiteSpec("www", pages=4, seed=False),
        SiteSpec("scheme", http_to_https=True, https=True, robots="redirect-scheme"),
        SiteSpec("robots-loop", robots="loop"),
        SiteSpec("robots-404", robots="404"),
        SiteSpec("robots-403", robots="403"),
        SiteSpec("robots-5xx", robots="5xx-then-ok"),
        SiteSpec("robots-slow", robots="slow"),
        SiteSpec("robots-huge", robots="huge"),
        SiteSpec("robots-gzip", robots="gzip"),
        SiteSpec("crawl-delay", crawl_delay=2.0, pages=4),
        SiteSpec("host-variants", features=("host-variants",)),
        SiteSpec("meta", features=("meta",)),
        SiteSpec("sessionid", features=("sessionid",)),
        SiteSpec("repeat", features=("repeat",)),
        SiteSpec("longurl", features=("longurl",)),
        SiteSpec("gone", features=("gone",)),
        SiteSpec("retry-after", features=("retry-after",)),
        SiteSpec("cookies", features=("cookies",)),
        SiteSpec("bombs", features=("bomb-gzip", "bomb-br")),
        SiteSpec("redirect-chain", features=("chain",), chain_via=("hop-a", "hop-b")),
        SiteSpec("hop-a", pages=1),
        SiteSpec("hop-b", pages=1),
        SiteSpec("redirect-loop", features=("loop",), chain_via=("hop-a",)),
        SiteSpec("to-slow", robots="none", redirect_all_to="slow-target"),
        SiteSpec("slow-target", crawl_delay=2.0, pages=3, seed=False),
        SiteSpec("calendar", features=("calendar",)),
        SiteSpec("sitemap", features=("sitemap",)),
        SiteSpec("robots-chain6", robots="chain6"),
        SiteSpec("robots-gzip-bomb", robots="gzip-bomb"),
        SiteSpec("headers", features=("headers",)),
        SiteSpec("drip", features=("drip",)),
        SiteSpec("flood", features=("flood",)),
        # a mix: several behaviours on one site, as real sites have
        SiteSpec("mix", robots="redirect-same", crawl_delay=1.5,
                 features=("meta", "sessionid", "gone", "cookies")),
    ]
    return rows


#: the sites of ``--quick``: every robots.txt redirect kind, a host alias, the
#: scheme redirect, meta robots, session ids, a trap, a bomb, Retry-After, crawl delay
QUICK = ("control", "robots-redirect-same", "robots-redirect-other", "robots-chain", "apex",
         "www", "scheme", "robots-loop", "robots-404", "robots-5xx", "robots-gzip",
         "crawl-delay", "host-variants", "meta", "sessionid", "repeat", "longurl", "gone", "retry-after",
         "bombs", "redirect-chain", "hop-a", "hop-b", "to-slow", "slow-target")


def web(n: int | None = None, names: tuple[str, ...] | None = None) -> list[SiteSpec]:
    """*n* sites: the first *n* rows of :func:`catalogue` (plus the sites they
    redirect through), padded with plain sites ``plain-K`` when *n* is larger;
    or the rows named in *names*."""
    rows = catalogue()
    if names is not None:
        chosen = [r for r in rows if r.name in names]
    else:
        n = len(rows) if n is None else n
        chosen = rows[:n] + [SiteSpec(f"plain-{k}", pages=4 + k % 5)
                             for k in range(max(0, n - len(rows)))]
    return close_over(chosen, rows)


def close_over(chosen: list[SiteSpec], rows: list[SiteSpec]) -> list[SiteSpec]:
    """*chosen* plus every site it needs (redirect targets, chain hops, the
    first site, which serves other sites' redirected robots.txt)."""
    by_name = {r.name: r for r in rows}
    out = {r.name: r for r in chosen}
    todo = list(chosen)
    if rows[0].name not in out:
        out[rows[0].name] = rows[0]
    while todo:
        spec = todo.pop()
        for name in (spec.redirect_all_to, *spec.chain_via):
            if name and name not in out:
                out[name] = by_name[name]
                todo.append(by_name[name])
    order = [r.name for r in rows]
    return sorted(out.values(), key=lambda r: order.index(r.name) if r.name in order
                  else len(order) + int(r.name.rsplit("-", 1)[1]))


def with_changes(spec: SiteSpec, **changes) -> SiteSpec:
    """A copy of *spec* with *changes* (a test's own variant of a row)."""
    return replace(spec, **changes)


__all__ = ["ROBOTS", "FEATURES", "SiteSpec", "catalogue", "web", "QUICK", "close_over",
           "with_changes"]
