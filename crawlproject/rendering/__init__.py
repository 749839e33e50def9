"""JavaScript rendering with the system Chromium (scrapy-playwright), for this
project or any Scrapy project: ``ADDONS = {"crawlproject.rendering.RenderingAddon": 0}``.

* :mod:`~crawlproject.rendering.addon`: the add-on, the download handler, the
  browser context pool, Chromium's path and flags;
* :mod:`~crawlproject.rendering.middleware`: ``RenderingMiddleware`` (620) and
  ``RenderIfMissingMiddleware`` (585), which decide what is rendered and how;
* :mod:`~crawlproject.rendering.content`: what a rendered page waits for before
  it is read (its required selector, else network idle), and the report of a
  page that lacks its content (``MissingContent``, ``EmptyItemsMiddleware``);
* :mod:`~crawlproject.rendering.settings`: the settings both read, with no
  Playwright import;
* :mod:`~crawlproject.rendering.limits`: the bytes a rendered page receives,
  counted by Chromium as they arrive (``DOWNLOAD_MAXSIZE``, ``RENDER_MAXSIZE``).

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


RENDER_EXTRA = "pip install '/path/to/checkout[render]' (this package's checkout or wheel)"


def load_addon():
    """The add-on module; NotConfigured naming the ``render`` extra when
    scrapy-playwright (or Playwright) is not installed."""
    try:
        from crawlproject.rendering import addon
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("scrapy_playwright", "playwright"):
            raise
        from scrapy.exceptions import NotConfigured

        raise NotConfigured(f"JavaScript rendering needs the render extra ({exc.name} is "
                            f"missing): {RENDER_EXTRA}, or RENDERING_ENABLED = False") from None
    return addon


class _AddonWithoutPlaywright:
    """RenderingAddon's stand-in when scrapy-playwright is missing: nothing to do
    with rendering off, NotConfigured naming the extra with it on."""

    def update_settings(self, settings) -> None:
        from crawlproject.rendering.settings import rendering_enabled

        if rendering_enabled(settings):
            load_addon()


def __getattr__(name: str):
    if name in __all__:
        try:
            addon = load_addon()
        except Exception:
            if name == "RenderingAddon":
                return _AddonWithoutPlaywright
            raise
        return getattr(addon, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
