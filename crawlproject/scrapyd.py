"""Deploy to, start on and list the jobs of many scrapyd nodes (``crawlctl deploy``,
``schedule``, ``jobs``).

Targets are the ``[deploy:NAME]`` sections of ``scrapy.cfg`` (``url``, ``project``,
optional ``username``) or a targets file of ``NAME URL`` lines (``#`` comments).
Credentials never live in the repository: a target's ``username``/``password`` from
``scrapy.cfg`` if an operator put them there, else ``SCRAPYD_USERNAME`` /
``SCRAPYD_PASSWORD`` from the environment, else ``~/.netrc`` (requests reads it for
the target's host). Passwords are never printed.

Unlike ``scrapyd-deploy`` (which exits 0 when an upload is refused with
``{"status": "error"}``, and with ``-a`` whatever happens), every call here checks
both the HTTP status and scrapyd's JSON ``status``: a target that refuses is named
with scrapyd's message and the command exits non-zero after trying the others.
The egg is built once (``python setup.py bdist_egg``: the runtime package only, see
setup.py) and uploaded to every target.
"""

from __future__ import annotations

import configparser
import glob
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests
from requests.auth import HTTPBasicAuth

TIMEOUT = 30.0


class ScrapydError(Exception):
    """A target refused or could not be reached (the message names it)."""


@dataclass
class Target:
    """One scrapyd node."""

    name: str
    url: str
    project: str = "crawlproject"
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    def auth(self) -> HTTPBasicAuth | None:
        """Basic auth from the target, else the environment; None lets requests
        use ``~/.netrc``."""
        user = self.username or os.environ.get("SCRAPYD_USERNAME")
        password = self.password or os.environ.get("SCRAPYD_PASSWORD")
        if user and password:
            return HTTPBasicAuth(user, password)
        return None

    @property
    def where(self) -> str:
        """Name and URL, without any credentials."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return f"{self.name} ({parts.scheme}://{host}{parts.path})"


def targets_from_cfg(path: str | Path = "scrapy.cfg") -> dict[str, Target]:
    """The ``[deploy]`` / ``[deploy:NAME]`` sections of a scrapy.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(path)
    out = {}
    for section in cfg.sections():
        if section == "deploy" or section.startswith("deploy:"):
            name = section.partition(":")[2] or "default"
            sec = cfg[section]
            if "url" not in sec:
                raise ScrapydError(f"{path}: [{section}] has no url")
            out[name] = Target(name, sec["url"], sec.get("project", "crawlproject"),
                               sec.get("username"), sec.get("password"))
    return out


def targets_from_file(path: str | Path, project: str = "crawlproject") -> dict[str, Target]:
    """``NAME URL`` per line (``#`` comments); no credentials in the file."""
    out = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith(("http://", "https://")):
            raise ScrapydError(f"{path}:{number}: expected 'NAME http(s)://host:port/'")
        if urlsplit(parts[1]).password:
            raise ScrapydError(f"{path}:{number}: no credentials in the targets file "
                               "(use SCRAPYD_USERNAME/SCRAPYD_PASSWORD or ~/.netrc)")
        out[parts[0]] = Target(parts[0], parts[1], project)
    return out


def build_egg(project_dir: str | Path = ".") -> Path:
    """Build the project egg (runtime package only) into a temporary directory."""
    out = Path(tempfile.mkdtemp(prefix="crawlctl-egg-"))
    # A build directory of its own: setuptools packs everything under build/lib,
    # so a checkout's old build/ would ship modules since moved or deleted.
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base",
                           str(out / "build"), "bdist_egg", "--bdist-dir", str(out / "bdist"),
                           "-d", str(out)],
                          cwd=project_dir, capture_output=True, text=True)
    eggs = glob.glob(str(out / "*.egg"))
    if proc.returncode != 0 or not eggs:
        raise ScrapydError(f"building the egg failed:\n{proc.stderr[-2000:]}")
    return Path(eggs[0])


def _call(target: Target, method: str, action: str, **kwargs) -> dict:
    url = urljoin(target.url if target.url.endswith("/") else target.url + "/", action)
    try:
        response = requests.request(method, url, auth=target.auth(), timeout=TIMEOUT, **kwargs)
    except requests.RequestException as exc:
        raise ScrapydError(f"{target.where}: {type(exc).__name__}: {exc}") from None
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code != 200 or not isinstance(data, dict) or data.get("status") != "ok":
        message = (data or {}).get("message") if isinstance(data, dict) else None
        text = message or response.text.strip()[:500] or response.reason
        raise ScrapydError(f"{target.where}: HTTP {response.status_code}: {text}")
    return data


def upload(target: Target, egg: Path, version: str) -> dict:
    """``addversion.json``: the egg as *version* of the target's project."""
    with open(egg, "rb") as f:
        return _call(target, "POST", "addversion.json",
                     data={"project": target.project, "version": version},
                     files={"egg": ("project.egg", f)})


def schedule(target: Target, spider: str, settings: dict[str, str],
             args: dict[str, str] | None = None) -> str:
    """``schedule.json``; returns the job id."""
    data = [("project", target.project), ("spider", spider)]
    data += [("setting", f"{k}={v}") for k, v in settings.items()]
    data += list((args or {}).items())
    return _call(target, "POST", "schedule.json", data=data)["jobid"]


def jobs(target: Target) -> dict:
    """``listjobs.json`` of the target's project: pending, running, finished."""
    return _call(target, "GET", "listjobs.json", params={"project": target.project})


def default_version() -> str:
    """The git commit when there is one (and clean), else a timestamp."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return f"{int(time.time())}-{rev}{'-dirty' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return str(int(time.time()))
