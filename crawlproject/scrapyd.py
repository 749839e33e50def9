"""Deploy to, start on and list the jobs of many scrapyd nodes (``crawlctl deploy``,
``schedule``, ``jobs``).

Targets are the ``[deploy:NAME]`` sections of ``scrapy.cfg`` (``url``, ``project``,
optional ``username``, ``credentials_file``) or a targets file of ``NAME URL
[CREDENTIALS_FILE]`` lines (``#`` comments). Credentials never live in the
repository nor on the command line, and each node may have its own (scrapyd-node.sh
generates a password per node): a target's credentials file (``SCRAPYD_USERNAME=``
and ``SCRAPYD_PASSWORD=`` lines, as the node's own ``scrapyd.env`` has them; mode
600, else refused), else its ``username``/``password`` from ``scrapy.cfg`` if an
operator put them there, else ``SCRAPYD_USERNAME`` / ``SCRAPYD_PASSWORD`` from the
environment (one password shared by every node on purpose), else ``~/.netrc``
(requests reads it for the target's host: two nodes on one host cannot be told
apart there). Passwords are never printed.

Unlike ``scrapyd-deploy`` (which exits 0 when an upload is refused with
``{"status": "error"}``, and with ``-a`` whatever happens), every call here checks
both the HTTP status and scrapyd's JSON ``status``: a target that refuses is named
with scrapyd's message and the command exits non-zero after trying the others.
The egg is built once and uploaded to every target: ``python setup.py bdist_egg``
in a checkout (the runtime package only, see setup.py), else the same egg made from
the installed package's files (``pip install`` of the wheel: no setup.py there).
"""

from __future__ import annotations

import configparser
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests
from requests.auth import HTTPBasicAuth
from requests.utils import get_netrc_auth

TIMEOUT = 30.0


CREDENTIALS_HELP = ("crawlctl reads a target's credentials from its credentials file (the "
                    "third field of its targets-file line, or credentials_file in scrapy.cfg "
                    "[deploy:NAME]: SCRAPYD_USERNAME= and SCRAPYD_PASSWORD= lines, as in the "
                    "node's scrapyd.env, mode 600), else its username/password in "
                    "scrapy.cfg [deploy:NAME], else SCRAPYD_USERNAME and SCRAPYD_PASSWORD in "
                    "the environment, else ~/.netrc (machine <host> login <user> password "
                    "<password>)")

#: the keys of a credentials file (those of the node's scrapyd.env)
CREDENTIAL_KEYS = ("SCRAPYD_USERNAME", "SCRAPYD_PASSWORD")


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

    #: where username/password came from ("[deploy:NAME] of scrapy.cfg"); None: a targets file
    origin: str | None = field(default=None, repr=False)
    #: this target's own credentials file (read when a request is made)
    credentials_file: Path | None = None

    def _from_file(self) -> tuple[str, str]:
        """(user, password) of :attr:`credentials_file`; :class:`ScrapydError`
        naming the target and the file when it cannot be used."""
        path = self.credentials_file
        try:
            mode = path.stat().st_mode
            text = path.read_text()
        except OSError as exc:
            raise ScrapydError(f"{self.where}: cannot read its credentials file {path}: "
                               f"{exc.strerror or exc}") from None
        if mode & 0o077:
            raise ScrapydError(f"{self.where}: its credentials file {path} is readable by "
                               f"others (mode {mode & 0o777:o}): chmod 600 {path}")
        values = {}
        for line in text.splitlines():
            name, sep, value = line.strip().partition("=")
            if sep and name.strip() in CREDENTIAL_KEYS:
                values[name.strip()] = value.strip().strip("'\"")
        missing = [k for k in CREDENTIAL_KEYS if not values.get(k)]
        if missing:
            raise ScrapydError(f"{self.where}: its credentials file {path} has no "
                               f"{' and no '.join(missing)} line (expected "
                               "SCRAPYD_USERNAME=... and SCRAPYD_PASSWORD=..., as in the "
                               "node's scrapyd.env)")
        return values["SCRAPYD_USERNAME"], values["SCRAPYD_PASSWORD"]

    def _credentials(self) -> tuple[str | None, str | None, str, str]:
        """(user, password, where each came from): the target's credentials file,
        else its scrapy.cfg values, else the environment's."""
        if self.credentials_file is not None:
            user, password = self._from_file()
            where = f"{self.credentials_file} (credentials file of {self.name})"
            return user, password, where, where
        user, user_from = ((self.username, self.origin) if self.username
                           else (os.environ.get("SCRAPYD_USERNAME"), "SCRAPYD_USERNAME"))
        password, password_from = ((self.password, self.origin) if self.password
                                   else (os.environ.get("SCRAPYD_PASSWORD"), "SCRAPYD_PASSWORD"))
        return user, password, user_from, password_from

    def auth(self) -> HTTPBasicAuth | None:
        """Basic auth from the target, else the environment; None lets requests
        use ``~/.netrc``."""
        user, password, _, _ = self._credentials()
        if user and password:
            return HTTPBasicAuth(user, password)
        return None

    def credentials_sent(self) -> str:
        """Which credentials a request to this target carries and where they come
        from, without the password."""
        user, password, user_from, password_from = self._credentials()
        if user and password:
            if user_from == password_from:
                return f"user {user!r} and password from {user_from}"
            return f"user {user!r} from {user_from}, password from {password_from}"
        half = (f" (user {user!r} from {user_from} without a password: not used)" if user
                else f" (a password from {password_from} without a user name: not used)"
                if password else "")
        netrc = os.environ.get("NETRC") or "~/.netrc"
        found = get_netrc_auth(self.url)
        if found:
            return f"user {found[0]!r} and password from {netrc}{half}"
        return f"none{half}: no entry for {urlsplit(self.url).hostname} in {netrc}"

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
            secret = sec.get("credentials_file")
            out[name] = Target(name, sec["url"], sec.get("project", "crawlproject"),
                               sec.get("username"), sec.get("password"),
                               origin=f"[{section}] of {Path(path).resolve()}",
                               credentials_file=_beside(path, secret) if secret else None)
    return out


