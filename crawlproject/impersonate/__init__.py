"""Browser-grade identity on the wire: the TLS ClientHello and HTTP/2 frames of
the browser version a session's identity names (curl_cffi), for this project or
any Scrapy project::

    ADDONS = {"crawlproject.impersonate.ImpersonateAddon": 0}
    IMPERSONATE_ENABLED = True

* :mod:`~crawlproject.impersonate.addon`: the add-on (download handlers,
  retried exceptions, checks at start);
* :mod:`~crawlproject.impersonate.handler`: ``ImpersonateDownloadHandler``;
* :mod:`~crawlproject.impersonate.profiles`: User-Agent -> library profile
  (the identity middleware keeps only User-Agents that have one);
* :mod:`~crawlproject.impersonate.errors`: why a download failed.

curl_cffi is the ``impersonate`` extra; it is imported only when
``IMPERSONATE_ENABLED`` is on (docs/middlewares.md, "Browser TLS and HTTP/2").
"""

__all__ = ["HANDLER", "ImpersonateAddon", "ImpersonateDownloadHandler"]


def __getattr__(name: str):
    if name in ("HANDLER", "ImpersonateAddon"):
        from crawlproject.impersonate import addon

        return getattr(addon, name)
    if name == "ImpersonateDownloadHandler":
        from crawlproject.impersonate.handler import ImpersonateDownloadHandler

        return ImpersonateDownloadHandler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
