"""The benchmark scripts run end to end in their smallest mode
(``bash deploy/bench-smoke.sh``; not part of the test suite).

No timing is asserted (benchmarks are never judged by the test suite): only
that each script completes and writes results with the expected keys and
positive numbers.
"""

import json

import pytest

from bench import (backlog, commands, costs, crawl, dedupe, frontier_capacity, kstate, memory, polite, seeds,
                   spill, status_reads, web)

pytestmark = pytest.mark.timeout(240)


def positive(value):
    return isinstance(value, (int, float)) and value > 0


def test_crawl_smallest(tmp_path):
    data = crawl.main(["--smallest", "--out", str(tmp_path / "crawl.json")])
    assert (tmp_path / "crawl.json").exists()
    assert {"summary", "checks", "runs", "mode"} <= set(data)
    assert {"ours|1|0", "scrapy-redis|1|0", "plain|1|0"} <= set(data["summary"])
    for s in data["summary"].values():
        assert positive(s["pages_per_s"]) and positive(s["pages"]) and s["complete"]
    assert positive(data["summary"]["ours|1|0"]["redis_calls_per_page"])
    assert all("pass" in c and positive(c["ratio"]) for c in data["checks"])
    for key, runs in data["runs"].items():
        assert "held_peak" in data["summary"][key]
        for node in (n for r in runs for n in r["per_node"]):
            # rusage from the first request to the last response
            assert positive(node["user_cpu_s"]) and node["idle_waits"] >= 0, key


def test_commands_smallest(tmp_path):
    data = commands.main(["--smallest", "--out", str(tmp_path / "commands.json")])
    assert {"ours|1", "scrapy-redis|1"} <= set(data["runs"])
    for run in data["runs"].values():
        assert positive(run["calls_per_page"]) and positive(run["pages"])
    assert positive(data["runs"]["ours|1"]["script_calls"])
    assert data["checks"] and positive(data["checks"][0]["value"])


def test_memory_smallest(tmp_path):
    data = memory.main(["--smallest", "--out", str(tmp_path / "memory.json")])
    for system in ("ours", "plain"):
        assert positive(data["peak"][system]["peak_rss_mb"])
        assert positive(data["flat"][system]["rss_at"]["100%"])
    assert positive(data["checks"][0]["ratio"])


def test_dedupe_smallest(tmp_path):
    data = dedupe.main(["--smallest", "--out", str(tmp_path / "dedupe.json")])
    for key in ("ours_100", "ours_1000", "sr_bloom", "set_single", "set_pipelined"):
        assert positive(data["results"][key]["inserts_per_s"])
        assert positive(data["results"][key]["bytes_per_url"])
    # a Bloom filter may call a few new fingerprints seen (false positives)
    assert data["results"]["ours_100"]["new_reported"] >= 0.99 * data["count"]
    assert all(positive(c["ratio"]) for c in data["checks"])


def test_seeds_smallest(tmp_path):
    data = seeds.main(["--smallest", "--out", str(tmp_path / "seeds.json")])
    assert {"ours|0", "plain|0", "scrapy-redis|0"} <= set(data["summary"])
    for s in data["summary"].values():
        assert s["complete"] and positive(s["elapsed_s"])
    assert positive(data["checks"][0]["ratio"])


def test_costs_smallest(tmp_path):
    data = costs.main(["--smallest", "--out", str(tmp_path / "costs.json")])
    assert positive(data["payload"]["ours_json_bytes"])
    assert positive(data["queued"]["ours_bytes_per_queued"])
    assert all(positive(s["server_us_per_call"]) for s in data["sync"])
    assert all(positive(c["python_packer_us"]) and positive(c["hiredis_packer_us"])
               for c in data["client_cpu"]) and len(data["client_cpu"]) == 2
    assert all(r["reclaimed"] == 64 for r in data["reclaim"])


