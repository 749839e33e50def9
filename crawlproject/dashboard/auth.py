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
import math
import os
import time
from collections import deque
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


class SignInLimiter:
    """Failed sign-ins per client (its address): after *limit* failures within
    *window* seconds the client is refused (429) until the oldest leaves the
    window, right token or not, so guessing runs at *limit* a window. Failures
    and refusals are counted for the log: :meth:`due_reports` gives each
    client's count at most once a window (its first failure at once), not a
    line per attempt. At most *max_clients* are tracked (the oldest go first).
    *clock* is injectable for tests."""

    def __init__(self, limit: int = 10, window: float = 60.0, clock=time.monotonic,
                 max_clients: int = 10_000):
        self.limit, self.window, self.clock, self.max_clients = limit, window, clock, max_clients
        self._failures: dict[str, deque] = {}
        self._unreported: dict[str, int] = {}
        self._reported_at: dict[str, float] = {}
        self.timer = None   # the caller's pending report call, if any

    def retry_after(self, client: str) -> int:
        """Seconds *client* must wait before its next try (0: it may try now)."""
        if client not in self._failures:
            return 0
        failures = self._recent(client)
        if len(failures) < self.limit:
            return 0
        return max(1, math.ceil(failures[0] + self.window - self.clock()))

    def failed(self, client: str, refused: bool = False) -> None:
        """A wrong token from *client*; with *refused*, a try refused by
        :meth:`retry_after` (counted for the log only: the wait it was told
        does not grow)."""
        if client not in self._failures and len(self._failures) >= self.max_clients:
            oldest = next(iter(self._failures))
            for table in (self._failures, self._unreported, self._reported_at):
                table.pop(oldest, None)
        if not refused:
            self._recent(client).append(self.clock())
        self._unreported[client] = self._unreported.get(client, 0) + 1

    def due_reports(self) -> list[tuple[str, int]]:
        """(client, attempts since its last report) for each client whose last
        report is a window old or that has none; forgets quiet clients."""
        now, due = self.clock(), []
        for client, count in list(self._unreported.items()):
            if now - self._reported_at.get(client, -math.inf) >= self.window:
                due.append((client, count))
                del self._unreported[client]
                self._reported_at[client] = now
        for client in [c for c, at in self._reported_at.items()
                       if now - at >= self.window and c not in self._unreported]:
            del self._reported_at[client]
            if client in self._failures and not self._recent(client):
                del self._failures[client]
        return due

    @property
    def pending(self) -> bool:
        """Whether some attempts are counted but not reported yet."""
        return bool(self._unreported)

    def _recent(self, client: str) -> deque:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= self.clock() - self.window:
            failures.popleft()
        return failures
