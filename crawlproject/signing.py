"""Proof that a node of this crawl wrote a piece of stored data.

Redis (and MongoDB, for recrawl page records) is written by two kinds of
writer: the nodes of the crawl, whose requests must come back whole (a private
callback such as ``CrawlSpider._callback``, a ``POST`` body, the spider's own
``meta``), and anyone else who can reach the server (seeds pushed with
``LPUSH``, scripts, other teams, an attacker), whose data gets the seed policy
(:mod:`crawlproject.policy`). They are told apart by proof, not by where the
data sits: a node signs what it stores with an HMAC-SHA256 over the data, keyed
by ``FRONTIER_SECRET``, a secret every node of the crawl has and seeders do
not. Redis itself never sees the secret.

* A signed value is ``"~1" + <22 characters: the MAC, base64url> + ":" + data``.
  The MAC covers a *purpose* (``request``, ``robots``...) and a *scope* (the
  spider; for a robots.txt record also its origin) as well as the data, so a
  value signed for one use is worth nothing in another place.
* :meth:`Signer.open` returns the data and whether the proof holds. Data
  without a valid proof (unsigned, another secret, altered, moved to another
  spider or origin) is *untrusted*: never an error by itself.
* ``FRONTIER_SECRET`` (setting, else the environment variable) is a string of
  at least 16 characters, or a list of them to rotate: values are signed with
  the first and accepted with any. Without it nothing is signed and nothing
  read back is trusted (:func:`signer_from_settings` returns None; the
  scheduler says what that means at start).

The secret never reaches a log line, a stat or an error message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Iterable

from crawlproject.defaults import setting

__all__ = ["Signer", "SecretError", "signer_from_settings", "unwrap", "is_signed",
           "MIN_SECRET_LENGTH"]

PREFIX = "~1"
_MAC_BYTES = 16                      # 128 bits: HMAC-SHA256 truncated (RFC 2104 section 5)
_MAC_CHARS = 22                      # base64url of 16 bytes, unpadded
_HEAD = len(PREFIX) + _MAC_CHARS + 1
MIN_SECRET_LENGTH = 16


class SecretError(ValueError):
    """``FRONTIER_SECRET`` is set but cannot be used (too short, wrong type)."""


def is_signed(value: str | bytes) -> bool:
    """Whether *value* has the form of a signed value (proven or not)."""
    if isinstance(value, bytes):
        return value[:2] == b"~1" and len(value) >= _HEAD and value[_HEAD - 1:_HEAD] == b":"
    return value[:2] == PREFIX and len(value) >= _HEAD and value[_HEAD - 1] == ":"


def unwrap(value: str | bytes) -> str:
    """The data of *value*, signed or not, without checking any proof: for
    display and for reading a URL out of a record (never to trust it)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value[_HEAD:] if is_signed(value) else value


class Signer:
    """Signs and checks stored data of one crawl (see the module docstring).

    *secrets*: the first signs, any of them proves (rotation). *scope*: what
    the data belongs to (the spider's name), part of every MAC.
    """

    def __init__(self, secrets: Iterable[bytes], scope: str):
        self._keys = [bytes(s) for s in secrets]
        if not self._keys:
            raise SecretError("a Signer needs at least one secret")
        self.scope = scope
        self._bases: dict[str, list] = {}

    def __repr__(self) -> str:   # never the secret
        return f"<Signer scope={self.scope!r} keys={len(self._keys)}>"

    def _macs(self, purpose: str) -> list:
        bases = self._bases.get(purpose)
        if bases is None:
            # HMAC state after the purpose and scope: each value costs a copy
            # and an update (the per-request path signs every request it stores).
            head = f"{purpose}\0{self.scope}\0".encode()
            bases = self._bases[purpose] = [hmac.new(k, head, hashlib.sha256) for k in self._keys]
        return bases

    def _mac(self, base, data: bytes) -> str:
        mac = base.copy()
        mac.update(data)
        return base64.urlsafe_b64encode(mac.digest()[:_MAC_BYTES]).decode("ascii")[:_MAC_CHARS]

    def sign(self, data: str, purpose: str = "request") -> str:
        """*data* with its proof."""
        return f"{PREFIX}{self._mac(self._macs(purpose)[0], data.encode())}:{data}"

    def open(self, value: str | bytes, purpose: str = "request") -> tuple[str, bool]:
        """``(data, proven)``: *value*'s data, and whether a node of this crawl
        signed it for *purpose* in this scope. Never raises for what *value* holds
        (bytes that are not UTF-8 come back with replacement characters, unproven)."""
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return value.decode("utf-8", "replace"), False
        if not is_signed(value):
            return value, False
        data = value[_HEAD:]
        given = value[len(PREFIX):_HEAD - 1]
        raw = data.encode()
        proven = any(hmac.compare_digest(self._mac(base, raw), given)
                     for base in self._macs(purpose))
        return data, proven


def secrets_from_settings(settings) -> list[bytes]:
    """The keys of ``FRONTIER_SECRET`` (setting, else environment), first
    signs; empty when unset. Raises :class:`SecretError` for an unusable value."""
    raw = setting(settings, "FRONTIER_SECRET")
    if raw is None or raw == "" or raw == []:
        return []
    if isinstance(raw, str):
        values = [v.strip() for v in raw.split(",")] if "," in raw else [raw.strip()]
    elif isinstance(raw, (list, tuple)):
        values = list(raw)
    else:
        raise SecretError(f"FRONTIER_SECRET must be a string or a list of strings, not a "
                          f"{type(raw).__name__}")
    keys = []
    for value in values:
        if not isinstance(value, (str, bytes)) or len(value) < MIN_SECRET_LENGTH:
            raise SecretError(f"FRONTIER_SECRET: every secret must be text of at least "
                              f"{MIN_SECRET_LENGTH} characters (python -m crawlproject.cli "
                              "secret prints a new one)")
        keys.append(value.encode() if isinstance(value, str) else value)
    return keys


def signer_from_settings(settings, scope: str) -> Signer | None:
    """The crawl's :class:`Signer` for *scope*, or None without ``FRONTIER_SECRET``."""
    keys = secrets_from_settings(settings)
    return Signer(keys, scope) if keys else None
