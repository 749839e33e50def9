"""A synthetic web: many small hostile-or-not sites on 127.0.0.x, with the
ground truth of a correct polite crawl known (issue 46).

* :mod:`~devtools.synthweb.table`: the table of behaviours (one
  :class:`SiteSpec` per site: a robots.txt variant, page features, a crawl
  delay, redirects of the whole site) and the benchmark's catalogue;
* :mod:`~devtools.synthweb.behaviours` (with :mod:`~devtools.synthweb.robots`,
  :mod:`~devtools.synthweb.features`, :mod:`~devtools.synthweb.pages`): one
  handler per behaviour, with what a correct crawler does with its pages
  (:class:`Kind`);
* :mod:`~devtools.synthweb.server`: :class:`SyntheticWeb` serves a table on
  127.0.0.40, .41, ... (http and https, self-signed; by address, or by
  ``<site>.synth.test`` in a network namespace), in a thread of the caller,
  and logs every request;
* :mod:`~devtools.synthweb.truth`: must-fetch pages, per-site limits, the
  ideal crawl time;
* :mod:`~devtools.synthweb.check`: a crawl's figures from the request log.

Development only (tests, ``python -m bench.web``); never in the wheel.
Manual use: ``python -m devtools.synthweb serve --sites 20 [--log]``.

In a test::

    from devtools.synthweb import SyntheticWeb, web
    from devtools.synthweb.check import politeness, score

    with SyntheticWeb(web(names=("to-slow",))) as synth:   # + the sites it needs
        ...  # crawl synth.seeds()
        figures = score(synth, synth.hits(), stored_urls, delay=1.0, concurrency=2)
        target = politeness(synth.site("slow-target"), synth.hits("slow-target"), 1.0, 2)
        assert target["min_gap_s"] >= 2.0
"""

from devtools.synthweb.behaviours import Kind
from devtools.synthweb.server import Hit, SyntheticWeb
from devtools.synthweb.table import SiteSpec, catalogue, web

__all__ = ["Hit", "Kind", "SiteSpec", "SyntheticWeb", "catalogue", "web"]
