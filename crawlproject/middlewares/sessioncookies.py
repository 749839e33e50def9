"""Moved to :mod:`crawlproject.identity.cookies`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.identity.cookies import (SESSION_COOKIES, MAX_COOKIES, MAX_VALUE,
                                           SessionCookiesSpiderMiddleware,
                                           SessionCookiesMiddleware)

__all__ = ["SESSION_COOKIES", "MAX_COOKIES", "MAX_VALUE", "SessionCookiesSpiderMiddleware",
           "SessionCookiesMiddleware"]

moved(__name__, "crawlproject.identity.cookies")
