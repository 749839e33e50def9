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
import ipaddress
import math
import os
import time
from collections import OrderedDict, deque
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


def client_key(address: str | None) -> str:
    """Whom the limiter counts: the client's address; an IPv6 address by its
    /64 (one host or subscriber picks any address of its /64 at will), an
    IPv4-mapped one as IPv4."""
    try:
        ip = ipaddress.ip_address((address or "").split("%")[0])
    except ValueError:
        return address or "unknown"
    if ip.version == 6 and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class SignInLimiter:
    """Wrong credentials, counted per client for every credential check (the
    sign-in form, Basic, Bearer, the session cookie).

    After *limit* failures within *window* seconds a client (:func:`client_key`)
    is locked: refused (429) until the oldest leaves the window, right
    credential or not, so guessing runs at *limit* a window. Locked clients are
    kept apart from the others: tracking a new client never makes room by
    forgetting a lock (the others' partial counts, at most *max_clients*, go
    oldest first; locks expire by themselves, at most *max_locked* at once, and
    past that every client but those that signed in before waits). Across all
    clients, *global_limit* failures within the window lock every client but
    those that signed in before (at most *max_trusted*, the most recent): guessing
    from ever new addresses runs at *global_limit* a window.

    Failures and refusals are counted for the log: :meth:`due_reports` gives
    each client's count at most once a window (its first failure at once), not
    a line per attempt. *clock* is injectable for tests."""

    def __init__(self, limit: int = 10, window: float = 60.0, clock=time.monotonic,
                 max_clients: int = 10_000, global_limit: int = 100, max_locked: int = 10_000,
                 max_trusted: int = 1_000):
        self.limit, self.window, self.clock, self.max_clients = limit, window, clock, max_clients
        self.global_limit, self.max_locked, self.max_trusted = (global_limit, max_locked,
                                                                max_trusted)
        self._failures: OrderedDict[str, deque] = OrderedDict()  # unlocked clients' failures
        self._locked: dict[str, float] = {}          # client -> locked until (clock)
        self._global: deque = deque(maxlen=global_limit)   # the latest failures' times
        self._trusted: OrderedDict[str, None] = OrderedDict()
        self._unreported: OrderedDict[str, int] = OrderedDict()
        self._reported_at: dict[str, float] = {}
        self.global_reported_at: float | None = None
        self.timer = None   # the caller's pending report call, if any

    def retry_after(self, address: str | None) -> int:
        """Seconds the client at *address* must wait before its next try (0: it may try now)."""
        key, now = client_key(address), self.clock()
        until = self._locked.get(key)
        if until is not None:
            if until > now:
                return max(1, math.ceil(until - now))
            del self._locked[key]
        if key in self._trusted:
            return 0
        until = self.global_until()
        if until is None and len(self._expire_locks(now)) >= self.max_locked:
            until = now + self.window   # no room to lock one more: everyone waits
        return 0 if until is None else max(1, math.ceil(until - now))

    def global_until(self) -> float | None:
        """When the lock over all clients ends (None: there is none)."""
        if len(self._global) < self.global_limit:
            return None
        until = self._global[0] + self.window
        return until if until > self.clock() else None

    def failed(self, address: str | None, refused: bool = False) -> None:
        """A wrong credential from *address*; with *refused*, a try refused by
        :meth:`retry_after` (counted for the log only: the wait it was told
        does not grow)."""
        key, now = client_key(address), self.clock()
        self._unreported[key] = self._unreported.pop(key, 0) + 1
        while len(self._unreported) > self.max_clients + self.max_locked:
            self._unreported.popitem(last=False)   # a count for the log, not a lock
        if refused:
            return
        self._global.append(now)
        failures = self._failures.pop(key, None) or deque()
        self._drop_old(failures, now)
        failures.append(now)
        if len(failures) >= self.limit and len(self._expire_locks(now)) < self.max_locked:
            self._locked[key] = failures[0] + self.window
            failures.popleft()   # the next try after the lock is judged on the rest
        self._failures[key] = failures
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, address: str | None) -> None:
        """*address* proved a credential: it may try during a lock of all clients."""
        key = client_key(address)
        self._trusted.pop(key, None)
        self._trusted[key] = None
        while len(self._trusted) > self.max_trusted:
            self._trusted.popitem(last=False)

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
            failures = self._failures.get(client)
            if failures is not None and not self._drop_old(failures, now):
                del self._failures[client]
        return due

    @property
    def pending(self) -> bool:
        """Whether some attempts are counted but not reported yet."""
        return bool(self._unreported)

    def _drop_old(self, failures: deque, now: float) -> deque:
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        return failures

    def _expire_locks(self, now: float) -> dict[str, float]:
        if len(self._locked) >= self.max_locked:
            for key in [k for k, until in self._locked.items() if until <= now]:
                del self._locked[key]
        return self._locked
