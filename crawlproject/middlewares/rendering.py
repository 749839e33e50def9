"""Moved to :mod:`crawlproject.rendering.middleware`; this path stays so settings written
before keep working."""

from crawlproject.rendering.middleware import (RENDER, RENDER_WAIT_FOR, HELD_CONTEXT,
                                               DEFAULT_CONTEXT, CONTEXT_HEADERS,
                                               MAX_SELECTOR, RenderRules,
                                               RenderingMiddleware,
                                               RenderIfMissingMiddleware, context_options)

__all__ = ["RENDER", "RENDER_WAIT_FOR", "HELD_CONTEXT", "DEFAULT_CONTEXT",
           "CONTEXT_HEADERS", "MAX_SELECTOR", "RenderRules", "RenderingMiddleware",
           "RenderIfMissingMiddleware", "context_options"]
