"""The crawlproject add-on (crawlproject/addon.py): the README's one line gives a
project what the block of earlier versions listed, the project's own settings win,
``scrapy settings --get`` shows the defaults, and a project with the old block
(alone or next to the add-on) gets each component once.

Settings are built as Scrapy builds a crawler's (the settings module's values at
``project`` priority, ``-s`` at ``cmdline``, then ``ADDONS`` applied); one
``scrapy settings`` subprocess checks the command line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from scrapy.crawler import Crawler
from scrapy.settings import Settings
from scrapy.spiders import Spider
from scrapy.utils.misc import load_object

from crawlproject.connection import redis_url_from_settings
from crawlproject.defaults import DEFAULTS, ENVIRONMENT, is_set, setting
from tests.crawl_helpers import ROOT, readme_settings, user_project

#: README.md's settings block before the add-on, as users pasted it.
OLD_BLOCK = (ROOT / "tests" / "readme_block_before_addon.txt").read_text()
ADDON = "crawlproject.addon.Addon"
COMPONENTS = ("DOWNLOADER_MIDDLEWARES", "SPIDER_MIDDLEWARES", "ITEM_PIPELINES", "EXTENSIONS")
SCALARS = ("SCHEDULER", "TWISTED_REACTOR", "REMOTE_CONTROL_ENABLED", "DOWNLOAD_MAXSIZE",
           "DOWNLOAD_WARNSIZE", "DOWNLOAD_TIMEOUT", "DOWNLOAD_DELAY",
           "CONCURRENT_REQUESTS_PER_DOMAIN", "COMMANDS_MODULE", "FRONTIER_SECRET")
#: connection settings the old block hard-coded
HARD_CODED_BEFORE = ("REDIS_URL", "MONGO_URI", "MONGO_DATABASE")


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def built(project: dict | str, cmdline: dict | None = None) -> Settings:
    """A crawler's settings: *project* (a dict, or settings.py text) at project
    priority, *cmdline* as ``-s``, the add-ons applied."""
    if isinstance(project, str):
        values: dict = {}
        exec(project, values)  # noqa: S102 - a settings module's text
        project = {k: v for k, v in values.items() if k.isupper()}
    settings = Settings()
    settings.setdict(project, "project")
    settings.setdict(cmdline or {}, "cmdline")
    crawler = Crawler(Spider, settings)
    crawler.addons.load_settings(crawler.settings)
    return crawler.settings


def components(settings: Settings, name: str) -> dict:
    """The components a crawler builds for *name*: {class: order}, Scrapy's
    ``_BASE`` merged; raises if one class is listed under two paths."""
    merged: dict = {}
    for path, order in settings.getwithbase(name).items():
        cls = load_object(path)
        assert cls not in merged, f"{name}: {cls.__qualname__} listed twice"
        merged[cls] = order
    return {cls: order for cls, order in merged.items() if order is not None}


def handlers(settings: Settings) -> dict:
    return {scheme: load_object(path) for scheme, path in
            settings.getwithbase("DOWNLOAD_HANDLERS").items() if path is not None}


def effective(settings: Settings) -> dict:
    """Everything the comparison covers: components, handlers, scalars, and
    every crawlproject setting as the components read it."""
    return {**{name: components(settings, name) for name in COMPONENTS},
            "DOWNLOAD_HANDLERS": handlers(settings),
            **{name: settings.get(name) for name in SCALARS},
            **{name: setting(settings, name) for name in DEFAULTS}}


def test_the_readme_add_on_line_gives_what_the_old_block_gave():
    new, old = readme_settings(), built(OLD_BLOCK)
    assert ADDON in new.getdict("ADDONS") and ADDON not in old.getdict("ADDONS")
    mine, theirs = effective(new), effective(old)
    # The old block wrote the connection in (MONGO_DATABASE = "crawl"...), over the
    # environment; the new one leaves it to the environment (below): not compared.
    assert [n for n in mine if mine[n] != theirs[n] and n not in HARD_CODED_BEFORE] == []
    # what it gives, in so many words (not only "the same as before")
    assert new["SCHEDULER"] == "crawlproject.scheduler.RedisScheduler"
    assert new.getint("DOWNLOAD_MAXSIZE") == 16 * 1024 * 1024
    assert not new.getbool("REMOTE_CONTROL_ENABLED")
    middlewares = {cls.__qualname__: order for cls, order in
                   components(new, "DOWNLOADER_MIDDLEWARES").items()}
    assert middlewares["LimitedHttpCompressionMiddleware"] == 590
    assert "HttpCompressionMiddleware" not in middlewares and "RetryMiddleware" not in middlewares


def test_the_add_on_alone_installs_the_old_blocks_components_and_limits():
    """Without the rendering add-on: the handler is the add-on's own."""
    alone, old = built({"ADDONS": {ADDON: 0}}), built(OLD_BLOCK, {"ADDONS": {}})
    for name in COMPONENTS:
        assert components(alone, name) == components(old, name), name
    assert handlers(alone) == handlers(old)
    assert {handlers(alone)[s].__qualname__ for s in ("http", "https")} == {
        "BoundedHTTP11DownloadHandler"}
    for name in ("SCHEDULER", "DOWNLOAD_MAXSIZE", "DOWNLOAD_WARNSIZE", "DOWNLOAD_TIMEOUT",
                 "REMOTE_CONTROL_ENABLED", "TWISTED_REACTOR"):
        assert alone[name] == old[name], name


