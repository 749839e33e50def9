"""Benchmark: backoff in proportion (issue 38) — transient 503s and a site that turns to 503.

Nodes run the README's settings block, whole (:mod:`bench.readme_settings`: the
block ``bench.soak`` pastes into its user project, MongoDB pipeline included,
on a local SecantusDB), spider ``bench_hosts_readme`` (:mod:`bench.spiders`),
against the multi-host site (:mod:`devtools.demo.hosts`, 0 ms latency).

**(a) transient 503s.** One node crawls one site of 5,000 pages (``--quick``
2,000) twice: once on a host that answers 503 without ``Retry-After`` the first
time each 50th page is asked for (``--fail-every 50``: 2 % of the pages, each
succeeds on retry), once on a host without faults, in the same run (crawls
interleaved, fault/no-fault order alternating per repetition). The block's
per-site limits (``DOWNLOAD_DELAY = 1``, 2 in flight) would hold one site to
1 page/s, where no backoff can show: the crawl runs at the throughput
benchmark's limits instead (``DOWNLOAD_DELAY = 0``, ``CONCURRENT_REQUESTS`` and
``CONCURRENT_REQUESTS_PER_DOMAIN`` 64), on every system. Reported: pages/s (200
answers at the site ÷ node time from first request to last response) with the
faults ÷ without them; the same two crawls for scrapy-redis (``bench_hosts_
scrapy_redis``, 1 node) and for our scheduler alone (``bench_hosts_ours`` on
``bench.settings``: no README extras) for reference. Floor (README block):
≥ 0.9.

**(b) a site that turns to 503 for 20 s.** One README-block node crawls one
site paced at ``DOWNLOAD_DELAY = 0.05`` (20 requests/s; the block's 2 in
flight) with ``FRONTIER_BACKOFF_MAX = 2``. Once the crawl is steady the site
answers 503 without ``Retry-After`` to every request for 20 s
(``MultiHostSite.throttle(host, status=503, retry_after=None, seconds=20)``).
From the site's own record:

* the requests that *started* at the site during the window, raw, and adjusted
  by setting aside the site's concurrency (2: requests already leased when the
  site turned may still start), each ÷ (20 s / ``FRONTIER_BACKOFF_MAX``) = 10:
  floor ≤ 1.1 on the adjusted count;
* recovery: from the window's end to the end of the first 1 s window (sliding
  by 50 ms, after the end) holding ≥ 90 % of the requests of an average second
  of the 5 s before the window. Floor ≤ 10 s;
* pages never fetched (given up after their retries during the window).

    python -m bench.backoff [--quick | --smoke] [--repeat N] [--only a,b]

Writes ``bench/results/backoff.json`` (``--quick``/``--smoke``: under
``bench/results/quick/`` or ``smallest/``). The machine is shared: every run
records the CPU other programs used meanwhile (``external_cores``).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pymongo

from bench.common import (BenchRedis, base_parser, median, mode_of, ratio, run_nodes,
                          strip_series, table, finish)
from crawlproject.keys import start_urls_key
from devtools.demo.hosts import MultiHostSite
from devtools.services import MongoServer

NAME = "backoff"
FAULTY, CLEAN, TURNS = "127.0.0.41", "127.0.0.42", "127.0.0.43"
FAIL_EVERY = 50
DATABASE = "bench_backoff"
README_MODULE = "bench.readme_settings"
# mode -> pages of the (a) sites
PAGES_A = {"full": 5000, "quick": 2000, "smallest": 200}
THROUGHPUT = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": 64}
# label -> (system for run_nodes, spider, settings module)
SYSTEMS_A = {
    "readme": ("ours", "bench_hosts_readme", README_MODULE),
    "ours": ("ours", "bench_hosts_ours", "bench.settings"),
    "scrapy-redis": ("scrapy-redis", "bench_hosts_scrapy_redis", "bench.settings"),
}
LABELS = {"readme": "README block (whole)", "ours": "our scheduler alone",
          "scrapy-redis": "scrapy-redis 0.9.1"}
FLOOR_A = 0.9
# (b): mode -> (pages, steady seconds before the window, window seconds)
SIZES_B = {"full": (1000, 10.0, 20.0), "quick": (800, 8.0, 20.0), "smallest": (150, 3.0, 3.0)}
DELAY_B = 0.05
CONCURRENCY_B = 2
BACKOFF_MAX = 2.0
PRE_S = 5.0
RECOVERED = 0.9
FLOOR_WINDOW = 1.1
FLOOR_RECOVERY_S = 10.0


# -- (a) --------------------------------------------------------------------------
def crawl_once(redis: BenchRedis, site: MultiHostSite, mongo_uri: str, label: str, host: str,
               extra: dict | None = None, during=None) -> dict:
    """One node crawls *host* from its home page; figures from the node and the site.
    *during(site)*, if given, runs in this thread while the node crawls."""
    system, spider, module = SYSTEMS_A.get(label, SYSTEMS_A["readme"])
    redis.reset()
    site.reset()
    with pymongo.MongoClient(mongo_uri) as client:
        client.drop_database(DATABASE)
    settings = {**THROUGHPUT, **(extra or {})}
    if module == README_MODULE:
        settings.update(MONGO_URI=mongo_uri, MONGO_DATABASE=DATABASE)
    redis.client.lpush(start_urls_key(spider), site.urls[host])
    result: dict = {}

    def crawl():
        try:
            result["run"] = run_nodes(system, 1, redis_url=redis.url, settings=settings,
                                      spider=spider, settings_module=module,
                                      timeout=120 + site.pages[host] / 5,
                                      watch_pids=(redis.server.pid, site._proc.pid))
        except BaseException as exc:  # reported below, in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=crawl)
    thread.start()
    try:
        if during is not None:
            result["during"] = during(site)
    finally:
        thread.join()
    if "error" in result:
        raise result["error"]
    run = strip_series(result["run"])
    hits = site.requests(host)
    ok = {h.path for h in hits if h.status == 200}
    expected = site.expected_paths(host)
    run.update({
        "host": host, "site_requests": len(hits),
        "site_ok": sum(1 for h in hits if h.status == 200),
        "site_503": sum(1 for h in hits if h.status == 503),
        "missing": len(expected - ok), "complete": expected <= ok,
        "ok_pages_per_s": (sum(1 for h in hits if h.status == 200 and h.path != "/robots.txt")
                           / run["elapsed_s"] if run["elapsed_s"] else None),
        "during": result.get("during"),
    })
    return run


def part_a(redis, site, mongo_uri, repeat: int, labels: list[str]) -> dict:
    runs: dict[str, list] = {}
    for rep in range(repeat):
        for label in labels:
            order = [True, False] if rep % 2 == 0 else [False, True]
            for faults in order:
                run = crawl_once(redis, site, mongo_uri, label, FAULTY if faults else CLEAN)
                key = f"{label}|{'faults' if faults else 'clean'}"
                runs.setdefault(key, []).append(run)
                print(f"  (a) rep {rep + 1} {LABELS[label]}, {'2 % 503s' if faults else 'no faults'}:"
                      f" {run['site_ok']} pages in {run['elapsed_s'] or 0:.1f}s = "
                      f"{run['ok_pages_per_s'] or 0:.0f}/s, 503s {run['site_503']}, missing "
                      f"{run['missing']}, CPU {run['cpu_ms_per_page'] or 0:.2f} ms/page, other "
                      f"programs {run['external_cores'] or 0:.2f} cores", flush=True)
    summary = {}
    for label in labels:
        clean, faulty = runs[f"{label}|clean"], runs[f"{label}|faults"]
        rate_clean = median([r["ok_pages_per_s"] for r in clean])
        rate_faulty = median([r["ok_pages_per_s"] for r in faulty])
        summary[label] = {
            "pages_per_s_clean": rate_clean, "pages_per_s_faults": rate_faulty,
            "faults_over_clean": ratio(rate_faulty, rate_clean),
            "elapsed_clean_s": median([r["elapsed_s"] for r in clean]),
            "elapsed_faults_s": median([r["elapsed_s"] for r in faulty]),
            "cpu_ms_per_page_clean": median([r["cpu_ms_per_page"] for r in clean]),
            "cpu_ms_per_page_faults": median([r["cpu_ms_per_page"] for r in faulty]),
            "site_503": max(r["site_503"] for r in faulty),
            "complete": all(r["complete"] for r in clean + faulty),
            "external_cores": max(r["external_cores"] or 0 for r in clean + faulty),
        }
    return {"runs": runs, "summary": summary}


# -- (b) --------------------------------------------------------------------------
def turn(window_s: float, steady_s: float):
    """What the harness does while the (b) crawl runs: wait for a steady crawl,
    then make the site answer 503 to everything for *window_s* seconds."""
    def during(site: MultiHostSite) -> dict:
        deadline = time.monotonic() + 120
        first = site.wait_for_requests(1, TURNS, timeout=120)[0].t
        while site.now() < first + steady_s + 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the (b) crawl did not get going")
            time.sleep(0.1)
        armed = site.throttle(TURNS, status=503, retry_after=None, seconds=window_s)
        return {"armed": armed, "first_request": first}
    return during


def window_figures(site: MultiHostSite, armed: float, window_s: float, pre_s: float) -> dict:
    """Requests in the window, pre-window rate (over *pre_s* seconds) and
    recovery, from the site's record."""
    times = sorted(h.t for h in site.requests(TURNS))
    end = armed + window_s
    pre_rate = sum(1 for t in times if armed - pre_s <= t < armed) / pre_s
    inside = [t - armed for t in times if armed <= t < end]
    at_max = window_s / BACKOFF_MAX
    adjusted = max(0, len(inside) - CONCURRENCY_B)
    recovery = None
    step, probe = 0.05, end + 1.0
    last = times[-1] if times else end
    while probe <= last + step:
        # requests in [probe - 1, probe), never before the window's end
        count = sum(1 for t in times if max(end, probe - 1.0) <= t < probe)
        if count >= RECOVERED * pre_rate * 1.0:
            recovery = round(probe - end, 2)
            break
        probe += step
    return {"window_s": window_s, "pre_rate_per_s": pre_rate,
            "in_window_raw": len(inside), "in_window_adjusted": adjusted,
            "set_aside": len(inside) - adjusted, "at_backoff_max": at_max,
            "raw_over_max_pacing": len(inside) / at_max,
            "adjusted_over_max_pacing": adjusted / at_max,
            "window_offsets_s": [round(t, 3) for t in inside],
            "recovery_s": recovery,
            "after_window_requests": sum(1 for t in times if t >= end)}


