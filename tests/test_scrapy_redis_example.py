"""scrapy-redis' own example project, unchanged but for settings lines, on the
shared scheduler: the README's migration ("Coming from scrapy-redis").

The project comes from the scrapy-redis 0.9.1 source distribution (downloaded
with its hash by ``deploy/setup.sh dev`` into ``.venv/sdists``; nothing of it
is in this repository). Its three spiders run as they are:

* ``dmoz``: a plain ``CrawlSpider`` whose ``start_urls`` is
  ``http://www.dmoz-odp.org/`` and whose rule callbacks are
  ``CrawlSpider._callback`` (private): two nodes;
* ``mycrawler_redis``: scrapy-redis' ``RedisCrawlSpider``, seeds from
  ``mycrawler:start_urls``: two nodes;
* ``myspider_redis``: scrapy-redis' ``RedisSpider``, seeds from
  ``myspider:start_urls``: one node.

Their items go where the example sends them, scrapy-redis' ``RedisPipeline``
(``<spider>:items`` in Redis): each page's items there exactly once.

The example names a real host, so the whole run happens in a network
namespace of its own (``unshare -n -m``: only ``lo``, nothing leaves the
machine) where ``/etc/hosts`` maps ``www.dmoz-odp.org`` to a loopback
address serving a directory laid out as the spider expects
(:mod:`tests.kinds_site`). The test process starts that run
(``python -m tests.test_scrapy_redis_example``) and reads its JSON report.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SDIST = "scrapy_redis-0.9.1.tar.gz"
DMOZ_HOST, SHOP_HOST, SEED_HOST = "127.0.48.20", "127.0.48.21", "127.0.48.22"

#: The settings lines a scrapy-redis user changes (README, "Coming from scrapy-redis").
MIGRATION = '''
# -- moved to crawlproject's shared scheduler (README: Coming from scrapy-redis) --
import os
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
SCHEDULER = "crawlproject.scheduler.RedisScheduler"
FRONTIER_SECRET = os.environ.get("FRONTIER_SECRET")
REDIS_URL = os.environ["REDIS_URL"]
DOWNLOAD_ALLOWED_NETWORKS = ["loopback"]   # the test's sites listen on 127.0.0.x
DOWNLOAD_DELAY = 0
# Not a migration line: the example's spiders set allowed_domains to a filter()
# object, which Scrapy 2.19's OffsiteMiddleware iterates twice (list() then
# get_host_regex()): every followed link is then offsite, with scrapy-redis'
# scheduler as with this one.
DOWNLOADER_MIDDLEWARES = {"scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None}
'''


def sdist() -> Path:
    """scrapy-redis' source distribution, downloaded with its hash if need be."""
    cache = ROOT / ".venv" / "sdists"
    path = cache / SDIST
    if not path.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "--no-build-isolation", "--require-hashes",
                        "-r", str(ROOT / "tests" / "sdists.txt"), "-d", str(cache)],
                       check=True, timeout=300)
    return path


def example_project(where: Path) -> Path:
    """The example project, its settings.py with the migration lines: the
    ``SCHEDULER`` and ``DUPEFILTER_CLASS`` lines of scrapy-redis are removed
    and :data:`MIGRATION` appended; every other file as it was shipped."""
    with tarfile.open(sdist()) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith("scrapy_redis-0.9.1/example-project/")]
        tar.extractall(where, members=members, filter="data")
    project = where / "scrapy_redis-0.9.1" / "example-project"
    settings = project / "example" / "settings.py"
    text = re.sub(r"^(SCHEDULER|DUPEFILTER_CLASS) = .*$", "", settings.read_text(), flags=re.M)
    settings.write_text(text + MIGRATION)
    return project


# -- inside the namespace ---------------------------------------------------------------