@pytest.mark.parametrize("order", ["addon first", "rendering first"])
def test_the_rendering_add_on_handler_wins_in_either_order(order):
    addons = {ADDON: 0, "crawlproject.rendering.RenderingAddon": 0}
    if order == "rendering first":
        addons = dict(reversed(addons.items()))
    assert {h.__qualname__ for h in handlers(built({"ADDONS": addons})).values()} >= {
        "RenderingDownloadHandler"}


def test_the_old_block_and_the_add_on_together_install_nothing_twice():
    both = built(OLD_BLOCK + f"\nADDONS[{ADDON!r}] = 0\n")
    assert effective(both) == effective(built(OLD_BLOCK))   # components() raises on a twin
    # an old path (before the capability packages), a moved order and a component
    # switched off: the project's entry is the only one
    mine = built({"ADDONS": {ADDON: 0}, "DOWNLOADER_MIDDLEWARES": {
        "crawlproject.middlewares.identity.IdentityMiddleware": 611,
        "crawlproject.egress.middleware.EgressMiddleware": None}})
    paths = mine.getdict("DOWNLOADER_MIDDLEWARES")
    assert "crawlproject.identity.middleware.IdentityMiddleware" not in paths
    by_name = {cls.__qualname__: order for cls, order in
               components(mine, "DOWNLOADER_MIDDLEWARES").items()}
    assert by_name["IdentityMiddleware"] == 611 and "EgressMiddleware" not in by_name


def test_this_projects_settings_with_the_add_on_are_those_without_it():
    def project(addon: bool) -> Settings:
        module = Settings()
        module.setmodule("crawlproject.settings", priority="project")
        addons = module.getdict("ADDONS")
        if not addon:
            addons.pop(ADDON)
        return built({k: module[k] for k in module if module.getpriority(k) > 0},
                     {"ADDONS": addons})

    with_addon, without = project(True), project(False)
    assert ADDON in with_addon.getdict("ADDONS")
    assert effective(with_addon) == effective(without)