def part_b(redis, site, mongo_uri, mode: str) -> dict:
    _, steady_s, window_s = SIZES_B[mode]
    extra = {"DOWNLOAD_DELAY": DELAY_B, "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY_B,
             "FRONTIER_BACKOFF_MAX": BACKOFF_MAX}
    run = crawl_once(redis, site, mongo_uri, "readme", TURNS, extra, turn(window_s, steady_s))
    run.update(window_figures(site, run["during"]["armed"], window_s, min(PRE_S, steady_s)))
    print(f"  (b) {run['in_window_raw']} requests started in the {window_s:g}s window "
          f"({run['in_window_adjusted']} once {run['set_aside']} leased are set aside; "
          f"{run['at_backoff_max']:g} at FRONTIER_BACKOFF_MAX pacing), pre-window "
          f"{run['pre_rate_per_s']:.1f}/s, back to 90 % in "
          f"{run['recovery_s'] if run['recovery_s'] is not None else 'never'} s, "
          f"missing pages {run['missing']}", flush=True)
    return run


def checks_for(a: dict | None, b: dict | None) -> list[dict]:
    out = []
    if a and "readme" in a["summary"]:
        value = a["summary"]["readme"]["faults_over_clean"]
        out.append({"check": "(a) README block: pages/s with 2 % transient 503s ÷ without",
                    "value": value, "floor": f"≥ {FLOOR_A}",
                    "pass": value is not None and value >= FLOOR_A})
    if b:
        out.append({"check": "(b) requests started in the 503 window ÷ at FRONTIER_BACKOFF_MAX "
                             f"pacing (adjusted; raw {b['raw_over_max_pacing']:.2f})",
                    "value": b["adjusted_over_max_pacing"], "floor": f"≤ {FLOOR_WINDOW}",
                    "pass": b["adjusted_over_max_pacing"] <= FLOOR_WINDOW})
        out.append({"check": "(b) window end → back at ≥ 90 % of the pre-window rate (s)",
                    "value": b["recovery_s"], "floor": f"≤ {FLOOR_RECOVERY_S}",
                    "pass": b["recovery_s"] is not None and b["recovery_s"] <= FLOOR_RECOVERY_S})
    return out


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (same as --smallest)")
    parser.add_argument("--only", default="a,b", help="parts to run: a, b or a,b")
    args = parser.parse_args(argv)
    args.smallest = args.smallest or args.smoke
    mode = mode_of(args)
    parts = set(args.only.split(","))
    repeat = args.repeat or 1
    pages_a, (pages_b, _, _) = PAGES_A[mode], SIZES_B[mode]
    t0 = time.monotonic()
    storage = Path(tempfile.mkdtemp(prefix="bench-backoff-mongo-"))
    mongo = MongoServer(storage_path=storage)
    mongo.start()
    a = b = None
    try:
        with BenchRedis() as redis, MultiHostSite(
                [FAULTY, CLEAN, TURNS], pages={FAULTY: pages_a, CLEAN: pages_a, TURNS: pages_b},
                fail_every={FAULTY: FAIL_EVERY}) as site:
            if "a" in parts:
                a = part_a(redis, site, mongo.uri, repeat, list(SYSTEMS_A))
            if "b" in parts:
                b = part_b(redis, site, mongo.uri, mode)
    finally:
        mongo.stop()
        shutil.rmtree(storage, ignore_errors=True)
    data = {"mode": mode, "repeat": repeat, "pages_a": pages_a, "fail_every": FAIL_EVERY,
            "throughput_settings_a": THROUGHPUT,
            "b_settings": {"DOWNLOAD_DELAY": DELAY_B, "CONCURRENT_REQUESTS_PER_DOMAIN":
                           CONCURRENCY_B, "FRONTIER_BACKOFF_MAX": BACKOFF_MAX, "pages": pages_b},
            "a": a, "b": b, "checks": checks_for(a, b), "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    out = []
    if data["a"]:
        rows = [[LABELS[label], s["pages_per_s_clean"], s["pages_per_s_faults"],
                 s["faults_over_clean"], s["elapsed_clean_s"], s["elapsed_faults_s"],
                 s["cpu_ms_per_page_clean"], s["cpu_ms_per_page_faults"], s["site_503"],
                 s["complete"], round(s["external_cores"], 2)]
                for label, s in data["a"]["summary"].items()]
        out.append(table(["system (1 node)", "pages/s, no faults", "pages/s, 2 % 503s",
                          "faults ÷ none", "time s", "time s (faults)", "CPU ms/page",
                          "CPU ms/page (faults)", "503s served", "complete",
                          "other programs (cores)"], rows))
    if data["b"]:
        b = data["b"]
        out.append(table(["(b) 503 window", "value"], [
            ["window s", b["window_s"]], ["pre-window requests/s", b["pre_rate_per_s"]],
            ["requests started in the window (raw)", b["in_window_raw"]],
            ["… with the site's concurrency set aside", b["in_window_adjusted"]],
            ["at FRONTIER_BACKOFF_MAX pacing", b["at_backoff_max"]],
            ["raw ÷ max pacing", b["raw_over_max_pacing"]],
            ["adjusted ÷ max pacing", b["adjusted_over_max_pacing"]],
            ["recovery to 90 % (s)", b["recovery_s"]],
            ["pages never fetched", b["missing"]],
            ["other programs (cores)", b["external_cores"]]]))
    out.append(table(["floor check", "value", "floor", "result"],
                     [[c["check"], c["value"], c["floor"], c["pass"]] for c in data["checks"]]))
    return "\n\n".join(out)


if __name__ == "__main__":
    main()
