"""The ground truth of a synthetic web: what a correct polite crawler does.

* :func:`classify`: the :class:`~devtools.synthweb.behaviours.Kind` of any
  request target on a site (required, noindex, gone, forbidden, trap,
  hostile, optional);
* :func:`must_fetch`: the finite set of pages a complete crawl answers
  (required + noindex + gone), per site;
* :func:`limits`: a site's politeness limit (the shortest interval between
  two requests and the most in flight, for the whole cluster): the crawler's
  ``DOWNLOAD_DELAY`` or the site's ``Crawl-delay`` (the larger), and
  ``CONCURRENT_REQUESTS_PER_DOMAIN``;
* :func:`ideal_seconds`: the shortest crawl those limits allow: the slowest
  site's expected requests, one interval apart (× the mean of the frontier's
  jitter, which only lengthens intervals: ``1 + jitter / 4``), plus the waits
  it asks for (``Retry-After``).

The readings, where RFC 9309 or practice leaves a choice, are the issue's
(#46) and those of Nutch, Heritrix and StormCrawler: a robots.txt reached
within five redirects applies to the original origin; more hops, a loop, or a
4xx mean "allow all"; 5xx means wait; the first 500 KiB are parsed; a path
segment repeated three times, a URL past 2083 characters, links of a
nofollow page and pages past a site's trap allowance are not fetched.
"""

from __future__ import annotations

from dataclasses import dataclass

from devtools.synthweb import table as T
from devtools.synthweb.behaviours import FEATURES, MUST_FETCH, Kind, canonical, classify_base


def classify(site, target: str) -> Kind:
    """The kind of *target* (path and query, as requested) on *site* (a
    :class:`~devtools.synthweb.server.RunningSite`)."""
    path = canonical(target).split("?", 1)[0]
    kind = classify_base(site, path)
    if kind is not None:
        return kind
    for name in site.spec.features:
        kind = FEATURES[name].classify(site, path)
        if kind is not None:
            return kind
    return Kind.OPTIONAL


def must_fetch(web) -> dict[tuple[str, str], Kind]:
    """``{(site, canonical path): kind}`` of every page a complete crawl answers."""
    out = {}
    for site in web.sites.values():
        for path, kind in site_must(site).items():
            out[(site.name, path)] = kind
    return out


def site_must(site) -> dict[str, Kind]:
    spec = site.spec
    if spec.redirect_all_to:
        return {}
    pages = {"/": Kind.REQUIRED, **{f"/p/{i}": Kind.REQUIRED for i in range(1, spec.pages + 1)}}
    if classify_base(site, "/private/1") is Kind.REQUIRED:
        pages["/private/1"] = Kind.REQUIRED
    for name in spec.features:
        pages.update(FEATURES[name].must(site))
    return {p: k for p, k in pages.items() if k in MUST_FETCH}


@dataclass(frozen=True)
class Limit:
    interval_s: float
    concurrency: int


def limits(spec, delay: float, concurrency: int) -> Limit:
    """*spec*'s politeness limit under the crawler's *delay* and *concurrency*."""
    return Limit(max(delay, spec.crawl_delay or 0.0), concurrency)


#: robots.txt requests a correct crawler sends to the site itself, per variant
ROBOTS_REQUESTS = {"redirect-same": 2, "chain": 4, "chain6": 6, "loop": 3,
                   "5xx-then-ok": T.ROBOTS_5XX_COUNT + 1, "redirect-scheme": 2}


def expected_requests(site) -> int:
    """Requests a correct crawl sends to *site* (robots.txt, its pages, the
    hops and hostile pages it cannot avoid, the redirects it answers)."""
    spec = site.spec
    web = site.web
    # aliases: one robots.txt and one home page, redirected
    count = sum(2 for other in web.sites.values() if other.spec.redirect_all_to == spec.name)
    if spec.redirect_all_to:
        return 2
    count += ROBOTS_REQUESTS.get(spec.robots, 1)
    count += sum(1 for other in web.sites.values() if other.spec.robots == "redirect-other"
                 and site is web.first)
    count += 1 + spec.pages + (1 if spec.http_to_https else 0)   # home (+ its http hop), pages
    count += 1 if classify_base(site, "/private/1") is Kind.REQUIRED else 0
    for name in spec.features:
        count += FEATURES[name].expected_requests(site)
    # chain hops passing through this site
    count += sum(1 for other in web.sites.values() if "chain" in other.spec.features
                 and spec.name in other.spec.chain_via)
    return count


def site_ideal_seconds(site, delay: float, concurrency: int, jitter: float,
                       download_timeout: float = 0.0) -> float:
    limit = limits(site.spec, delay, concurrency)
    waits = sum(FEATURES[name].wait_s(site) for name in site.spec.features)
    if site.spec.robots == "slow":
        waits += T.ROBOTS_SLOW_S
    if "drip" in site.spec.features:
        # the drip ends at the crawler's download deadline, no sooner
        waits += download_timeout
    return max(0, expected_requests(site) - 1) * limit.interval_s * (1 + jitter / 4) + waits


def ideal_seconds(web, delay: float, concurrency: int, jitter: float = 0.0,
                  download_timeout: float = 0.0) -> tuple[float, str]:
    """The shortest crawl the limits allow (*download_timeout*: the crawler's
    deadline, which a drip lasts), and the site that sets it."""
    return max((site_ideal_seconds(s, delay, concurrency, jitter, download_timeout), s.name)
               for s in web.sites.values())
