"""Which Scrapy project a command runs: the one around it, else this package.

Scrapy finds a project through ``SCRAPY_SETTINGS_MODULE`` or the ``[settings]``
section of a ``scrapy.cfg`` (the closest one up from the working directory, then
``~/.scrapy.cfg`` and ``/etc/scrapy.cfg``; see ``scrapy.utils.conf.init_env``).
The installed package run from any other directory has neither, so ``scrapy``
there knows no project. ``crawlctl`` and ``crawlnode`` (``scrapy`` for this
package: ``crawlnode crawl products``, ``crawlnode list``) then use the
package's own settings, :data:`PACKAGE_SETTINGS`; a project around them (your
own ``scrapy startproject``, this checkout) still wins.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

PACKAGE_SETTINGS = "crawlproject.settings"
ENVVAR = "SCRAPY_SETTINGS_MODULE"


def settings_module() -> str | None:
    """The settings module Scrapy would use here, or None: ``SCRAPY_SETTINGS_MODULE``,
    else ``[settings] <SCRAPY_PROJECT or default>`` of the scrapy.cfg files."""
    from scrapy.utils.conf import get_config

    if os.environ.get(ENVVAR):
        return os.environ[ENVVAR]
    project = os.environ.get("SCRAPY_PROJECT", "default")
    cfg = get_config()
    return cfg.get("settings", project) if cfg.has_option("settings", project) else None


def use_package_settings() -> str:
    """Make Scrapy use :data:`PACKAGE_SETTINGS` when nothing here names a project
    (sets ``SCRAPY_SETTINGS_MODULE``, as ``init_env`` does for a scrapy.cfg, and
    says so at INFO); returns the settings module in use."""
    module = settings_module()
    if module is None:
        module = os.environ[ENVVAR] = PACKAGE_SETTINGS
        logger.info("No Scrapy project here (no scrapy.cfg, no %s): using the installed "
                    "package's settings, %s", ENVVAR, module)
    return module


def crawlnode() -> None:
    """``crawlnode``: ``scrapy`` with this package as the default project."""
    from scrapy.cmdline import execute

    use_package_settings()
    execute()
