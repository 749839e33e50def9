"""Settings written before the layout of issue 37 keep working: every component
path they could name loads the same object as its new path, and the modules
left at the old paths are re-exports only."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from scrapy.utils.misc import load_object

ROOT = Path(__file__).resolve().parents[1]

#: Old dotted path (as settings name it) -> the path it moved to.
MOVED = {
    "crawlproject.middlewares.identity.IdentityMiddleware":
        "crawlproject.identity.middleware.IdentityMiddleware",
    "crawlproject.middlewares.sessioncookies.SessionCookiesMiddleware":
        "crawlproject.identity.cookies.SessionCookiesMiddleware",
    "crawlproject.middlewares.sessioncookies.SessionCookiesSpiderMiddleware":
        "crawlproject.identity.cookies.SessionCookiesSpiderMiddleware",
    "crawlproject.middlewares.session.session_key": "crawlproject.identity.session.session_key",
    "crawlproject.identity.node_id": "crawlproject.node.node_id",
    "crawlproject.middlewares.proxy.ProxyPoolMiddleware":
        "crawlproject.proxies.middleware.ProxyPoolMiddleware",
    "crawlproject.proxies.parse_proxy": "crawlproject.proxies.pool.parse_proxy",
    "crawlproject.proxies.BanRules": "crawlproject.proxies.pool.BanRules",
    "crawlproject.middlewares.rendering.RenderingMiddleware":
        "crawlproject.rendering.middleware.RenderingMiddleware",
    "crawlproject.middlewares.rendering.RenderIfMissingMiddleware":
        "crawlproject.rendering.middleware.RenderIfMissingMiddleware",
    "crawlproject.rendering.RenderingAddon": "crawlproject.rendering.addon.RenderingAddon",
    "crawlproject.rendering.RenderingDownloadHandler":
        "crawlproject.rendering.addon.RenderingDownloadHandler",
    "crawlproject.rendering.browser_headers": "crawlproject.rendering.addon.browser_headers",
    "crawlproject.middlewares.recrawl.RecrawlMiddleware":
        "crawlproject.recrawl.middleware.RecrawlMiddleware",
    "crawlproject.middlewares.recrawl.RecrawlSpiderMiddleware":
        "crawlproject.recrawl.middleware.RecrawlSpiderMiddleware",
    "crawlproject.extensions.recrawl.RecrawlFeeder": "crawlproject.recrawl.extension.RecrawlFeeder",
    "crawlproject.recrawl.PageVisit": "crawlproject.recrawl.schedule.PageVisit",
    "crawlproject.recrawl.GoneMark": "crawlproject.recrawl.schedule.GoneMark",
}

#: The modules left at the old paths.
SHIMS = ["crawlproject.middlewares.identity", "crawlproject.middlewares.sessioncookies",
         "crawlproject.middlewares.session", "crawlproject.middlewares.proxy",
         "crawlproject.middlewares.rendering", "crawlproject.middlewares.recrawl",
         "crawlproject.extensions.recrawl"]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_loads_the_same_object_as_the_new_one(old):
    assert load_object(old) is load_object(MOVED[old])


@pytest.mark.parametrize("name", SHIMS)
def test_an_old_module_only_re_exports(name):
    module = importlib.import_module(name)
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    docstring, *rest = tree.body
    assert "Moved to" in ast.literal_eval(docstring.value)
    assert all(isinstance(node, ast.ImportFrom) or (isinstance(node, ast.Assign)
               and [t.id for t in node.targets] == ["__all__"]) for node in rest)
    for exported in module.__all__:
        source = importlib.import_module(rest[0].module)
        assert getattr(module, exported) is getattr(source, exported)


def test_the_rendering_addon_adds_no_middleware_named_by_its_old_path():
    from scrapy.settings import Settings
    from scrapy.utils.conf import build_component_list

    from crawlproject.rendering import RenderingAddon

    settings = Settings({"DOWNLOADER_MIDDLEWARES": {
        "crawlproject.middlewares.rendering.RenderingMiddleware": 620}})
    RenderingAddon().update_settings(settings)
    components = [load_object(c) for c in
                  build_component_list(settings.getwithbase("DOWNLOADER_MIDDLEWARES"))]
    assert components.count(load_object(MOVED[
        "crawlproject.middlewares.rendering.RenderingMiddleware"])) == 1
    assert components.count(load_object(MOVED[
        "crawlproject.middlewares.rendering.RenderIfMissingMiddleware"])) == 1
