"""Score a crawl of a synthetic web from the sites' own request log.

:func:`score` compares what the sites saw (and, given the stored items'
URLs, what was stored) with the ground truth (:mod:`devtools.synthweb.truth`):

* ``fetched_ratio``: must-fetch pages answered ÷ must-fetch pages (1.0);
* ``forbidden``: requests to pages a correct crawler never requests (0);
* ``trap_over``: trap pages requested past TRAP_ALLOWANCE, summed over sites (0);
* ``duplicates``: a must-fetch page answered more than once (0), and of
  them ``seed_refetches``: a seed's page fetched again through a link;
* ``credentials_sent`` / ``credentials_stored``: requests that carried an
  ``Authorization`` header (the sites never ask for one: it came from a
  link's ``user:secret@``), item URLs with userinfo (0);
* ``stored_ratio`` / ``wrongly_stored``: required pages stored ÷ required;
  items of pages never to be stored (noindex, gone, forbidden, hostile);
* ``peak_over_limit``: per site, the larger of interval ÷ shortest gap
  between two requests and most in flight ÷ concurrency (≤ 1.0), every
  request counted (robots.txt, redirects, errors);
* ``retry_after_ratio``: per 429 with ``Retry-After``, the wait before the
  site's next request ÷ the time asked (≥ 1.0);
* ``elapsed_s``: first request to last response finished, over all sites.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from urllib.parse import urlsplit

from devtools.demo.hosts import max_overlap
from devtools.synthweb import table as T
from devtools.synthweb.behaviours import NEVER_STORED, Kind, canonical
from devtools.synthweb.truth import classify, limits, must_fetch

#: what "answered" means for a must-fetch page
ANSWERED = {Kind.REQUIRED: (200,), Kind.NOINDEX: (200,), Kind.GONE: (404, 410)}


def score(web, hits, stored_urls=None, delay: float = 1.0, concurrency: int = 2) -> dict:
    """The figures of one crawl (*hits*: :meth:`SyntheticWeb.hits`;
    *stored_urls*: URLs of the stored items, or None when not checked)."""
    must = must_fetch(web)
    answered: Counter = Counter()
    forbidden: list[str] = []
    traps: Counter = Counter()
    by_site = defaultdict(list)
    for hit in hits:
        site = web.sites[hit.site]
        by_site[hit.site].append(hit)
        kind = classify(site, hit.target)
        key = (hit.site, canonical(hit.target).split("?", 1)[0])
        if kind is Kind.FORBIDDEN:
            forbidden.append(f"{hit.site}{hit.target[:80]}")
        elif kind is Kind.TRAP:
            traps[hit.site] += 1
        if key in must and hit.status in ANSWERED[must[key]]:
            answered[key] += 1
    missing = sorted(k for k in must if not answered[k])
    dupes = {f"{s}{p}": n - 1 for (s, p), n in answered.items() if n > 1}
    seeds = {f"{s.name}/" for s in web.sites.values() if s.spec.seed}
    per_site = {name: politeness(web.sites[name], by_site.get(name, []), delay, concurrency)
                for name in web.sites}
    for name, row in per_site.items():
        row["must"] = sum(1 for (s, _) in must if s == name)
        row["answered"] = sum(1 for (s, p) in must if s == name and answered[(s, p)])
        row["trap"] = traps[name]
    worst = max(per_site, key=lambda n: per_site[n]["peak_over_limit"])
    ra = [r["retry_after_ratio"] for r in per_site.values() if r["retry_after_ratio"] is not None]
    times = [h.t for h in hits] + [h.done for h in hits if h.done is not None]
    out = {
        "must_fetch": len(must), "answered": len(must) - len(missing),
        "fetched_ratio": (len(must) - len(missing)) / len(must) if must else 1.0,
        "missing": [f"{s}{p}" for s, p in missing],
        "forbidden": len(forbidden), "forbidden_examples": forbidden[:10],
        "trap_fetched": sum(traps.values()),
        "trap_over": sum(max(0, n - T.TRAP_ALLOWANCE) for n in traps.values()),
        "duplicates": sum(dupes.values()), "duplicate_examples": dict(list(dupes.items())[:10]),
        "seed_refetches": sum(n for key, n in dupes.items() if key in seeds),
        "credentials_sent": sum(1 for h in hits if "authorization" in h.headers),
        "peak_over_limit": per_site[worst]["peak_over_limit"], "worst_site": worst,
        "retry_after_ratio": min(ra) if ra else None,
        "requests": len(hits),
        "elapsed_s": (max(times) - min(h.t for h in hits)) if hits else None,
        "per_site": per_site,
    }
    if stored_urls is not None:
        out.update(stored(web, must, stored_urls))
    return out


def _robots_path(target: str) -> bool:
    """A path robots.txt is served at or redirected through (devtools.synthweb.robots)."""
    path = target.split("?", 1)[0]
    return path.startswith(("/robots", "/r/"))


def politeness(site, hits, delay: float, concurrency: int) -> dict:
    """Shortest gap, most in flight and Retry-After waits on one site."""
    limit = limits(site.spec, delay, concurrency)
    times = sorted(h.t for h in hits)
    gaps = [b - a for a, b in zip(times, times[1:])]
    min_gap = min(gaps, default=None)
    in_flight = max_overlap((h.t, h.done) for h in hits)
    # A Crawl-delay binds from when the robots.txt saying it was served: the
    # requests before (robots.txt itself, the hops of its redirects) can only
    # keep the base interval.
    known = min((h.done or h.t for h in hits if h.status == 200 and _robots_path(h.target)),
                default=float("inf"))
    gap_ratio = max((((limit.interval_s if b >= known else min(delay, limit.interval_s)) / (b - a)
                      if b > a else float("inf")) for a, b in zip(times, times[1:])),
                    default=0.0)
    ratios = []
    for hit in hits:
        asked = hit.response.get("Retry-After")
        if hit.status in (429, 503) and asked and asked.isdigit() and int(asked) > 0:
            later = [t for t in times if t > hit.t]
            if later:
                ratios.append((later[0] - (hit.done or hit.t)) / int(asked))
    return {"requests": len(hits), "interval_s": limit.interval_s,
            "concurrency": limit.concurrency, "min_gap_s": min_gap, "in_flight": in_flight,
            "gap_ratio": gap_ratio,
            "peak_over_limit": max(gap_ratio, in_flight / limit.concurrency),
            "retry_after_ratio": min(ratios) if ratios else None}


def stored(web, must, urls) -> dict:
    """Required pages stored, and items that should not exist."""
    required = {k for k, kind in must.items() if kind is Kind.REQUIRED}
    seen, wrong, credentials = set(), [], 0
    for url in urls:
        parts = urlsplit(url)
        credentials += "@" in parts.netloc
        site = web.site_of(parts.netloc)
        if site is None:
            wrong.append(url)
            continue
        target = parts.path + ("?" + parts.query if parts.query else "")
        key = (site.name, canonical(target).split("?", 1)[0])
        seen.add(key)
        if classify(site, target) in NEVER_STORED:
            wrong.append(url)
    return {"stored": len(seen & required), "stored_ratio": len(seen & required) / len(required)
            if required else 1.0, "not_stored": sorted(f"{s}{p}" for s, p in required - seen)[:20],
            "wrongly_stored": len(wrong), "wrongly_stored_examples": wrong[:10],
            "credentials_stored": credentials}
