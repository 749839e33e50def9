"""Shared fixtures: real servers (Redis, Redis Cluster, MongoDB-wire, demo site)."""

import os
import uuid

import pymongo
import pytest

from tests.fixtures_services import *  # noqa: F401,F403
from tests.fixtures_site import *  # noqa: F401,F403


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end crawls (several seconds each)")


def pytest_collection_modifyitems(config, items):
    """End-to-end crawls first (a stable sort: the same order on every xdist
    worker): on parallel workers the run then ends with short tests, not with
    one long crawl started last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test leaves os.environ as it found it: code run in the test
    process (Scrapy's get_project_settings() sets SCRAPY_SETTINGS_MODULE)
    must not reach the subprocesses of later tests on the same worker."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def database(mongo_uri):
    """A fresh MongoDB database (timezone-aware client) for a crawl; dropped after."""
    name = f"crawl_{uuid.uuid4().hex[:8]}"
    client = pymongo.MongoClient(mongo_uri, tz_aware=True)
    yield client[name]
    client.drop_database(name)
    client.close()
