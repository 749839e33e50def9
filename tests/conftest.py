"""Shared fixtures: real servers (Redis, Redis Cluster, MongoDB-wire, demo site)."""

from tests.fixtures_services import *  # noqa: F401,F403
from tests.fixtures_site import *  # noqa: F401,F403


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end crawls (several seconds each)")
