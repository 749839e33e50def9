"""Why an impersonated download failed: Scrapy's own exceptions where Scrapy has one
(so the retry middleware, the proxy pool and the dead letters treat them as they
treat Scrapy's client's), and these where impersonation itself failed.

Every class has a ``reason``: the last part of the ``impersonate/errors/<reason>``
stat and the word in the log line.
"""

from __future__ import annotations

from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import (CannotResolveHostError, DownloadConnectionRefusedError,
                               DownloadFailedError, DownloadTimeoutError, ResponseDataLossError,
                               UnsupportedURLSchemeError)

from crawlproject.limits.headers import ResponseHeadersTooLarge


class ImpersonateError(Exception):
    """Impersonation itself failed (retried like a download error: RETRY_EXCEPTIONS)."""

    reason = "library_error"
    #: May IMPERSONATE_FALLBACK send the request with Scrapy's own client instead?
    fallback = True

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class ImpersonateProfileError(ImpersonateError):
    """No profile, or one the library does not have."""

    reason = "unknown_profile"


class ImpersonateTLSError(ImpersonateError, DownloadFailedError):
    """The TLS handshake with the browser's ClientHello failed."""

    reason = "tls_error"


class ImpersonateHTTP2Error(ImpersonateError, DownloadFailedError):
    """The site broke the HTTP/2 connection the browser's settings opened."""

    reason = "http2_error"


class ImpersonateTunnelError(TunnelError):
    """The proxy refused or failed the CONNECT tunnel (or could not be reached by name)."""

    reason = "proxy"
    fallback = False


class ImpersonateNetworkError(Exception):
    """Mixed into Scrapy's exception: a network failure, not impersonation's (no fallback)."""

    reason = "network"
    fallback = False


class DownloadTimeout(ImpersonateNetworkError, DownloadTimeoutError):
    """The download took longer than download_timeout."""

    reason = "timeout"


class ConnectionRefused(ImpersonateNetworkError, DownloadConnectionRefusedError):
    """The site (or the proxy) refused the connection."""

    reason = "connection_refused"


class CannotResolve(ImpersonateNetworkError, CannotResolveHostError):
    """The site's name did not resolve."""

    reason = "dns"


class ConnectionFailed(ImpersonateNetworkError, DownloadFailedError):
    """The connection broke before a complete answer (or another network error)."""

    reason = "connection_lost"


class DataLoss(ImpersonateNetworkError, ResponseDataLossError):
    """The body ended before its announced length."""

    reason = "data_loss"


class UnsupportedScheme(ImpersonateNetworkError, UnsupportedURLSchemeError):
    """A URL scheme libcurl does not speak."""

    reason = "unsupported_scheme"


class HeadersTooLarge(ImpersonateNetworkError, ResponseHeadersTooLarge):
    """The response's headers went over libcurl's bounds or ``DOWNLOAD_HEADERS_*``
    (not retried: a ``DownloadCancelledError``, as Scrapy's ``DOWNLOAD_MAXSIZE``)."""

    reason = "headers_too_large"
