"""Moved to :mod:`crawlproject.identity.session`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.identity.session import (SESSION, PROXY_ID, PROXY_CONTEXT, IDENTITY,
                                           TRANSIENT, explicit_session, session_key)

__all__ = ["SESSION", "PROXY_ID", "PROXY_CONTEXT", "IDENTITY", "TRANSIENT",
           "explicit_session", "session_key"]

moved(__name__, "crawlproject.identity.session")
