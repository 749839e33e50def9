"""Which MongoDB errors are worth retrying, and messages without secrets.

* :func:`is_transient` – connection loss, no primary, timeouts, shutdowns,
  write-concern and retryable-labelled failures: the write may succeed later,
  so it is retried, then spooled. Authorisation failures count as transient
  too (a role revoked, a user recreated): nothing is dropped because of them.
* :func:`classify_write_error` – the same decision for one entry of a
  ``BulkWriteError``'s ``writeErrors``: ``"duplicate"`` (E11000, a race
  with another writer: retried as an update), ``"transient"`` or
  ``"permanent"``.
* :class:`Scrubber` – removes a URI's password (raw and URL-encoded) from
  any text, for logs, stats and exception messages.
* :class:`MongoPipelineError` – MongoDB cannot be used at all.
"""

from __future__ import annotations

from urllib.parse import quote, quote_plus, unquote, urlsplit

from pymongo.errors import (
    ConnectionFailure,
    ExecutionTimeout,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)

from crawlproject.connection import redact_url

__all__ = ["DUPLICATE_KEY", "AUTH_CODES", "RETRYABLE_CODES", "is_transient", "is_auth_error",
           "classify_write_error", "Scrubber", "MongoPipelineError"]

DUPLICATE_KEY = 11000
AUTH_CODES = frozenset({13, 18})  # Unauthorized, AuthenticationFailed
#: Server error codes after which the same write can succeed (MongoDB's own
#: retryable-write list plus timeouts, write conflicts and write concern).
RETRYABLE_CODES = frozenset({
    6, 7, 50, 63, 64, 89, 91, 112, 134, 150, 189, 262, 279, 9001, 10058, 10107,
    11600, 11602, 13435, 13436,
})


class MongoPipelineError(RuntimeError):
    """MongoDB cannot be used at all (bad credentials, unreachable...); the message is scrubbed."""


def is_auth_error(exc: BaseException) -> bool:
    """True for authentication / authorisation refusals (codes 13, 18)."""
    return isinstance(exc, OperationFailure) and exc.code in AUTH_CODES


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same write later can succeed."""
    if isinstance(exc, (ConnectionFailure, ExecutionTimeout, WTimeoutError)):
        return True
    if isinstance(exc, OperationFailure):
        if exc.code in RETRYABLE_CODES or exc.code in AUTH_CODES:
            return True
        if any(exc.has_error_label(label)
               for label in ("RetryableWriteError", "SystemOverloadedError")):
            return True
    if isinstance(exc, PyMongoError) and getattr(exc, "timeout", False):
        return True
    return False


def classify_write_error(error: dict) -> str:
    """``"duplicate"``, ``"transient"`` or ``"permanent"`` for a bulk write error entry."""
    code = error.get("code")
    if code == DUPLICATE_KEY:
        return "duplicate"
    labels = error.get("errorLabels") or ()
    if code in RETRYABLE_CODES or code in AUTH_CODES or "RetryableWriteError" in labels:
        return "transient"
    return "permanent"


class Scrubber:
    """Replace the password of *uri* (and the URI itself) in texts."""

    def __init__(self, uri: str | None):
        self.uri = uri or ""
        self.redacted = redact_url(self.uri)
        self.secrets: list[str] = []
        try:
            netloc = urlsplit(self.uri).netloc
        except ValueError:
            netloc = ""
        userinfo = netloc.rpartition("@")[0]
        if ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            for secret in {raw, unquote(raw), quote(unquote(raw), safe=""),
                           quote_plus(unquote(raw))}:
                if secret:
                    self.secrets.append(secret)
            self.secrets.sort(key=len, reverse=True)

    def __call__(self, text: object) -> str:
        """*text* with the URI redacted and every form of the password replaced by ``***``."""
        out = str(text)
        if self.uri and self.uri in out:
            out = out.replace(self.uri, self.redacted)
        for secret in self.secrets:
            out = out.replace(secret, "***")
        return out

    def exception(self, exc: BaseException) -> str:
        """``ClassName: scrubbed message``."""
        return f"{type(exc).__name__}: {self(exc)}"