def test_polite_smallest(tmp_path):
    data = polite.main(["--smallest", "--out", str(tmp_path / "polite.json")])
    assert (tmp_path / "polite.json").exists()
    assert set(data["summary"]) == set(polite.SYSTEMS)
    for s in data["summary"].values():
        assert s["complete"] and s["duplicates"] == 0 and s["pages"] == s["expected_pages"]
        assert positive(s["peak_over_limit"]) and positive(s["time_over_ideal"])
        assert s["max_in_flight"] >= 1
    assert [c["check"] for c in data["checks"]] and all("pass" in c for c in data["checks"])


@pytest.mark.timeout(60)
def test_frontier_capacity_smallest(tmp_path):
    data = frontier_capacity.main(["--smallest", "--out", str(tmp_path / "capacity.json")])
    assert (tmp_path / "capacity.json").exists()
    assert set(data["summary"]) == {"baseline", "new_p1", "new_p12"}
    for s in data["summary"].values():
        assert positive(s["pages_per_s"]) and positive(s["redis_cpu_us_per_page"])
        assert positive(s["commands_per_page"]) and positive(s["script_calls_per_page"])
        assert 0.7 < s["duplicate_share"] < 0.9 and s["stale"] == 0
    masters = data["summary"]["new_p12"]["masters"]
    assert len(masters) == 3
    assert sorted(p for m in masters for p in m["partitions"]) == list(range(12))
    assert abs(sum(m["cpu_share"] for m in masters) - 1) < 1e-6
    # the baseline ran main's package, the others this checkout's
    assert data["runs"]["baseline"][0]["origin"] != data["runs"]["new_p1"][0]["origin"]
    assert len(data["checks"]) == 2 and all(positive(c["value"]) for c in data["checks"])


def test_recrawl_smallest(tmp_path):
    from bench import recrawl

    data = recrawl.main(["--smallest", "--out", str(tmp_path / "recrawl.json")])
    inc, full = data["summary"]["incremental"], data["summary"]["full"]
    # The second pass got 304s for every page it revisited, the full one bodies.
    assert inc["statuses"] == {"304": inc["pages"]} and inc["site_body_bytes"] == 0
    assert "200" in full["statuses"] and positive(full["site_body_bytes"])
    assert positive(inc["response_bytes"]) and positive(data["checks"][0]["ratio"])
    mixed = data["summary"]["incremental_mixed"]
    assert set(mixed["statuses"]) == {"200", "304"}


def test_recrawl_memory_smallest(tmp_path):
    from bench import recrawl_memory

    data = recrawl_memory.main(["--smallest", "--out", str(tmp_path / "memory.json")])
    assert positive(data["redis"]["bytes_per_page"])
    assert positive(data["mongo"]["bson_bytes_per_page"])
    assert positive(data["mongo"]["disk_bytes_per_page"])


def test_prefetch_smallest(tmp_path):
    from bench import prefetch

    data = prefetch.main(["--smallest", "--values", "8,16", "--out", str(tmp_path / "p.json")])
    assert set(data["summary"]) == {"plain|0", "ours8|0", "ours16|0"}
    for s in data["summary"].values():
        assert s["complete"] and positive(s["pages_per_s"]) and positive(s["vs_plain"])


def test_gcfreeze_smallest(tmp_path):
    from bench import gcfreeze

    data = gcfreeze.main(["--smallest", "--out", str(tmp_path / "gc.json")])
    assert set(data["summary"]) == {"defaults", "freeze", "tuned"}
    for s in data["summary"].values():
        assert s["complete"] and positive(s["pages_per_s"]) and positive(s["peak_rss_mb"])
    # The tuned node froze its start-up heap; the default one did not.
    assert data["summary"]["tuned"]["frozen_objects"] > 10_000
    assert data["summary"]["defaults"]["frozen_objects"] is None
    assert all(positive(s["gc_ms_per_page"]) for s in data["summary"].values())


