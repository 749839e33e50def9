"""Deprecation of the component paths from before the capability packages.

A module left at an old path (``crawlproject.middlewares.identity``...) calls
:func:`moved` when it is imported: a :class:`CrawlprojectDeprecationWarning`
names the new path and the version that removes the old one.
"""

from __future__ import annotations

import warnings

__all__ = ["REMOVED_IN", "CrawlprojectDeprecationWarning", "moved"]

#: The version whose release drops the old paths.
REMOVED_IN = "0.12.0"


class CrawlprojectDeprecationWarning(DeprecationWarning):
    """A crawlproject path that goes away in :data:`REMOVED_IN`."""


# Python hides DeprecationWarning outside __main__, and a settings file's paths are
# imported by Scrapy, never from __main__: shown once per place, like Scrapy's own.
warnings.filterwarnings("default", category=CrawlprojectDeprecationWarning)


def moved(old: str, new: str) -> None:
    """Warn that module *old* is now *new* (same names)."""
    warnings.warn(f"{old} is deprecated and will be removed in crawlproject {REMOVED_IN}: "
                  f"use {new} ({old}.<Name> is {new}.<Name>)",
                  CrawlprojectDeprecationWarning, stacklevel=3)
