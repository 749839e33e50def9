"""Moved to :mod:`crawlproject.identity.session`; this path stays so settings written
before keep working."""

from crawlproject.identity.session import (SESSION, PROXY_ID, PROXY_CONTEXT, IDENTITY,
                                           TRANSIENT, explicit_session, session_key)

__all__ = ["SESSION", "PROXY_ID", "PROXY_CONTEXT", "IDENTITY", "TRANSIENT",
           "explicit_session", "session_key"]
