"""Every crawlproject default is written once, in crawlproject/defaults.py.

The code is scanned (ast) for the settings it reads; the README's settings
table and this project's settings.py are checked against defaults.py.
"""

import ast
import re
import warnings
from pathlib import Path

import pytest
from scrapy.settings import Settings
from scrapy.settings import default_settings as scrapy_defaults

from crawlproject import defaults
from crawlproject import settings as project_settings
from crawlproject.defaults import DEFAULTS, ENVIRONMENT, PLAYWRIGHT_SETTINGS, setting
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.retrypolicy import RetryPolicy

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "crawlproject"
NAME = re.compile(r"^[A-Z][A-Z0-9_]+$")
GETTERS = {"get", "getbool", "getint", "getfloat", "getlist", "getdict", "getdictorlist",
           "getwithbase", "getpriority", "set", "setdefault"}
SCRAPY = {name for name in vars(scrapy_defaults) if NAME.match(name)}
SCRAPY |= {"CONCURRENT_REQUESTS_PER_IP"}   # deprecated: a module __getattr__ of Scrapy 2.19
#: README rows whose default is described, not a value (computed or found at run time).
DESCRIBED = {
    "SCHEDULER_PREFETCH": "max(16, CONCURRENT_REQUESTS // 4) when 0",
    "SEEDS_MAX_PENDING": "2 x batch size when 0",
    "NODE_ID": "the host name when unset",
    "CHROMIUM_PATH": "looked for in the usual places when unset",
    "IDENTITY_OS": "any (an empty list)",
    "PROXY_BAN_BODY_PATTERNS": "regexes, described",
    "URL_SESSION_PARAMS": "a regex, described",
    "PROXY_BAN_REDIRECT_PATTERNS": "regexes, described",
    "USER_AGENT": "Scrapy's",
}
#: README rows that are environment variables of the dashboard, not settings.
ENVIRONMENT_ONLY = {"DASHBOARD_TOKEN", "DASHBOARD_USERNAME", "DASHBOARD_PASSWORD"}


