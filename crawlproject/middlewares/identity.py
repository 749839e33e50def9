"""Moved to :mod:`crawlproject.identity.middleware`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.identity.middleware import (DONT_ROTATE, DEFAULT_BROWSERS,
                                              DEFAULT_PLATFORMS, parse_rotation,
                                              IdentityMiddleware)

__all__ = ["DONT_ROTATE", "DEFAULT_BROWSERS", "DEFAULT_PLATFORMS", "parse_rotation",
           "IdentityMiddleware"]

moved(__name__, "crawlproject.identity.middleware")