def targets_from_file(path: str | Path, project: str = "crawlproject") -> dict[str, Target]:
    """``NAME URL [CREDENTIALS_FILE]`` per line (``#`` comments): no credentials in
    the file itself; a credentials file's path is relative to the targets file."""
    out = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (2, 3) or not parts[1].startswith(("http://", "https://")):
            raise ScrapydError(f"{path}:{number}: expected 'NAME http(s)://host:port/ "
                               "[CREDENTIALS_FILE]'")
        if urlsplit(parts[1]).password:
            raise ScrapydError(f"{path}:{number}: no credentials in the targets file "
                               "(name a credentials file as the third field, or use "
                               "SCRAPYD_USERNAME/SCRAPYD_PASSWORD or ~/.netrc)")
        out[parts[0]] = Target(parts[0], parts[1], project, credentials_file=_beside(
            path, parts[2]) if len(parts) == 3 else None)
    return out


def _beside(config: str | Path, path: str) -> Path:
    """*path* (``~`` expanded), relative to the directory of the file *config* that names it."""
    return Path(config).resolve().parent / Path(path).expanduser()


def build_egg(project_dir: str | Path = ".") -> Path:
    """Build the project egg (runtime package only) into a temporary directory:
    with *project_dir*'s setup.py (a checkout), else from the installed package."""
    project_dir = Path(project_dir)
    if (project_dir / "setup.py").is_file():
        return _setuptools_egg(project_dir)
    from crawlproject.project import PACKAGE_SETTINGS, settings_module

    module = settings_module()
    if module is not None and module.split(".")[0] != PACKAGE_SETTINGS.split(".")[0]:
        raise ScrapydError(f"no setup.py in {project_dir.resolve()} to build the egg of the "
                           f"project of {module} (scrapyd-deploy writes one), or pass --egg")
    installed = _installed_package()
    if installed is not None:
        return _egg_from_installed(*installed)
    # This package on sys.path from a checkout (or installed editable): build there.
    source = Path(__file__).resolve().parent.parent
    if (source / "setup.py").is_file():
        return _setuptools_egg(source)
    raise ScrapydError(f"no setup.py in {project_dir.resolve()} and no installed crawlproject "
                       "package to build the egg from (pass --egg)")


def _setuptools_egg(project_dir: Path) -> Path:
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


def _installed_package():
    """(distribution, its files in the package) of the crawlproject imported here,
    if pip installed it (an editable install or a checkout has no such files)."""
    from importlib import metadata

    package = Path(__file__).resolve().parent
    try:
        dist = metadata.distribution("crawlproject")
    except metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or () if f.parts[0] == package.name
             and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    init = next((f for f in files if f.parts == (package.name, "__init__.py")), None)
    if init is None or Path(dist.locate_file(init)).resolve() != package / "__init__.py":
        return None
    return dist, files


def _egg_from_installed(dist, files) -> Path:
    """The egg ``bdist_egg`` makes, from the installed files (pip's RECORD): the
    package, and the ``EGG-INFO`` scrapyd reads (``PKG-INFO`` to find the egg,
    ``entry_points.txt`` for ``[scrapy] settings``)."""
    version = sys.version_info
    out = Path(tempfile.mkdtemp(prefix="crawlctl-egg-"))
    egg = out / f"crawlproject-{dist.version}-py{version.major}.{version.minor}.egg"
    info = {"PKG-INFO": dist.read_text("METADATA"),
            "entry_points.txt": dist.read_text("entry_points.txt"),
            "requires.txt": _requires_txt(dist.requires or ()),
            "top_level.txt": "crawlproject\n", "dependency_links.txt": "\n",
            "zip-safe": "\n"}
    with zipfile.ZipFile(egg, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in info.items():
            if text is None:
                raise ScrapydError(f"the installed crawlproject has no {name} "
                                   f"({dist.locate_file('')})")
            z.writestr(f"EGG-INFO/{name}", text)
        for f in sorted(files, key=str):
            z.write(dist.locate_file(f), f.as_posix())
    return egg


def _requires_txt(requires) -> str:
    """Requires-Dist lines as setuptools' requires.txt: the base, then ``[extra]``s."""
    sections: dict[str, list[str]] = {"": []}
    for line in requires:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        sections.setdefault(extra.group(1) if extra else "", []).append(requirement.strip())
    return "\n".join(f"[{name}]\n" * bool(name) + "".join(f"{r}\n" for r in sections[name])
                     for name in sorted(sections))


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
    if response.status_code == 401:
        raise ScrapydError(f"{target.where}: HTTP 401: {response.reason or 'Unauthorized'}: "
                           f"credentials sent: {target.credentials_sent()}. {CREDENTIALS_HELP}")
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
