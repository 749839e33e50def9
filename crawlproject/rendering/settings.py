"""The rendering settings read by both the rendering add-on
(:mod:`crawlproject.rendering.addon`) and the rendering middlewares, in one place
that imports no Playwright (a node that renders nothing never loads it)."""

from __future__ import annotations

from crawlproject.defaults import setting


def rendering_enabled(settings) -> bool:
    """``RENDERING_ENABLED`` (on by default): read here only, by the add-on
    and the rendering middlewares alike."""
    return setting(settings, "RENDERING_ENABLED")


def explicit_chromium_path(settings=None) -> str | None:
    """``CHROMIUM_PATH``: the setting, then the environment variable."""
    return setting(settings, "CHROMIUM_PATH") or None