def _scrapy_default(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(scrapy_defaults, name)


def _reads():
    """(path:line, how, name, extra arguments) of every setting the package reads or sets."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func, args = node.func, node.args
                fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if fname in ("setting", "is_set") and len(args) >= 2:
                    arg, extra = args[1], args[2:] + node.keywords
                elif (isinstance(func, ast.Attribute) and fname in GETTERS and args
                      and not ast.unparse(func.value).endswith("environ")):
                    arg, extra = args[0], args[1:] + node.keywords
                    if fname in ("set", "setdefault"):
                        extra = []  # a value set, not a default
                else:
                    continue
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                        and NAME.match(arg.value):
                    found.append((f"{rel}:{node.lineno}", fname, arg.value, extra))
            elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                  and isinstance(node.slice.value, str) and NAME.match(node.slice.value)
                  and re.search(r"(^s|settings)$", ast.unparse(node.value))):
                found.append((f"{rel}:{node.lineno}", "[]", node.slice.value, []))
    return found


def test_the_scan_finds_the_reads():
    names = {name for _, _, name, _ in _reads()}
    assert {"MONGO_BULK_SIZE", "SCHEDULER_LEASE_TTL", "DOWNLOAD_DELAY", "REDIS_URL",
            "PLAYWRIGHT_MAX_CONTEXTS"} <= names
    assert len(names) > 100


def test_every_setting_read_is_scrapys_or_in_defaults():
    unknown = sorted({f"{where} {name}" for where, _, name, _ in _reads()
                      if name not in SCRAPY and name not in DEFAULTS
                      and name not in PLAYWRIGHT_SETTINGS})
    assert not unknown, "add these to crawlproject/defaults.py:\n" + "\n".join(unknown)


def test_no_call_site_writes_a_default():
    """crawlproject settings only through setting(): one default; Scrapy's
    settings with no second argument: Scrapy's default."""
    wrong = []
    for where, how, name, extra in _reads():
        if name in DEFAULTS and how not in ("setting", "is_set"):
            wrong.append(f"{where}: settings.{how}({name!r}) - use setting(settings, {name!r})")
        elif extra:
            wrong.append(f"{where}: {how}({name!r}, {', '.join(map(ast.unparse, extra))})")
    assert not wrong, "\n".join(wrong)


def test_defaults_are_commented_and_typed():
    source = (PACKAGE / "defaults.py").read_text()
    for name in DEFAULTS:
        line = next(ln for ln in source.splitlines() if re.match(rf"{name}\b.*=", ln))
        assert "#" in line, f"{name}: one-line comment"
        assert name not in SCRAPY, f"{name} is Scrapy's own setting: keep Scrapy's default"
    assert not ENVIRONMENT - set(DEFAULTS)


def _bare_settings(monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    return Settings()


def test_a_project_without_our_settings_gets_the_defaults(monkeypatch):
    bare = _bare_settings(monkeypatch)
    for name, value in DEFAULTS.items():
        got = setting(bare, name)
        assert got == value and type(got) is type(value), name
    assert setting(None, "MONGO_URI") == defaults.MONGO_URI
    assert BloomConfig.from_settings(bare) == BloomConfig()
    assert RetryPolicy.from_settings(bare) == RetryPolicy()


def test_this_project_differs_only_where_settings_py_says(monkeypatch):
    bare = _bare_settings(monkeypatch)
    project = Settings()
    project.setmodule(project_settings, priority="project")
    differ = {name for name in DEFAULTS if setting(project, name) != setting(bare, name)}
    assert differ == {name for name in DEFAULTS if hasattr(project_settings, name)}


def test_values_from_the_command_line_and_environment(monkeypatch):
    s = Settings({"DUPEFILTER_CAPACITY": "1e7", "REDIS_CLUSTER": "yes", "MONGO_COLLECTION": "",
                  "RECRAWL_RULES": '[{"pattern": "/p/", "interval": 60}]',
                  "PROXY_BAN_HTTP_CODES": "403,429,418",
                  "REFERER_SEED_BY_DOMAIN": '{"a.b": "root"}'})
    assert setting(s, "DUPEFILTER_CAPACITY") == 10_000_000
    assert setting(s, "REDIS_CLUSTER") is True
    assert setting(s, "MONGO_COLLECTION") == "%(spider)s"   # "" is unset
    assert setting(s, "RECRAWL_RULES") == [{"pattern": "/p/", "interval": 60}]
    assert setting(s, "PROXY_BAN_HTTP_CODES") == ["403", "429", "418"]
    assert setting(s, "REFERER_SEED_BY_DOMAIN") == {"a.b": "root"}
    monkeypatch.setenv("MAX_IDLE_TIME_BEFORE_CLOSE", "60")
    monkeypatch.setenv("MONGO_BULK_SIZE", "7")   # not an environment setting
    assert setting(Settings(), "MAX_IDLE_TIME_BEFORE_CLOSE") == 60.0
    assert setting(Settings({"MAX_IDLE_TIME_BEFORE_CLOSE": 5}), "MAX_IDLE_TIME_BEFORE_CLOSE") == 5.0
    assert setting(Settings(), "MONGO_BULK_SIZE") == 500
    defaults_list = setting(Settings(), "IDENTITY_BROWSERS")
    defaults_list.append("Lynx")   # a caller's change never reaches the default
    assert "Lynx" not in defaults.IDENTITY_BROWSERS
    with pytest.raises(KeyError, match="not a crawlproject setting"):
        setting(Settings(), "DOWNLOAD_DELAY")


def test_settings_py_repeats_no_default():
    repeated = []
    for name, value in vars(project_settings).items():
        if not NAME.match(name):
            continue
        if name in DEFAULTS and _same(value, DEFAULTS[name]):
            repeated.append(f"{name} = {value!r} (crawlproject/defaults.py)")
        elif name in SCRAPY and _same(value, _scrapy_default(name)):
            repeated.append(f"{name} = {value!r} (Scrapy's default)")
    assert not repeated, "\n".join(repeated)


# --- the README's settings table ------------------------------------------------

def _readme_rows():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| setting | default | meaning |")
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        yield cells[0], cells[1]


def _names(cell: str) -> list[str]:
    names = []
    for part in re.findall(r"`([^`]+)`", cell):
        if part.startswith("_") and names:  # `REDIS_START_URLS_AS_SET` / `_AS_ZSET`
            stem = names[-1].split("_")
            part = "_".join(stem[:len(stem) - part.count("_")]) + part
        names.append(part)
    return names


def _literal(text: str):
    if text in ("true", "false"):
        return text == "true"
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _literal(ast.unparse(node.left)) ** _literal(ast.unparse(node.right))
    try:
        return ast.literal_eval(node)
    except ValueError:
        return text


def _same(documented, default) -> bool:
    if isinstance(default, (list, tuple)) and isinstance(documented, str):
        documented = [p.strip() for p in documented.split(",")]
    if isinstance(default, bool) or isinstance(documented, bool):
        return documented is default
    if isinstance(default, (list, tuple)) and isinstance(documented, (list, tuple)):
        return list(documented) == list(default)
    return documented == default


def _documented(part: str):
    """The value a README default cell shows (None when it only describes it)."""
    if part.strip() == "unset":
        return None, True
    spans = [s for s in re.findall(r"`([^`]*)`", part) if not s.startswith("$")]
    if len(spans) == 1 or "(" in part and spans:
        return _literal(spans[0]), True
    if len(spans) > 1:
        return spans, True
    return None, False


def test_readme_settings_table_agrees_with_defaults():
    wrong, checked = [], 0
    for name_cell, default_cell in _readme_rows():
        names = _names(name_cell)
        parts = default_cell.split(" / ")
        if len(parts) != len(names):
            parts = [default_cell] * len(names)
        for name, part in zip(names, parts):
            assert name in DEFAULTS or name in SCRAPY or name in PLAYWRIGHT_SETTINGS \
                or name in ENVIRONMENT_ONLY, f"README lists {name}, which nothing reads"
            if name in DESCRIBED or name in ENVIRONMENT_ONLY or name in PLAYWRIGHT_SETTINGS:
                continue
            default = DEFAULTS[name] if name in DEFAULTS else _scrapy_default(name)
            ours = re.search(r"\(this project: `([^`]*)`\)", part)
            if ours:
                if not _same(_literal(ours.group(1)), getattr(project_settings, name)):
                    wrong.append(f"{name}: README says this project's is {ours.group(1)}")
                part = part[:ours.start()]
            elif "this project" in part:
                default = getattr(project_settings, name)
            value, shown = _documented(part)
            if not shown:
                wrong.append(f"{name}: README default {part!r} is no value (add it to DESCRIBED?)")
            elif not _same(value, default):
                wrong.append(f"{name}: README {part!r}, defaults {default!r}")
            checked += 1
    assert checked > 100
    assert not wrong, "\n".join(wrong)
    readme = (ROOT / "README.md").read_text()
    listed = {name for cell, _ in _readme_rows() for name in _names(cell)}
    assert not [name for name in DEFAULTS if name not in readme and name not in listed], \
        "settings the README does not mention"