def _node(project: Path, spider: str, name: str, env: dict, logs: Path, *args: str):
    return subprocess.Popen(
        [sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_FILE={logs / name}.log",
         "-s", "LOG_LEVEL=INFO", "-s", f"NODE_ID={name}", "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3",
         *args], cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_inside(workdir: Path) -> dict:
    """Everything of the run: Redis, the site, the nodes; the report."""
    import redis as redis_lib

    from devtools.services import RedisServer
    from tests.kinds_site import KindsSite

    project = example_project(workdir)
    logs = workdir / "logs"
    logs.mkdir()
    with RedisServer(data_dir=workdir / "redis") as server, \
            KindsSite([SHOP_HOST, SEED_HOST], directories={DMOZ_HOST: 80}) as site:
        client = redis_lib.Redis.from_url(server.url)
        shop, seeds = site.urls[SHOP_HOST], site.urls[SEED_HOST]
        env = {**os.environ, "REDIS_URL": server.url,
               "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
        nodes = [_node(project, "dmoz", f"dmoz-{n}", env, logs) for n in (1, 2)]
        nodes += [_node(project, "mycrawler_redis", f"mycrawler-{n}", env, logs,
                        "-a", f"domain={SHOP_HOST}") for n in (1, 2)]
        nodes.append(_node(project, "myspider_redis", "myspider-1", env, logs,
                           "-a", f"domain={SEED_HOST}"))
        client.lpush("mycrawler:start_urls", shop)
        client.lpush("myspider:start_urls", *(f"{seeds}product/{i}" for i in range(1, 6)))
        deadline = time.monotonic() + 240
        codes = []
        for node in nodes:
            try:
                codes.append(node.wait(max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                node.kill()
                codes.append("timeout")
        items = {spider: [json.loads(raw) for raw in client.lrange(f"{spider}:items", 0, -1)]
                 for spider in ("dmoz", "mycrawler_redis", "myspider_redis")}
        return {"codes": codes, "items": items, "shop": shop, "seeds": seeds,
                "fetched": {f"{h} {m} {p}": n for (h, m, p), n in site.hits.items()},
                "logs": {p.stem: p.read_text(errors="replace") for p in logs.iterdir()}}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print("REPORT=" + json.dumps(run_inside(Path(tmp))))


# -- the test ---------------------------------------------------------------------------

@pytest.mark.slow
def test_scrapy_redis_example_project_runs_unchanged_but_for_settings(tmp_path):
    from tests import kinds_site

    sdist()   # downloaded (if need be) outside the namespace, which has no network
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{DMOZ_HOST} www.dmoz-odp.org dmoz-odp.org\n")
    script = (f"mount --bind {hosts} /etc/hosts && ip link set lo up && "
              f"exec {sys.executable} -m tests.test_scrapy_redis_example")
    out = subprocess.run(["unshare", "-n", "-m", "bash", "-c", script], cwd=ROOT,
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-5000:]
    report = json.loads(out.stdout.split("REPORT=", 1)[1])
    logs = report["logs"]
    assert report["codes"] == [0] * 5, {k: v[-2000:] for k, v in logs.items()}
    for name, text in logs.items():
        assert "Traceback" not in text and "] ERROR:" not in text, (name, text[-3000:])
        assert "'finish_reason': 'finished'" in text, (name, text[-2000:])
    # dmoz: every directory page's entries once; the site fetched once a page (its
    # start page once per node: start_urls are dont_filter).
    dmoz = sorted(i["name"] for i in report["items"]["dmoz"])
    assert dmoz == sorted(f"Site /{p} {n}".replace("//", "/") for p in
                          (q.lstrip("/") for q in kinds_site.directory_pages(""))
                          for n in range(kinds_site.ENTRIES))
    fetched = report["fetched"]
    directory = {k: n for k, n in fetched.items() if k.startswith(DMOZ_HOST)}
    assert directory.pop(f"{DMOZ_HOST} GET /") <= 2
    assert directory == {f"{DMOZ_HOST} GET {p}": 1 for p in kinds_site.directory_pages("")}
    # mycrawler_redis follows every link of the shop: every page but the seed, once.
    shop = report["shop"].rstrip("/")
    crawled = sorted(i["url"] for i in report["items"]["mycrawler_redis"])
    pages = [f"/list/{n}" for n in range(2, kinds_site.pages() + 1)] + \
        kinds_site.product_paths()
    assert crawled == sorted(shop + p for p in pages)
    assert {k: n for k, n in fetched.items() if k.startswith(SHOP_HOST + " ")} == \
        {f"{SHOP_HOST} GET {p}": 1 for p in ["/", *pages]}
    # myspider_redis: the five seeds, once each.
    seeds = report["seeds"].rstrip("/")
    assert sorted(i["url"] for i in report["items"]["myspider_redis"]) == sorted(
        f"{seeds}/product/{i}" for i in range(1, 6))
    assert {k: n for k, n in fetched.items() if k.startswith(SEED_HOST + " ")} == \
        {f"{SEED_HOST} GET /product/{i}": 1 for i in range(1, 6)}

if __name__ == "__main__":
    main()
