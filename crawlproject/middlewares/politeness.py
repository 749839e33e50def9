"""Moved to :mod:`crawlproject.middlewares.slowdown`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.middlewares.slowdown import FrontierPolitenessMiddleware, retry_after_seconds

__all__ = ["FrontierPolitenessMiddleware", "retry_after_seconds"]

moved(__name__, "crawlproject.middlewares.slowdown")
