"""Who may use the dashboard: a token, HTTP basic auth, or nobody but loopback.

Secrets come from the environment (``DASHBOARD_TOKEN``, ``DASHBOARD_USERNAME`` +
``DASHBOARD_PASSWORD``) or a file (``--token-file``), never from the command line,
which any local user can read in ``ps``. Every comparison is constant-time
(:func:`hmac.compare_digest`).

A browser proves the token once on the login form; the cookie it then gets holds
an HMAC of the token (never the token itself), ``HttpOnly`` and
``SameSite=Strict``. Scripts send ``Authorization: Bearer <token>``. With basic
auth the browser's own prompt does the work, and ``EventSource`` sends the
credentials too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

TOKEN_MIN_LENGTH = 16
PASSWORD_MIN_LENGTH = 8
COOKIE = "crawlctl_dashboard"
_COOKIE_CONTEXT = b"crawlproject dashboard session v1"


class CredentialsError(ValueError):
    """Credentials that are given but unusable (too short, half of a pair)."""


@dataclass(frozen=True, repr=False)
class Credentials:
    """The secrets the dashboard accepts; none configured means open (loopback only)."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # never a secret in a traceback or a log line
        return (f"Credentials(token={'set' if self.token else None}, "
                f"basic={'set' if self.password else None})")

    @classmethod
    def from_env(cls, environ=None, token_file: str | None = None) -> Credentials:
        """Read ``DASHBOARD_TOKEN`` (or *token_file*'s first line) and
        ``DASHBOARD_USERNAME``/``DASHBOARD_PASSWORD``; :class:`CredentialsError`
        for unusable values."""
        environ = os.environ if environ is None else environ
        token = environ.get("DASHBOARD_TOKEN") or None
        if token_file:
            try:
                token = Path(token_file).read_text(encoding="utf-8").splitlines()[0].strip()
            except (OSError, IndexError, UnicodeDecodeError) as exc:
                raise CredentialsError(f"cannot read a token from {token_file}: "
                                       f"{getattr(exc, 'strerror', None) or exc}") from None
        username = environ.get("DASHBOARD_USERNAME") or None
        password = environ.get("DASHBOARD_PASSWORD") or None
        if token is not None and len(token) < TOKEN_MIN_LENGTH:
            raise CredentialsError(f"the dashboard token must have at least "
                                   f"{TOKEN_MIN_LENGTH} characters")
        if (username is None) != (password is None):
            raise CredentialsError("set both DASHBOARD_USERNAME and DASHBOARD_PASSWORD")
        if password is not None and len(password) < PASSWORD_MIN_LENGTH:
            raise CredentialsError(f"DASHBOARD_PASSWORD must have at least "
                                   f"{PASSWORD_MIN_LENGTH} characters")
        if username is not None and ":" in username:
            raise CredentialsError("DASHBOARD_USERNAME may not contain ':'")
        return cls(token, username, password)

    @property
    def configured(self) -> bool:
        return bool(self.token or self.password)

    def check_authorization(self, header: str | None) -> str | None:
        """The user an ``Authorization`` header proves (``token`` or the basic
        user name), else None."""
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self.token:
            return "token" if _same(value, self.token) else None
        if scheme == "basic" and self.password:
            try:
                decoded = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            user, sep, password = decoded.partition(":")
            # Both compared, whatever the first gives: no timing hint which one was wrong.
            ok = _same(user, self.username) & _same(password, self.password)
            return self.username if sep and ok else None
        return None

    def check_token(self, value: str | None) -> bool:
        """Whether *value* (from the login form) is the token."""
        return bool(self.token) and value is not None and _same(value, self.token)

    def cookie_value(self) -> str:
        """What the session cookie holds: an HMAC of the token, not the token."""
        return hmac.new(self.token.encode("utf-8"), _COOKIE_CONTEXT, hashlib.sha256).hexdigest()

    def check_cookie(self, value: str | None) -> bool:
        return bool(self.token) and value is not None and _same(value, self.cookie_value())


def _same(given: str, secret: str | None) -> bool:
    return secret is not None and hmac.compare_digest(given.encode("utf-8"),
                                                      secret.encode("utf-8"))
