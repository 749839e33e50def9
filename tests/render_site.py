"""A small site for the rendering tests, served from a thread of the test process.

``/static/N``  the title in the markup, an image and a web font;
``/js/N``      the title (and ``navigator.userAgent`` in ``#ua``) only after a
               script ran, plus an image, a font and a script file;
``/hang/N``    like ``/js/N``, but the first request of each path is held
               until :meth:`RenderSite.release` (so a test can act while a page
               is rendering);
``/product/N`` a product page whose title (``.title``) and price (``.price``)
               a script writes 50 ms after the page's load event;
``/product/gone-N``  the same page whose script writes only "no longer
               available": no title, no price, ever;
``/img/…``, ``/font/…``, ``/media/…``, ``/app.js``  resources.

HTML is gzipped for clients that accept it. Every request is logged (:meth:`RenderSite.hits`) with its User-Agent.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>{name}</title>
<style>@font-face {{ font-family: T; src: url(/font/{key}.woff2); }}
body {{ font-family: T, sans-serif; }}</style></head>
<body><div id="app">{body}</div><img src="/img/{key}.png" alt="">
<video src="/media/{key}.mp4" preload="auto" muted></video>{script}</body></html>"""
_SCRIPT = """<script src="/app.js"></script><script>
setTimeout(function () {{
  document.getElementById("app").innerHTML =
    '<h1 class="title">{title}</h1><p id="ua"></p>';
  document.getElementById("ua").textContent = navigator.userAgent;
}}, 30);
</script>"""
_PRODUCT = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>Shop</title></head>
<body><div id="product">Loading...</div><script src="/app.js"></script><script>
window.addEventListener("load", function () {{
  setTimeout(function () {{ document.getElementById("product").innerHTML = '{html}'; }}, 50);
}});
</script></body></html>"""


class RenderSite:
    """The site on ``http://127.0.0.1:PORT/`` while used as a context manager."""

    def __init__(self, hang_timeout: float = 120.0):
        self._hits: list[tuple[str, str]] = []
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._released = threading.Event()
        self._held: Counter[str] = Counter()
        self.hang_timeout = hang_timeout
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self) -> "RenderSite":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()

    def hits(self, prefix: str = "") -> Counter:
        """Requests received per path (query string dropped), for paths under *prefix*."""
        with self._lock:
            return Counter(p.split("?")[0] for p, _ in self._hits if p.startswith(prefix))

    def agents(self, prefix: str) -> list[str]:
        with self._lock:
            return [ua for p, ua in self._hits if p.startswith(prefix)]

    def wait_for(self, predicate, timeout: float = 90.0) -> None:
        """Block until ``predicate(site)`` holds (checked on every request)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not predicate(self):
                left = deadline - time.monotonic()
                assert left > 0, f"site: condition not met in {timeout}s; hits {self._hits}"
                self._arrived.wait(left)

    def release(self) -> None:
        """Answer the held ``/hang/`` requests."""
        self._released.set()

    def _record(self, path: str, agent: str) -> bool:
        """Log a hit; True if this request is to be held."""
        with self._arrived:
            self._hits.append((path, agent))
            self._arrived.notify_all()
            bare = path.split("?")[0]
            if bare.startswith("/hang/") and not self._held[bare]:
                self._held[bare] += 1
                return True
        return False

    def _handler(self):
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hold = site._record(self.path, self.headers.get("User-Agent", ""))
                if hold:
                    site._released.wait(site.hang_timeout)
                status, ctype, body = page(self.path)
                self.send_response(status)
                if ctype.startswith("text/html") and "gzip" in self.headers.get(
                        "Accept-Encoding", ""):
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the browser that asked was killed
                    pass

        return Handler


def page(path: str) -> tuple[int, str, bytes]:
    """Status, content type and body for *path*."""
    bare = path.split("?")[0]
    kind, _, key = bare.strip("/").partition("/")
    if kind == "static" and key:
        html = _PAGE.format(name=bare, key=key, body=f'<h1 class="title">Static {key}</h1>',
                            script="")
    elif kind in ("js", "hang") and key:
        html = _PAGE.format(name=bare, key=key, body="",
                            script=_SCRIPT.format(title=f"Rendered {key}"))
    elif kind == "product" and key:
        found = f'<h1 class="title">Product {key}</h1><p class="price">{key}9.99</p>'
        html = _PRODUCT.format(html='<p class="note">No longer available</p>'
                               if key.startswith("gone-") else found)
    elif kind == "app.js":
        return 200, "application/javascript", b"window.appLoaded = true;"
    elif kind in ("img", "font", "media"):
        return 200, "application/octet-stream", b"\0" * 64
    else:
        return 404, "text/plain", b"not found"
    return 200, "text/html; charset=utf-8", html.encode()
