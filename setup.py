"""What ``crawlctl deploy`` (and ``scrapyd-deploy``) runs to build the scrapyd
egg: ``python setup.py bdist_egg``. Everything else is in pyproject.toml (the
dev tools live outside the package, in ``devtools/``, so nothing is left out
here).
"""

from setuptools import setup

setup()
