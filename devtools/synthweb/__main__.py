"""``python -m devtools.synthweb serve [--sites N | --quick] [--port P]``:
serve the synthetic web until Ctrl-C, printing every site's seed URL, its
behaviour and its must-fetch pages; ``--log`` prints each request as it comes."""

from __future__ import annotations

import argparse
import time

from devtools.synthweb import table
from devtools.synthweb.server import SyntheticWeb
from devtools.synthweb.truth import ideal_seconds, limits, site_must


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.synthweb")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the sites until interrupted")
    serve.add_argument("--sites", type=int, default=None, help="how many sites (default: all)")
    serve.add_argument("--quick", action="store_true", help="the benchmark's --quick table")
    serve.add_argument("--port", type=int, default=None,
                       help="http on PORT, https on PORT+1 of every address (default: free ports)")
    serve.add_argument("--sitemaps", action="store_true", help="sitemap-only pages are required")
    serve.add_argument("--log", action="store_true", help="print every request")
    args = parser.parse_args(argv)
    specs = table.web(names=table.QUICK) if args.quick else table.web(args.sites)
    with SyntheticWeb(specs, sitemaps=args.sitemaps, port=args.port) as synth:
        for site in synth.sites.values():
            spec = site.spec
            what = ", ".join(filter(None, [f"robots {spec.robots}", *spec.features,
                                           spec.redirect_all_to and f"-> {spec.redirect_all_to}",
                                           spec.http_to_https and "http -> https"]))
            print(f"{site.seed():32} {spec.name:24} {what}; interval "
                  f"{limits(spec, 1.0, 2).interval_s:g}s; must fetch {len(site_must(site))}"
                  + ("" if spec.seed else " (not a seed)"), flush=True)
        ideal, slowest = ideal_seconds(synth, 1.0, 2)
        print(f"ideal crawl at DOWNLOAD_DELAY=1: {ideal:.1f}s ({slowest}); Ctrl-C to stop",
              flush=True)
        shown = 0
        try:
            while True:
                time.sleep(0.5)
                if args.log:
                    hits = synth.hits()
                    for hit in hits[shown:]:
                        print(f"{hit.t:.3f} {hit.site} {hit.method} {hit.target[:100]} "
                              f"{hit.status}", flush=True)
                    shown = len(hits)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
