"""ImpersonateAddon: route http/https through the impersonating download handler.

With ``IMPERSONATE_ENABLED`` off it does nothing (``NotConfigured``). On, it
checks at start what would otherwise fail every request later (curl_cffi
installed, ``IMPERSONATE_DEFAULT_PROFILE`` one of its profiles, the asyncio
reactor, no handler of the project's own for http/https), then sets:

* ``DOWNLOAD_HANDLERS`` http and https: :data:`HANDLER`, or with rendering on
  (``RENDERING_ENABLED`` and the rendering add-on or its handler in the
  settings) :data:`RENDERING_HANDLER`, the rendering add-on's handler that
  sends the requests it does not render to :data:`HANDLER` (it replaces
  Scrapy's, scrapy-playwright's and the rendering add-on's handler);
* ``RETRY_EXCEPTIONS``: plus :class:`~crawlproject.impersonate.errors.ImpersonateError`,
  so an impersonation failure is retried and dead-lettered like a download error.
"""

from __future__ import annotations

from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.settings.default_settings import DOWNLOAD_HANDLERS_BASE

from crawlproject.defaults import setting
from crawlproject.rendering.settings import rendering_enabled
from crawlproject.impersonate.profiles import available_profiles, load_library

#: The download handler the add-on installs for http and https...
HANDLER = "crawlproject.impersonate.handler.ImpersonateDownloadHandler"
#: ... or, with rendering on, this one (crawlproject.impersonate.rendered).
RENDERING_HANDLER = "crawlproject.impersonate.rendered.RenderingImpersonateHandler"
RENDERING_ADDONS = ("crawlproject.rendering.RenderingAddon",
                    "crawlproject.rendering.addon.RenderingAddon")

RETRY_ERRORS = ("crawlproject.impersonate.errors.ImpersonateError",)
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
#: Handlers ours replaces: Scrapy's, scrapy-playwright's, the rendering add-on's.
REPLACEABLE = (DOWNLOAD_HANDLERS_BASE["https"],
               "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
               "crawlproject.rendering.RenderingDownloadHandler",
               "crawlproject.rendering.addon.RenderingDownloadHandler",
               "crawlproject.limits.headers.BoundedHTTP11DownloadHandler",
               HANDLER, RENDERING_HANDLER)


def impersonating(settings) -> bool:
    """``IMPERSONATE_ENABLED``: read here and by the identity middleware."""
    return setting(settings, "IMPERSONATE_ENABLED")


def handler_installed(settings) -> bool:
    """True when http and https both go through the impersonating handler."""
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    return all(_path(handlers.get(scheme)) in (HANDLER, RENDERING_HANDLER)
               for scheme in ("http", "https"))


class ImpersonateAddon:
    """Scrapy add-on: impersonate the identity's browser on the wire (see the module docstring)."""

    def update_settings(self, settings) -> None:
        """Check what impersonation needs and install its handler and retried error."""
        if not impersonating(settings):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        load_library()
        default = setting(settings, "IMPERSONATE_DEFAULT_PROFILE")
        if default and default not in available_profiles():
            raise ValueError(f"IMPERSONATE_DEFAULT_PROFILE {default!r} is not a profile of "
                             f"curl_cffi (known: {', '.join(sorted(available_profiles()))})")
        reactor = settings.get("TWISTED_REACTOR")
        if settings.getbool("TWISTED_REACTOR_ENABLED") and reactor != ASYNCIO_REACTOR:
            raise ValueError(f"IMPERSONATE_ENABLED needs TWISTED_REACTOR = {ASYNCIO_REACTOR!r} "
                             f"(curl_cffi runs on the asyncio loop), not {reactor!r}")
        handlers = settings["DOWNLOAD_HANDLERS"]
        ours = RENDERING_HANDLER if _renders(settings) else HANDLER
        for scheme in ("http", "https"):
            current = _path(handlers.get(scheme))
            if current is not None and current not in REPLACEABLE:
                raise ValueError(f"IMPERSONATE_ENABLED: DOWNLOAD_HANDLERS[{scheme!r}] is the "
                                 f"project's own {current}; impersonation needs {HANDLER}")
            priority = max(handlers.getpriority(scheme) or 0, SETTINGS_PRIORITIES["addon"])
            handlers.set(scheme, ours, priority)
        retry = settings.getlist("RETRY_EXCEPTIONS")
        priority = max(settings.getpriority("RETRY_EXCEPTIONS") or 0, SETTINGS_PRIORITIES["addon"])
        settings.set("RETRY_EXCEPTIONS", retry + [e for e in RETRY_ERRORS if e not in retry],
                     priority)


def _renders(settings) -> bool:
    """Will the rendering add-on (and its middleware) be on? Then its handler must stay."""
    if not rendering_enabled(settings):
        return False
    addons = {_path(a) for a, order in settings.getdict("ADDONS").items() if order is not None}
    handlers = {_path(h) for h in settings.getdict("DOWNLOAD_HANDLERS").values()}
    if not (addons & set(RENDERING_ADDONS) or handlers & set(REPLACEABLE[1:4])):
        return False
    try:  # the render extra: without it the rendering add-on says so and stays off
        from crawlproject.rendering import load_addon

        load_addon()
    except NotConfigured:
        return False
    return True


def _path(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return f"{value.__module__}.{value.__qualname__}"
