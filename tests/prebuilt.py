"""The two virtualenvs the suite needs (the wheel installed clean, for
tests/test_install.py; scrapyd's, for tests/test_scrapyd.py), built by
deploy/test.sh while the setup's pip keeps one core busy and leaves the other
idle: built during the tests, they took over a minute of CPU from them.

Standard library only: deploy/test.sh runs this file with the system Python
before the project's virtualenv exists::

    python3 tests/prebuilt.py installed DIR    # DIR/installed.json, then DIR/exit

Each build ends by writing its exit code to ``DIR/exit`` (written whole, at
once); :func:`wait_for` waits for it. The tests build a virtualenv themselves,
as before, when the variable naming it is unset or its build failed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_TIMEOUT = 600  # seconds for one virtualenv build (pip from the index)
#: the variables deploy/test.sh sets, each to the directory of one build
INSTALLED_VAR = "CRAWLPROJECT_TEST_INSTALLED"
NODE_VAR = "CRAWLPROJECT_TEST_SCRAPYD_NODE"


def clean_env(**extra) -> dict:
    """This process's environment without anything pointing at this checkout's venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("SCRAPYD_")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != venv_bin)
    env.update(extra)
    return env


def build_installed(root: Path, builder: str = sys.executable) -> dict:
    """This checkout's wheel (built from what deploy/Dockerfile copies, not this
    checkout's build/, by *builder*: a Python with setuptools and wheel)
    installed into a clean virtualenv in *root*, then its extras render and ops;
    ``pip list`` in between."""
    source = root / "src"
    shutil.copytree(ROOT / "crawlproject", source / "crawlproject",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([builder, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(root), str(source)], check=True, capture_output=True)
    wheel = next(root.glob("crawlproject-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=VENV_TIMEOUT)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    frozen: list[str] = []
    for spec in (str(wheel), f"{wheel}[render,ops]"):
        done = subprocess.run([*pip, "install", "-q", spec], env=clean_env(),
                              capture_output=True, text=True, timeout=VENV_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"pip install {spec} failed:\n{done.stdout[-2000:]}"
                               f"{done.stderr[-3000:]}")
        frozen = frozen or subprocess.run([*pip, "list", "--format=freeze"], env=clean_env(),
                                          capture_output=True, text=True).stdout.split()
    return {"wheel": str(wheel), "venv": str(venv), "frozen_without_extras": frozen}


def wheel_builder(root: Path) -> str:
    """A Python with the setuptools and wheel of requirements-dev.txt (with their
    hashes), as the project's virtualenv has them: a system Python may have
    neither (pip cannot build a wheel without the ``wheel`` package)."""
    lock = (ROOT / "requirements-dev.txt").read_text()
    pinned = [re.search(rf"^{name}==\S+(?: \\\n\s+--hash=\S+)+", lock, re.M).group(0)
              for name in ("setuptools", "wheel")]
    (root / "build-requirements.txt").write_text("\n".join(pinned) + "\n")
    venv = root / "build-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=VENV_TIMEOUT)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--require-hashes", "-r",
                    str(root / "build-requirements.txt")], check=True, capture_output=True,
                   env=clean_env(), timeout=VENV_TIMEOUT)
    return python


def wait_for(variable: str) -> Path | None:
    """The directory of deploy/test.sh's build named by *variable*, once that
    build is over and if it succeeded; None when the variable is unset or the
    build failed (or took over VENV_TIMEOUT)."""
    where = os.environ.get(variable)
    if not where:
        return None
    done = Path(where) / "exit"
    deadline = time.monotonic() + VENV_TIMEOUT
    while not done.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)
    return Path(where) if done.read_text().strip() == "0" else None


def _main(argv: list[str]) -> int:
    what, root = argv[0], Path(argv[1])
    if what != "installed":
        print(f"unknown build {what!r}", file=sys.stderr)
        return 2
    data = build_installed(root, wheel_builder(root))
    (root / "installed.json").write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
