"""Build hooks the pyproject.toml cannot express.

``crawlproject.services`` (embedded Redis and MongoDB-wire servers for the demo,
the tests and one machine) is a module of the package, so package discovery
would ship it; it is left out of wheels and eggs here. Also what
``crawlctl deploy`` (and ``scrapyd-deploy``) runs to build the scrapyd egg:
``python setup.py bdist_egg``.
"""

from setuptools import setup
from setuptools.command.build_py import build_py

LOCAL_ONLY = {("crawlproject", "services")}


class RuntimeOnly(build_py):
    """build_py without the local-only modules."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if (m[0], m[1]) not in LOCAL_ONLY]


setup(cmdclass={"build_py": RuntimeOnly})
