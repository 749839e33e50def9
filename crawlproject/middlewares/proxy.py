"""Moved to :mod:`crawlproject.proxies.middleware`; this path stays so settings written
before keep working."""

from crawlproject.proxies.middleware import (BAN_TRIES, CONNECTION_ERRORS,
                                             HEALTH_READ_PERIOD, ProxyPoolMiddleware)

__all__ = ["BAN_TRIES", "CONNECTION_ERRORS", "HEALTH_READ_PERIOD", "ProxyPoolMiddleware"]
