"""A synthetic web: many small hostile-or-not sites on 127.0.0.x, with the
ground truth of a correct polite crawl known (issue 46).

* :mod:`~devtools.synthweb.table`: the table of behaviours (one
  :class:`SiteSpec` per site: a robots.txt variant, page features, a crawl
  delay, redirects of the whole site) and the benchmark's catalogue;
* :mod:`~devtools.synthweb.behaviours`: one handler per behaviour, with what
  a correct crawler does with its pages (:class:`Kind`);
* :mod:`~devtools.synthweb.server`: :class:`SyntheticWeb` serves a table on
  127.0.0.40, .41, ... (http and https, self-signed), in a thread of the
  caller, and logs every request;
* :mod:`~devtools.synthweb.truth`: must-fetch pages, per-site limits, the
  ideal crawl time;
* :mod:`~devtools.synthweb.check`: a crawl's figures from the request log.

Development only (tests, ``python -m bench.web``); never in the wheel.
Manual use: ``python -m devtools.synthweb serve --sites 20``.
"""

from devtools.synthweb.behaviours import Kind
from devtools.synthweb.server import Hit, SyntheticWeb
from devtools.synthweb.table import SiteSpec, catalogue, web

__all__ = ["Hit", "Kind", "SiteSpec", "SyntheticWeb", "catalogue", "web"]