def test_the_projects_and_the_command_lines_values_win():
    settings = built({"ADDONS": {ADDON: 0}, "DOWNLOAD_MAXSIZE": 1024, "FRONTIER_SITE_BUDGET": 5,
                      "SCHEDULER": "scrapy.core.scheduler.Scheduler",
                      "ITEM_PIPELINES": {"crawlproject.pipelines.mongo.MongoPipeline": None}},
                     {"DOWNLOAD_TIMEOUT": "7", "MONGO_BULK_SIZE": "9"})
    assert settings.getint("DOWNLOAD_MAXSIZE") == 1024
    assert settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert settings.getint("DOWNLOAD_TIMEOUT") == 7
    assert setting(settings, "FRONTIER_SITE_BUDGET") == 5
    assert setting(settings, "MONGO_BULK_SIZE") == 9
    assert {c.__qualname__ for c in components(settings, "ITEM_PIPELINES")} == {
        "ValidationPipeline"}
    # the defaults are in the settings themselves, at "default" priority
    assert settings["MONGO_FLUSH_INTERVAL"] == DEFAULTS["MONGO_FLUSH_INTERVAL"]
    assert settings.getpriority("MONGO_FLUSH_INTERVAL") == 0
    assert settings["SEED_META_ALLOW"] == [] and settings["SEED_META_ALLOW"] is not \
        DEFAULTS["SEED_META_ALLOW"]   # a copy: a component that appends changes no default


def test_environment_settings_keep_their_order_settings_py_then_environment_then_default(
        monkeypatch):
    assert setting(built({"ADDONS": {ADDON: 0}}), "REDIS_URL") == DEFAULTS["REDIS_URL"]
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.9:1/0")
    from_env = built({"ADDONS": {ADDON: 0}})
    assert from_env["REDIS_URL"] == setting(from_env, "REDIS_URL") == "redis://127.0.0.9:1/0"
    assert setting(built({"ADDONS": {ADDON: 0}, "REDIS_URL": "redis://127.0.0.8:2/0"}),
                   "REDIS_URL") == "redis://127.0.0.8:2/0"
    # scrapy-redis' REDIS_HOST still applies when REDIS_URL is only the add-on's default
    monkeypatch.delenv("REDIS_URL")
    host = built({"ADDONS": {ADDON: 0}, "REDIS_HOST": "127.0.0.7"})
    assert not is_set(host, "REDIS_URL")
    assert redis_url_from_settings(host) == "redis://127.0.0.7:6379/0"


def test_scrapy_settings_get_shows_the_add_ons_defaults_in_a_readme_project(tmp_path):
    project = user_project(tmp_path / "project", "userproj", "")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)

    def get(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "scrapy", "settings", *args], cwd=project,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    assert get("--get", "FRONTIER_SITE_BUDGET") == str(DEFAULTS["FRONTIER_SITE_BUDGET"])
    assert get("--get", "FRONTIER_SITE_BUDGET", "-s", "FRONTIER_SITE_BUDGET=7") == "7"


def test_the_readme_block_leaves_the_connection_to_the_environment(monkeypatch):
    """Issue 48: the block hard-coded REDIS_URL/MONGO_URI, so a node of a new project
    went to 127.0.0.1:6379 whatever the operator exported. The environment wins over
    the defaults; a value in settings.py (or -s) wins over the environment."""
    env = {"REDIS_URL": "redis://127.0.0.9:7151/0", "MONGO_URI": "mongodb://127.0.0.9:7152/",
           "MONGO_DATABASE": "ops", "FRONTIER_SECRET": "s" * 32}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = readme_settings()
    assert {name: setting(settings, name) for name in env} == env
    assert redis_url_from_settings(settings) == env["REDIS_URL"]
    pinned = readme_settings({"REDIS_URL": "redis://127.0.0.8:7153/0"})
    assert redis_url_from_settings(pinned) == "redis://127.0.0.8:7153/0"


def test_the_add_on_turns_the_telnet_console_off():
    """Scrapy's telnet console (a Python shell into the crawl) is on by default and
    its password is logged at INFO: off in a project with the add-on, as in the
    README's block; a project that wants it sets it in settings.py."""
    from scrapy.settings import default_settings

    assert default_settings.TELNETCONSOLE_ENABLED   # what a new project has without it
    assert not built({"ADDONS": {ADDON: 0}}).getbool("TELNETCONSOLE_ENABLED")
    assert not readme_settings().getbool("TELNETCONSOLE_ENABLED")
    assert built({"ADDONS": {ADDON: 0}, "TELNETCONSOLE_ENABLED": True}).getbool(
        "TELNETCONSOLE_ENABLED")
