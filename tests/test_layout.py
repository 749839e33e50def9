"""The package's layering, read from its imports (``ast``, no import run).

* the frontier (``crawlproject/frontier``) knows Redis, not Scrapy: it imports
  neither Scrapy, Twisted nor tldextract, nor any Scrapy-side module of ours;
* one capability, one package (issue 37): ``proxies/``, ``rendering/``,
  ``recrawl/``, ``identity/`` each hold their plain modules and their Scrapy
  components; the plain ones (the proxy pool and its Redis state, the
  User-Agent tables) import no Scrapy;
* downloader/spider middlewares and extensions, wherever they live, import no
  item pipeline; item pipelines import no middleware or extension (they may
  import a capability's plain modules, e.g. ``recrawl.schedule``);
* item pipelines import no scheduler;
* nothing at run time imports the dev tools (local servers, the demo shop,
  tests, benchmarks);
* the operator's read model (``ops``) imports neither the CLI nor the dashboard;
* no import circles between modules (imports inside functions count too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "crawlproject"
DEV_TOOLS = ("devtools.services", "devtools.demo", "devtools", "tests", "bench")
#: Downloader and spider middlewares and extensions: the old kind-named
#: packages and the capability packages' components.
MIDDLEWARES = ("crawlproject.middlewares", "crawlproject.proxies.middleware",
               "crawlproject.identity.middleware", "crawlproject.identity.cookies",
               "crawlproject.rendering.middleware", "crawlproject.recrawl.middleware")
EXTENSIONS = ("crawlproject.extensions", "crawlproject.recrawl.extension")
#: The capability packages' modules that know neither Scrapy nor Twisted.
PLAIN = ("crawlproject.proxies.pool", "crawlproject.proxies.store",
         "crawlproject.identity.useragents", "crawlproject.rendering.settings",
         "crawlproject.impersonate.profiles", "crawlproject.egress.policy")
SCRAPY_SIDE = (*MIDDLEWARES, *EXTENSIONS, "crawlproject.pipelines", "crawlproject.spiders",
               "crawlproject.scheduler", "crawlproject.scheduling", "crawlproject.rendering",
               "crawlproject.identity.session", "crawlproject.cli", "crawlproject.dashboard",
               "crawlproject.ops", "crawlproject.commands")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module name *path* imports (absolute; ``from a import b`` gives
    ``a`` and ``a.b``), anywhere in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
IMPORTS = {name: imported(path) for name, path in MODULES.items()}


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def breaks(subjects, forbidden) -> list[str]:
    return sorted(f"{mod} imports {dep}" for mod, deps in IMPORTS.items()
                  if under(mod, subjects) for dep in deps if under(dep, forbidden))


def test_the_frontier_imports_no_scrapy_and_nothing_scrapy_side():
    assert breaks(["crawlproject.frontier"],
                  ["scrapy", "twisted", "tldextract", "scrapy_redis", *SCRAPY_SIDE]) == []


def test_middlewares_and_extensions_import_no_pipeline():
    assert breaks([*MIDDLEWARES, *EXTENSIONS], ["crawlproject.pipelines"]) == []


def test_pipelines_import_no_middleware_or_extension():
    assert breaks(["crawlproject.pipelines"], [*MIDDLEWARES, *EXTENSIONS]) == []


def test_a_capabilitys_plain_modules_import_no_scrapy():
    assert [m for m in PLAIN if m not in MODULES] == []
    assert breaks(PLAIN, ["scrapy", "twisted", *SCRAPY_SIDE]) == []


def test_each_capability_package_says_what_it_holds():
    for package in ("proxies", "rendering", "recrawl", "identity", "egress"):
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
        modules = sorted(p.stem for p in (PACKAGE / package).glob("*.py") if p.stem != "__init__")
        assert doc and all(f"crawlproject.{package}.{m}" in doc for m in modules), package


def test_pipelines_import_no_scheduler():
    assert breaks(["crawlproject.pipelines"],
                  ["crawlproject.scheduler", "crawlproject.scheduling"]) == []


def test_nothing_at_run_time_imports_the_dev_tools():
    found = sorted(f"{mod} imports {dep}" for mod, deps in IMPORTS.items()
                   if not under(mod, DEV_TOOLS) for dep in deps if under(dep, DEV_TOOLS))
    assert found == []


def test_the_operators_read_model_imports_neither_the_cli_nor_the_dashboard():
    assert breaks(["crawlproject.ops"], ["crawlproject.cli", "crawlproject.dashboard"]) == []


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (a name resolved to the
    longest module it names; a package's own submodules left out of its
    ``__init__``, which Python imports first anyway)."""
    edges = {}
    for name, deps in IMPORTS.items():
        out = set()
        for dep in deps:
            while dep not in MODULES and "." in dep:
                dep = dep.rpartition(".")[0]
            if dep in MODULES and dep != name:
                out.add(dep)
        edges[name] = out
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_circle_finder_finds_a_circle():
    # The check itself can fail: the CLI <-> dashboard circle this layout removed.
    assert cycles({"a.cli": {"a.dashboard"}, "a.dashboard": {"a.cli"}, "a.ops": set()}) == [
        ["a.cli", "a.dashboard"]]


def test_a_module_over_600_lines_says_why_in_its_docstring():
    """A newcomer finds a room by its name: one idea a module. A module may
    grow past ~600 lines only with the reason stated (``Size (over 600
    lines): ...`` in its docstring)."""
    too_big = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "devtools").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 600:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Size (over 600 lines):" not in doc:
                too_big.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert too_big == []