def test_status_reads_smallest(tmp_path):
    data = status_reads.main(["--smallest", "--out", str(tmp_path / "status_reads.json")])
    looks = {(r["look"], r["system"]) for r in data["results"]}
    assert looks == {("count", "incumbent"), ("count", "ours"), ("list", "incumbent"),
                     ("list", "ours")}
    assert all(positive(r["wall_ms"]) for r in data["results"])


def test_kstate_smallest(tmp_path):
    data = kstate.main(["--smallest", "--out", str(tmp_path / "kstate.json")])
    assert (tmp_path / "kstate.json").exists()
    assert {"incumbent|2000", "ours|2000"} <= set(data["summary"])
    assert all(positive(r["sweep"]) for r in data["ratios"])
    assert data["prune"][0]["left"] == 0 and data["prune"][0]["calls"] > 1


def test_backoff_smoke(tmp_path):
    from bench import backoff

    data = backoff.main(["--smoke", "--out", str(tmp_path / "backoff.json")])
    assert (tmp_path / "backoff.json").exists()
    assert set(data["a"]["summary"]) == set(backoff.SYSTEMS_A)
    for s in data["a"]["summary"].values():
        assert s["complete"] and positive(s["faults_over_clean"]) and s["site_503"] > 0
    b = data["b"]
    assert b["in_window_raw"] >= b["in_window_adjusted"] >= 0 and positive(b["pre_rate_per_s"])
    assert b["window_offsets_s"] == sorted(b["window_offsets_s"])
    assert len(data["checks"]) == 3 and all("pass" in c for c in data["checks"])


def test_sync_cost_smoke(tmp_path):
    from bench import sync_cost

    data = sync_cost.main(["--pages", "150", "--out", str(tmp_path / "sync_cost.json")])
    assert (tmp_path / "sync_cost.json").exists()
    assert set(data["summary"]) == {"ours|0", "scrapy-redis|0"}
    ours = data["summary"]["ours|0"]
    # (Redis CPU of 150 pages may read 0: psutil counts in 10 ms ticks)
    assert positive(ours["commands_per_page"]) and "cpu_over_scrapy_redis" in ours
    assert set(ours["per_command"]) & sync_cost.SCRIPTS     # the SYNC calls themselves
    assert all(r["site_requests"] > r["pages"] for r in data["runs"]["ours|0"])  # 503s served


def test_product_smoke(tmp_path):
    from bench import product

    data = product.main(["--smoke", "--out", str(tmp_path / "product.json")])
    assert (tmp_path / "product.json").exists()
    assert set(data["summary"]) == set(product.SYSTEMS)
    for label, s in data["summary"].items():
        assert positive(s["site_pages_per_s"]) and positive(s["time_over_ideal"]), label
        assert positive(s["peak_over_limit"]) and s["robots_txt_max"] >= 1, label
        assert positive(s["process_cpu_ms_per_page"]) and s["stored_items"] > 0, label
    assert positive(data["summary"]["ours"]["redis_calls_per_page"])
    assert data["summary"]["plain"]["redis_calls_per_page"] is None
    assert [c["check"] for c in data["checks"]] and all("pass" in c for c in data["checks"])


