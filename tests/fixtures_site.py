"""Pytest fixtures for the demo site (imported by ``tests/conftest.py``)."""

from __future__ import annotations

import pytest

from devtools.demo.site import DemoSite

__all__ = ["demo_site", "site"]


@pytest.fixture(scope="session")
def demo_site():
    """One demo site with default settings, shared by the whole test session."""
    with DemoSite() as running:
        yield running


@pytest.fixture
def site(demo_site):
    """The shared demo site with its hit counters and 503 state reset."""
    demo_site.reset()
    return demo_site
