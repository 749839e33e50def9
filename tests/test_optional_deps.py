"""Optional packages stay optional (issue 47, "Dependencies").

A node installs only the package's own dependencies (pyproject.toml) and the
extras it uses: prometheus-client (``metrics``), price-parser and dateparser
(``items``), curl_cffi (``impersonate``), OpenTelemetry (``tracing``). So the
project's modules and every component its settings name must import without
them, and the component that needs one must say which extra to install.

One subprocess (about a second) imports them with those packages hidden: a
``sys.meta_path`` finder that answers "no such module" for them stands in for a
virtualenv they were never installed in (building one takes minutes; the wheel's
clean virtualenv in tests/test_install.py is that slower check).
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.crawl_helpers import ROOT

OPTIONAL = ("prometheus_client", "price_parser", "dateparser", "curl_cffi", "opentelemetry")

PROBE = r"""
import importlib, json, sys
from importlib.abc import MetaPathFinder

HIDDEN = set(sys.argv[1].split(","))

class Uninstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler
from crawlproject import settings as s

out = {}
# The modules a node imports, and every component the project's settings name.
for module in ("crawlproject.scheduler", "crawlproject.pipelines.mongo", "crawlproject.addon",
               "crawlproject.items", "crawlproject.spiders.products", "crawlproject.cli",
               "crawlproject.extensions.tracing", "crawlproject.impersonate"):
    importlib.import_module(module)
for path in [*s.DOWNLOADER_MIDDLEWARES, *s.SPIDER_MIDDLEWARES, *s.EXTENSIONS,
             *s.ITEM_PIPELINES, s.SCHEDULER]:
    load_object(path)
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)

# Each component that needs one names its extra.
from scrapy.exceptions import NotConfigured
from crawlproject.extensions.metrics import PrometheusMetrics
try:
    PrometheusMetrics.from_crawler(get_crawler(settings_dict={"METRICS_ENABLED": True}))
except NotConfigured as exc:
    out["metrics"] = str(exc)
from crawlproject.spiders.products import ProductsSpider
try:
    ProductsSpider.from_crawler(get_crawler(ProductsSpider))
except ImportError as exc:
    out["products"] = str(exc)
from crawlproject.items import parse_date, parse_price_amount
for name, call in (("price", lambda: parse_price_amount("12,50 EUR")),
                   ("date", lambda: parse_date("3 March 2024"))):
    try:
        call()
    except ImportError as exc:
        out[name] = str(exc)
out["iso_date"] = str(parse_date("2024-03-03"))  # no dateparser needed for ISO 8601
print(json.dumps(out))
"""


def test_a_node_without_the_optional_packages_imports_and_names_the_missing_extra():
    done = subprocess.run([sys.executable, "-c", PROBE, ",".join(OPTIONAL)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["loaded"] == [], out["loaded"]
    assert "pip install '/path/to/checkout[metrics]'" in out["metrics"], out
    for key in ("products", "price", "date"):
        assert "pip install '/path/to/checkout[items]'" in out[key], out
    assert out["iso_date"] == "2024-03-03 00:00:00+00:00", out


def test_without_the_probe_s_finder_the_packages_are_there():
    """The probe hides packages this virtualenv has (requirements-dev.txt): its
    names are real module names, so the test above hides something."""
    names = ",".join(OPTIONAL)
    done = subprocess.run([sys.executable, "-c", f"import {names}; print('ok')"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
