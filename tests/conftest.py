"""Shared fixtures: real servers (Redis, Redis Cluster, MongoDB-wire, demo site)."""

import os
import sys
import threading
import uuid

import pymongo
import pytest
from filelock import FileLock

from tests.crawl_helpers import TEST_SECRET
from tests.fixtures_services import *  # noqa: F401,F403
from tests.fixtures_site import *  # noqa: F401,F403


# The crawl's secret (crawlproject/signing.py), as an operator exports it on every
# node: the suite's nodes inherit it (node_env gives it too). A test that needs
# none removes it.
os.environ.setdefault("FRONTIER_SECRET", TEST_SECRET)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end crawls (several seconds each)")
    config.addinivalue_line("markers", "xdist_group(name): tests of one group never run at the "
                                       "same time as each other (_serial_group)")


#: the group of the tests that measure timing at the site (intervals, rates,
#: waits): one at a time, so two of them never load the machine together.
SITE_TIMING = "site-timing"


@pytest.fixture(autouse=True)
def _serial_group(request, tmp_path_factory):
    """A test marked ``xdist_group(NAME)`` runs while no other test of NAME
    does, whatever ``--dist`` (deploy/test.sh's worksteal ignores the mark;
    loadgroup sends a group to one worker): one file lock per group, shared by
    the run's workers. Taken before the test's own fixtures (it is autouse)."""
    marker = request.node.get_closest_marker("xdist_group")
    if marker is None:
        yield
        return
    name = marker.args[0] if marker.args else marker.kwargs.get("name", "default")
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with FileLock(str(root / f"serial-{name}.lock"), timeout=480):
        yield


def pytest_collection_modifyitems(config, items):
    """End-to-end crawls first (a stable sort: the same order on every xdist
    worker): on parallel workers the run then ends with short tests, not with
    one long crawl started last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    _prebuild(config, items)


# Session fixtures that build a virtualenv (minutes on a loaded machine) and the
# function that builds it: started in the background as soon as the run is known
# to need it, so the tests that use it do not wait for the whole build at the end.
_PREBUILT = {"installed": ("tests.test_install", "ensure_installed"),
             "node_venv": ("tests.test_scrapyd", "ensure_node_venv")}


def _prebuild(config, items) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the fixtures build when first used
    run_dir = config._tmp_path_factory.getbasetemp().parent
    needed = {name for item in items for name in getattr(item, "fixturenames", ())
              if name in _PREBUILT}
    for name in sorted(needed):
        module, function = _PREBUILT[name]
        build = getattr(sys.modules[module], function)
        # A failed build is built again, and reported, by the fixture itself.
        threading.Thread(target=_quietly, args=(build, run_dir), daemon=True,
                         name=f"prebuild-{name}").start()


def _quietly(build, run_dir) -> None:
    try:
        build(run_dir)
    except Exception:  # noqa: BLE001 - the fixture raises it where a test sees it
        pass


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