def test_summary_write_replaces_the_marked_table(tmp_path):
    from bench import summary

    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text((summary.MARKDOWN.read_text().split(summary.START)[0] + summary.START
                         + "\nold table\n" + summary.END + "\n\n## 1. Crawl\n"))
    results = tmp_path / "results"
    results.mkdir()
    (results / "polite.json").write_text(json.dumps({
        "benchmark": "polite", "created": "2026-12-07 17:00:00",
        "checks": [{"check": "ours: crawl time ÷ ideal", "value": 1.08, "floor": "≤ 1.15",
                    "pass": True}]}))
    (results / "middlewares.json").write_text(json.dumps({  # older than the committed figures
        "benchmark": "middlewares", "created": "2026-11-01 10:00:00",
        "checks": [{"check": "stale", "value": 9.9, "floor": "≤ 1.15", "pass": False}]}))
    summary.main(["--write", "--markdown", str(markdown), "--results", str(results)])
    text = markdown.read_text()
    table = text.split(summary.START)[1].split(summary.END)[0]
    assert "old table" not in table and text.endswith("## 1. Crawl\n")
    rows = [line for line in table.strip().splitlines()[2:]]
    assert all("`python -m " in row for row in rows), rows
    polite = [row for row in rows if row.startswith("| §7")]
    assert polite == ["| §7 polite crawl | ours: crawl time ÷ ideal | 1.08 | ≤ 1.15 | PASS | "
                      "`python -m bench.polite` | 2026-12-07 17:00 |"]
    # without a newer result file, a fresh clone shows the committed figures
    committed = {e["section"] for e in summary.load_figures()}
    assert committed >= {"§1 crawl", "§9 middlewares", "§13 fault soak"}
    assert {row.split(" | ")[0][2:] for row in rows} == committed
    middlewares = [row for row in rows if row.startswith("| §9")]
    assert middlewares and "stale" not in " ".join(middlewares), middlewares
    assert "not measured" not in table


def test_summary_record_keeps_newer_results_in_the_figures_file(tmp_path):
    from bench import summary

    figures = tmp_path / "figures.json"
    figures.write_text(summary.FIGURES.read_text())
    results = tmp_path / "results"
    results.mkdir()
    (results / "web.json").write_text(json.dumps({
        "benchmark": "web", "created": "2026-12-07 09:00:00", "command": "python -m bench.web",
        "checks": [{"check": "time ÷ ideal", "value": 1.1, "floor": "≤ 1.25", "pass": True}]}))
    summary.main(["--record", "--results", str(results), "--figures", str(figures)])
    rows = summary.rows(tmp_path / "empty", figures)  # no result files: the figures file alone
    web = [row for row in rows if row[0] == "synthetic web (issue 46)"]
    assert web == [["synthetic web (issue 46)", "time ÷ ideal", 1.1, "≤ 1.25", True,
                    "`python -m bench.web`", "2026-12-07 09:00"]]
    web_rows = len(next(e for e in summary.load_figures()
                        if e["section"] == "synthetic web (issue 46)")["checks"])
    assert len(rows) == len(summary.rows(tmp_path / "empty")) - web_rows + 1


def test_web_smallest(tmp_path):
    data = web.main(["--smallest", "--addresses", "--timeout", "40",
                     "--out", str(tmp_path / "web.json")])
    assert (tmp_path / "web.json").exists()
    assert {"checks", "per_site", "fetched_ratio", "node_peak_rss_mb", "ideal_s"} <= set(data)
    assert positive(data["requests"]) and positive(data["ideal_s"])
    assert all("pass" in c for c in data["checks"])


def test_backlog_smallest(tmp_path):
    data = backlog.main(["--smallest", "--out", str(tmp_path / "backlog.json")])
    today = data["runs"]["today"]
    assert today["status"] == "ok" and data["runs"]["spill"]["status"] in ("ok", "partial")
    point = today["points"][-1]
    assert point["memory"]["queued"] >= 0.99 * data["queued"]
    for key in ("queue_bytes_per_request", "bloom_bytes", "payloads_bytes"):
        assert positive(point["memory"][key])
    assert all(positive(e["requests_per_s"]) for e in point["enqueue"])
    assert positive(point["take"]["take"]["server_us_per_call"])


def test_spill_smallest(tmp_path):
    data = spill.main(["--smallest", "--nodes", "1", "--out", str(tmp_path / "spill.json")])
    s = data["summary"][1]
    assert positive(s["redis"]["pages_per_s"]) and positive(s["spill"]["pages_per_s"])
    assert min(s["spill"]["spilled"]) > 0 and min(s["spill"]["refilled"]) > 0
    assert s["spill"]["exact"] and s["redis"]["exact"]
