"""Where requests may go, through a real node: one ``scrapy crawl`` (Scrapy's
downloader with its default resolver, the redirect and retry middlewares,
Chromium) aimed at cloud metadata addresses, loopback and a link-local network,
inside a network namespace (``unshare -n -m``: only ``lo``, nothing leaves the
machine) whose ``lo`` holds 169.254.169.254, fd00:ec2::254 and 169.254.10.10
and whose /etc/hosts maps ``internal.test`` to 127.0.0.1 and ``meta.test`` to
169.254.169.254. The scenario is tests/egress_scenario.py; the node allows
``127.0.0.2/32`` and ``link-local`` only. Needs root (namespaces), as the suite's
machines have.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.crawl_helpers import ROOT
from tests.egress_scenario import LINK_LOCAL, METADATA_V4, METADATA_V6

pytestmark = pytest.mark.slow

HOSTS = """127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
127.0.0.1 internal.test
169.254.169.254 meta.test
"""


def in_namespace(tmp_path) -> dict:
    """Run the scenario in a fresh network and mount namespace; its result."""
    if shutil.which("unshare") is None or shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root, unshare(1) and ip(8): network namespaces")
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    script = (f"ip link set lo up && ip addr add {METADATA_V4}/32 dev lo && "
              f"ip addr add {LINK_LOCAL}/32 dev lo && "
              f"ip addr add {METADATA_V6}/128 dev lo nodad && "
              f"mount --bind {hosts} /etc/hosts && exec \"$@\"")
    done = subprocess.run(["unshare", "-n", "-m", "bash", "-c", script, "netns", sys.executable,
                           "-m", "tests.egress_scenario", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


def stat(log: str, name: str) -> int:
    match = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(match.group(1)) if match else 0


def test_refused_addresses_are_never_connected_to_and_are_dead_lettered_with_the_reason(
        tmp_path):
    result = in_namespace(tmp_path)
    log, seen = result["log"], result["seen"]
    loop, site = result["ports"]["loopback"], result["ports"]["site"]
    assert result["code"] == 0 and "'finish_reason': 'finished'" in log, log[-4000:]
    # No server on a refused address saw anything: not the metadata endpoints, not
    # loopback (reached by name, by literal, by redirect or by the browser).
    assert (seen["metadata"], seen["metadata_v6"], seen["loopback"]) == ([], [], []), seen
    # What the policy lists was crawled: 127.0.0.2/32 and the link-local group.
    assert seen["link_local"] == ["/ok"]
    assert {"/ok", "/redirect", "/redirect-name", "/render/page", "/ctx/a", "/ctx/b",
            "/ctx/b-js"} <= set(seen["site"]), seen["site"]
    # Every refused request dead-lettered once (never retried), with its reason.
    dead = {d["url"]: d for d in result["dead"]}
    expected = {
        f"http://{METADATA_V4}/latest/meta-data/": f"{METADATA_V4} is metadata",
        f"http://[{METADATA_V6}]/latest/meta-data/": f"{METADATA_V6} is metadata",
        "http://meta.test/latest/api/token": f"meta.test ({METADATA_V4}) is metadata",
        f"http://internal.test:{loop}/": "internal.test (127.0.0.1) is loopback",
        f"http://[::1]:{loop}/": "::1 is loopback",
        f"http://[::ffff:127.0.0.1]:{loop}/": "::ffff:127.0.0.1 is ipv4-mapped",
        f"http://127.0.0.1:{loop}/secret": "127.0.0.1 is loopback",             # a redirect
        f"http://internal.test:{loop}/secret-name": "internal.test (127.0.0.1) is loopback",
        f"http://127.0.0.2:{site}/render/nav": f"{METADATA_V4} is metadata",   # browser redirect
    }
    assert set(dead) == set(expected), sorted(dead)
    for url, why in expected.items():
        assert dead[url]["reason"].startswith(f"address_refused: {why}"), dead[url]
        assert dead[url]["reason"].endswith("(DOWNLOAD_ALLOWED_NETWORKS)")
        assert (dead[url]["kind"], dead[url]["attempts"]) == ("download", 1), dead[url]
    assert stat(log, "retry/count") == 0
    assert stat(log, "egress/refused") == len(expected)
    assert (stat(log, "egress/refused/metadata"), stat(log, "egress/refused/loopback"),
            stat(log, "egress/refused/ipv4-mapped")) == (4, 4, 1)
    # The rendered page's resources on refused hosts were never fetched, the
    # page itself was: a script on 127.0.0.1, a fetch of meta.test, an image
    # redirected to the metadata address (a hop Playwright's routing never sees).
    assert stat(log, "egress/browser_refused") == 4       # 3 resources + /render/nav's hop
    assert stat(log, "item_scraped_count") == 5           # ok, link-local ok, page, ctx a, b
    # One WARNING per refused host, then counted only.
    warnings = [line for line in log.splitlines()
                if "[crawlproject.egress" in line and "] WARNING:" in line]
    hosts = [METADATA_V4, METADATA_V6, "meta.test", "internal.test", "::1", "::ffff:127.0.0.1",
             "127.0.0.1"]
    for host in hosts:
        assert len([w for w in warnings if re.search(
            rf"address_refused: {re.escape(host)}[ (]", w)]) == 1, (host, warnings)
    assert len(warnings) == len(hosts), warnings
