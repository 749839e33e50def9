"""Moved to :mod:`crawlproject.proxies.middleware`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.proxies.middleware import (BAN_TRIES, CONNECTION_ERRORS,
                                             HEALTH_READ_PERIOD, ProxyPoolMiddleware)

__all__ = ["BAN_TRIES", "CONNECTION_ERRORS", "HEALTH_READ_PERIOD", "ProxyPoolMiddleware"]

moved(__name__, "crawlproject.proxies.middleware")
