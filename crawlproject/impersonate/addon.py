"""ImpersonateAddon: route http/https through the impersonating download handler.

With ``IMPERSONATE_ENABLED`` off it does nothing (``NotConfigured``). On, it
checks at start what would otherwise fail every request later (curl_cffi
installed, the asyncio reactor, no other handler of the project's own for
http/https), then sets, unless the project set them itself:

* ``DOWNLOAD_HANDLERS`` http and https: :data:`HANDLER`
  (it replaces Scrapy's, scrapy-playwright's and the rendering add-on's handler,
  and hands rendered requests to the latter itself);
* ``RETRY_EXCEPTIONS``: plus :class:`~crawlproject.impersonate.errors.ImpersonateError`,
  so an impersonation failure is retried and dead-lettered like a download error.
"""

from __future__ import annotations

from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.settings.default_settings import DOWNLOAD_HANDLERS_BASE

from crawlproject.defaults import setting
from crawlproject.impersonate.profiles import load_library

#: The download handler the add-on installs for http and https.
HANDLER = "crawlproject.impersonate.handler.ImpersonateDownloadHandler"

RETRY_ERRORS = ("crawlproject.impersonate.errors.ImpersonateError",)
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
#: Handlers ours replaces: Scrapy's, scrapy-playwright's, the rendering add-on's.
REPLACEABLE = (DOWNLOAD_HANDLERS_BASE["https"], "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
               "crawlproject.rendering.RenderingDownloadHandler",
               "crawlproject.rendering.addon.RenderingDownloadHandler", HANDLER)


def impersonating(settings) -> bool:
    """``IMPERSONATE_ENABLED``: read here and by the identity middleware."""
    return setting(settings, "IMPERSONATE_ENABLED")


def handler_installed(settings) -> bool:
    """True when http and https both go through the impersonating handler."""
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    return all(_path(handlers.get(scheme)) == HANDLER for scheme in ("http", "https"))


class ImpersonateAddon:
    """Scrapy add-on: impersonate the identity's browser on the wire (see the module docstring)."""

    def update_settings(self, settings) -> None:
        """Check what impersonation needs and install its handler and retried error."""
        if not impersonating(settings):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        load_library()
        reactor = settings.get("TWISTED_REACTOR")
        if settings.getbool("TWISTED_REACTOR_ENABLED") and reactor != ASYNCIO_REACTOR:
            raise ValueError(f"IMPERSONATE_ENABLED needs TWISTED_REACTOR = {ASYNCIO_REACTOR!r} "
                             f"(curl_cffi runs on the asyncio loop), not {reactor!r}")
        handlers = settings["DOWNLOAD_HANDLERS"]
        for scheme in ("http", "https"):
            current = _path(handlers.get(scheme))
            if current is not None and current not in REPLACEABLE:
                raise ValueError(f"IMPERSONATE_ENABLED: DOWNLOAD_HANDLERS[{scheme!r}] is the "
                                 f"project's own {current}; impersonation needs {HANDLER}")
            priority = max(handlers.getpriority(scheme) or 0, SETTINGS_PRIORITIES["addon"])
            handlers.set(scheme, HANDLER, priority)
        retry = settings.getlist("RETRY_EXCEPTIONS")
        priority = max(settings.getpriority("RETRY_EXCEPTIONS") or 0, SETTINGS_PRIORITIES["addon"])
        settings.set("RETRY_EXCEPTIONS", retry + [e for e in RETRY_ERRORS if e not in retry],
                     priority)


def _path(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return f"{value.__module__}.{value.__qualname__}"
