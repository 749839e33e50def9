"""JavaScript rendering with the system Chromium (scrapy-playwright), for this
project or any Scrapy project: ``ADDONS = {"crawlproject.rendering.RenderingAddon": 0}``.

* :mod:`~crawlproject.rendering.addon`: the add-on, the download handler, the
  browser context pool, Chromium's path and flags;
* :mod:`~crawlproject.rendering.middleware`: ``RenderingMiddleware`` (620) and
  ``RenderIfMissingMiddleware`` (585), which decide what is rendered and how;
* :mod:`~crawlproject.rendering.settings`: the settings both read, with no
  Playwright import.

The add-on's names (``crawlproject.rendering.RenderingAddon``,
``.RenderingDownloadHandler``, ``.browser_headers``, ...) are importable from
here, as they were from the module of this path before. They are loaded on
first use only: a node that renders nothing never imports Playwright (see
``test_a_node_that_renders_nothing_does_not_load_playwright``), and the
middleware module imports this package first.
"""

__all__ = ["CHROMIUM_ARGS", "CHROMIUM_CANDIDATES", "DEFAULT_BLOCKED", "HANDLER", "MIDDLEWARES",
           "PLAYWRIGHT_HANDLER", "RESOURCE_TYPES", "RETRY_ERRORS", "ContextPool",
           "RenderingAddon", "RenderingDownloadHandler", "ResourceBlocker",
           "blocked_resource_types", "browser_headers", "chromium_path", "handlers_for",
           "launch_options"]


def __getattr__(name: str):
    if name in __all__:
        from crawlproject.rendering import addon

        return getattr(addon, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
