"""Moved to :mod:`crawlproject.identity.cookies`; this path stays so settings written
before keep working."""

from crawlproject.identity.cookies import (SESSION_COOKIES, MAX_COOKIES, MAX_VALUE,
                                           SessionCookiesSpiderMiddleware,
                                           SessionCookiesMiddleware)

__all__ = ["SESSION_COOKIES", "MAX_COOKIES", "MAX_VALUE", "SessionCookiesSpiderMiddleware",
           "SessionCookiesMiddleware"]
