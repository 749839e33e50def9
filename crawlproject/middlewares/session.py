"""Moved to :mod:`crawlproject.identity.session` (this path keeps working)."""

from crawlproject.identity.session import (IDENTITY, PROXY_CONTEXT, PROXY_ID, SESSION,
                                         TRANSIENT, explicit_session, session_key)

__all__ = ["IDENTITY", "PROXY_CONTEXT", "PROXY_ID", "SESSION", "TRANSIENT",
           "explicit_session", "session_key"]
