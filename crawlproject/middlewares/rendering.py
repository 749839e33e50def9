"""Moved to :mod:`crawlproject.rendering.middleware`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.rendering.middleware import (RENDER, RENDER_WAIT_FOR, HELD_CONTEXT,
                                               DEFAULT_CONTEXT, CONTEXT_HEADERS,
                                               MAX_SELECTOR, RenderRules,
                                               RenderingMiddleware,
                                               RenderIfMissingMiddleware, context_options)

__all__ = ["RENDER", "RENDER_WAIT_FOR", "HELD_CONTEXT", "DEFAULT_CONTEXT",
           "CONTEXT_HEADERS", "MAX_SELECTOR", "RenderRules", "RenderingMiddleware",
           "RenderIfMissingMiddleware", "context_options"]

moved(__name__, "crawlproject.rendering.middleware")
