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
    "crawlproject.middlewares.politeness.FrontierPolitenessMiddleware":
        "crawlproject.middlewares.slowdown.FrontierPolitenessMiddleware",
    "crawlproject.middlewares.politeness.retry_after_seconds":
        "crawlproject.middlewares.slowdown.retry_after_seconds",
}

#: The modules left at the old paths.
SHIMS = ["crawlproject.middlewares.identity", "crawlproject.middlewares.sessioncookies",
         "crawlproject.middlewares.session", "crawlproject.middlewares.proxy",
         "crawlproject.middlewares.rendering", "crawlproject.middlewares.recrawl",
         "crawlproject.extensions.recrawl", "crawlproject.middlewares.politeness"]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_loads_the_same_object_as_the_new_one(old):
    assert load_object(old) is load_object(MOVED[old])


def _warning_call(node) -> str | None:
    """The new path of a ``moved(__name__, "new.path")`` statement, else None."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
            and getattr(node.value.func, "id", None) == "moved":
        return ast.literal_eval(node.value.args[1])
    return None


@pytest.mark.parametrize("name", SHIMS)
def test_an_old_module_only_re_exports_and_warns(name):
    module = importlib.import_module(name)
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    docstring, helper, *rest = tree.body
    assert "Moved to" in ast.literal_eval(docstring.value)
    assert isinstance(helper, ast.ImportFrom) and helper.module == "crawlproject.deprecation"
    *imports, warning = rest
    assert all(isinstance(node, ast.ImportFrom) or (isinstance(node, ast.Assign)
               and [t.id for t in node.targets] == ["__all__"]) for node in imports)
    assert _warning_call(warning) == imports[0].module
    for exported in module.__all__:
        source = importlib.import_module(imports[0].module)
        assert getattr(module, exported) is getattr(source, exported)


@pytest.mark.parametrize("name", SHIMS)
def test_an_old_path_warns_with_its_new_path_and_the_version_that_removes_it(name):
    from crawlproject.deprecation import REMOVED_IN, CrawlprojectDeprecationWarning

    module = importlib.import_module(name)
    with pytest.warns(CrawlprojectDeprecationWarning) as caught:
        importlib.reload(module)   # the import a settings file's old path makes
    message = str(caught[0].message)
    new = next(path for old, path in MOVED.items() if old.rsplit(".", 1)[0] == name)
    assert new.rsplit(".", 1)[0] in message and REMOVED_IN in message and name in message
    assert issubclass(CrawlprojectDeprecationWarning, DeprecationWarning)


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
