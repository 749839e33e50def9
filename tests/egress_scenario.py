"""One crawl against the address guard, run *inside* a network namespace by
tests/test_egress_crawl.py (``python -m tests.egress_scenario OUT_DIR``).

The namespace has only ``lo``, with the cloud metadata addresses 169.254.169.254
and fd00:ec2::254 and a link-local 169.254.10.10 added to it, and its own
/etc/hosts (``internal.test`` → 127.0.0.1, ``meta.test`` → 169.254.169.254): a
recording server listens on each refused address, so a connection the guard let
through would show. One Redis, the sites, one ``scrapy crawl egress`` node with
this project's settings but ``DOWNLOAD_ALLOWED_NETWORKS = 127.0.0.2/32,
link-local``; what every server saw, the dead letters and the node's log are
written to ``OUT_DIR/result.json`` for the test to judge.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis as redis_lib

from devtools.services import RedisServer
from tests.crawl_helpers import Node

METADATA_V4, METADATA_V6, LINK_LOCAL = "169.254.169.254", "fd00:ec2::254", "169.254.10.10"
SITE, LOOPBACK = "127.0.0.2", "127.0.0.1"


class Server:
    """Records every request's path; answers from *routes*
    (path -> (status, headers, body)), else a small page."""

    def __init__(self, host: str, port: int = 0, routes=None):
        seen = self.seen = []
        routes = routes if routes is not None else {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                status, headers, body = routes.get(self.path, (200, {}, b""))
                body = body or f"<html><p class='t'>{self.path}</p></html>".encode()
                self.send_response(status)
                for name, value in {"Content-Type": "text/html", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("S", (ThreadingHTTPServer,), {"address_family": family,
                                                           "daemon_threads": True})
        self.server = server_class((host, port), Handler)
        self.port = self.server.server_address[1]
        self.routes = routes
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def redirect(url: str):
    return 302, {"Location": url}, b" "


def main(out: Path) -> None:
    metadata = Server(METADATA_V4, 80)
    metadata_v6 = Server(METADATA_V6, 80)
    loopback = Server(LOOPBACK)
    link_local = Server(LINK_LOCAL)
    site = Server(SITE)
    loop = f"{LOOPBACK}:{loopback.port}"
    page = (f"<html><head><script src='http://{loop}/sub.js'></script></head><body>"
            f"<img src='/hop.png'><script>fetch('http://meta.test/latest/fetch')"
            f".catch(function () {{}})</script><p class='t'>rendered</p></body></html>")
    site.routes.update({
        "/redirect": redirect(f"http://{loop}/secret"),
        "/redirect-name": redirect(f"http://internal.test:{loopback.port}/secret-name"),
        "/render/page": (200, {}, page.encode()),
        "/hop.png": redirect(f"http://{METADATA_V4}/latest/hop.png"),
        "/render/nav": redirect(f"http://{METADATA_V4}/latest/nav"),
        # Its .t and a beacon only where scripts run.
        "/ctx/b": (200, {}, b"<html><body><script>fetch('/ctx/b-js'); document.body."
                            b"insertAdjacentHTML('beforeend', '<p class=t>js</p>')"
                            b"</script></body></html>"),
    })
    ours = f"http://{SITE}:{site.port}"
    render = {"render": True, "render_wait_for": ".t"}
    planned = [
        {"url": f"http://{METADATA_V4}/latest/meta-data/"},
        {"url": f"http://[{METADATA_V6}]/latest/meta-data/"},
        {"url": "http://meta.test/latest/api/token"},
        {"url": f"http://internal.test:{loopback.port}/"},
        {"url": f"http://[::1]:{loopback.port}/"},
        {"url": f"http://[::ffff:127.0.0.1]:{loopback.port}/"},
        {"url": f"{ours}/ok"},
        {"url": f"{ours}/redirect"},
        {"url": f"{ours}/redirect-name"},
        {"url": f"http://{LINK_LOCAL}:{link_local.port}/ok"},
        {"url": f"{ours}/render/page", "meta": render},
        {"url": f"{ours}/render/nav", "meta": {"render": True}},
        # First of its site (per-site concurrency 1): before the fix it opened the
        # shared context with its options, and /ctx/b's script never ran there.
        {"url": f"{ours}/ctx/a", "priority": 10, "meta": {
            **render, "playwright_context_kwargs": {"java_script_enabled": False}}},
        {"url": f"{ours}/ctx/b", "priority": 5, "meta": render},
    ]
    with RedisServer(data_dir=out / "redis") as server:
        node = Node("egress", out, {"REDIS_URL": server.url, "PYTHONPATH": str(Path.cwd())},
                    spider="egress", settings={
                        "DOWNLOAD_ALLOWED_NETWORKS": f"{SITE}/32,link-local",
                        "SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                        "MONGO_PIPELINE_ENABLED": False, "MAX_IDLE_TIME_BEFORE_CLOSE": 2,
                        "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "RENDER_BLOCK_RESOURCES": "[]",
                        "RENDER_WAIT_TIMEOUT": 10, "RETRY_BACKOFF_BASE": 0.1,
                        # No identity: rendered requests share the "default" context.
                        "IDENTITY_ENABLED": False,
                        "LOG_LEVEL": "INFO"},
                    spider_args={"requests": json.dumps(planned)})
        try:
            node.wait(240)
        finally:
            node.stop()
        dead = [json.loads(d) for d in redis_lib.Redis.from_url(server.url).lrange(
            "{egress}:dead", 0, -1)]
    result = {"code": node.proc.returncode, "log": node.text(), "dead": dead,
              "seen": {"metadata": metadata.seen, "metadata_v6": metadata_v6.seen,
                       "loopback": loopback.seen, "link_local": link_local.seen,
                       "site": site.seen},
              "ports": {"loopback": loopback.port, "site": site.port,
                        "link_local": link_local.port}}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
