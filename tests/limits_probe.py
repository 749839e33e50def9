"""Download through Scrapy's Twisted client, as a node would, from hostile pages
(tests/hostile_http.py); used by tests/test_download_limits.py in a process of
its own (the asyncio reactor installed, a clean heap to measure).

``python -m tests.limits_probe SETTINGS_JSON`` builds the download handler and
the decompression middleware a project with these settings (over
crawlproject/settings.py) has for http, downloads each case of :data:`CASES`,
hands the response to that middleware, and prints one JSON object: per case the
outcome (status and body size, or the exception), the decompressed size at
which a bomb was refused, the heap peak (tracemalloc) during the case, the
process's peak RSS before and after all cases, and the stats and dead letters (``scheduler.mark_failed``) it left. The scheduler is a
recorder of ``mark_failed`` calls: the frontier's own is tested elsewhere."""

from __future__ import annotations

import json
import resource
import sys
import time
import tracemalloc

from scrapy.utils.reactor import install_reactor

install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

from types import SimpleNamespace  # noqa: E402

from scrapy import Request, Spider  # noqa: E402
from scrapy.settings import Settings  # noqa: E402
from scrapy.utils.defer import deferred_from_coro  # noqa: E402
from scrapy.utils.misc import build_from_crawler, load_object  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402
from twisted.internet import reactor  # noqa: E402

from tests.hostile_http import HostileServer, bomb  # noqa: E402

#: (name, path, meta)
CASES = [
    ("gzip-bomb", "/gzip-bomb", {}),
    ("br-bomb", "/br-bomb", {}),
    ("meta-maxsize", "/gzip-bomb", {"download_maxsize": 1024 * 1024}),
    ("drip", "/drip", {"download_timeout": 1}),
    ("headers", "/headers", {}),
    ("endless-headers", "/endless-headers", {}),
    ("huge-header", "/huge-header", {}),
    ("ok", "/ok", {}),
]


class DeadLetters:
    def __init__(self):
        self.records = []

    def mark_failed(self, request, reason, kind="download"):
        self.records.append([request.url, kind, reason])


def project_settings(overrides: dict) -> dict:
    settings = Settings()
    settings.setmodule("crawlproject.settings", priority="project")
    settings.setdict(overrides, priority="cmdline")
    return {name: settings[name] for name in (
        "DOWNLOAD_MAXSIZE", "DOWNLOAD_WARNSIZE", "DOWNLOAD_HANDLERS", "DOWNLOADER_MIDDLEWARES",
        "DOWNLOAD_HEADERS_MAXSIZE", "DOWNLOAD_HEADERS_MAXCOUNT") if settings.get(name)
        is not None}


def compression_middleware(settings) -> str:
    ours = {path: order for path, order in settings.getdict("DOWNLOADER_MIDDLEWARES").items()
            if order == 590}
    return next(iter(ours), "scrapy.downloadermiddlewares.httpcompression."
                            "HttpCompressionMiddleware")


async def run(server, overrides: dict) -> dict:
    crawler = get_crawler(Spider, {**project_settings(overrides),
                                   "DOWNLOAD_HANDLERS_BASE": {}})
    crawler.spider = Spider("probe")
    dead = DeadLetters()
    crawler.engine = SimpleNamespace(scheduler=dead)
    settings = crawler.settings
    handler_path = settings.getdict("DOWNLOAD_HANDLERS").get("http") or \
        "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"
    handler = build_from_crawler(load_object(handler_path), crawler)
    middleware = build_from_crawler(load_object(compression_middleware(settings)), crawler)
    results = {"handler": handler_path, "middleware": type(middleware).__name__}
    # the project's retry middleware (it hears the handler's headers_received)
    from crawlproject.middlewares.retry import BackoffRetryMiddleware
    retry = build_from_crawler(BackoffRetryMiddleware, crawler)
    try:
        for name, path, meta in CASES:
            request = Request(server.url + path, meta={"download_timeout": 5, **meta})
            middleware.process_request(request)
            tracemalloc.start()
            outcome: dict = {}
            try:
                response = await handler.download_request(request)
                outcome = {"status": response.status, "wire": len(response.body)}
                response = middleware.process_response(request, response)
                outcome["body"] = len(response.body)
            except Exception as exc:
                cause = exc.__cause__
                outcome.update(error=type(exc).__name__, message=str(exc)[:300],
                               decompressed=getattr(cause, "decompressed_size", None))
                if name == "drip":
                    outcome["retried"] = retry.process_exception(request, exc) is not None
            outcome["peak"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            results[name] = outcome
    finally:
        await handler.close()
    results["stats"] = {k: v for k, v in crawler.stats.get_stats().items()
                        if k.startswith(("limits/", "retry/"))}
    results["dead"] = dead.records
    results["dripped"] = server.dripped
    results["header_bytes_sent"] = server.header_bytes_sent
    return results


async def render(server, overrides: dict) -> dict:
    """The rendering handler (the system Chromium): a rendered page over its
    ``download_maxsize``, one under it, and a header flood on its Scrapy path."""
    from crawlproject.rendering.addon import RenderingAddon, RenderingDownloadHandler

    settings = Settings()
    settings.setmodule("crawlproject.settings", priority="project")
    settings.setdict({"RENDER_BLOCK_RESOURCES": [], **overrides}, priority="cmdline")
    RenderingAddon().update_settings(settings)
    crawler = get_crawler(Spider, {k: settings[k] for k in settings if k.startswith(
        ("PLAYWRIGHT_", "DOWNLOAD_", "RENDER_"))})
    crawler.spider = Spider("probe")
    handler = RenderingDownloadHandler.from_crawler(crawler)
    results: dict = {"handler": type(handler).__name__}
    try:
        for name, path, meta in (("big", "/big-html", {"download_maxsize": 100_000}),
                                 ("small", "/big-html", {}),
                                 ("bomb", "/gzip-bomb", {}),
                                 ("loads-bomb", "/loads-bomb", {}),
                                 ("headers", "/headers", {"playwright": False})):
            request = Request(server.url + path, meta={"playwright": True, **meta})
            tracemalloc.start()
            start = time.monotonic()
            try:
                response = await handler.download_request(request)
                results[name] = {"status": response.status, "body": len(response.body)}
            except Exception as exc:
                results[name] = {"error": type(exc).__name__, "message": str(exc)[:300]}
            results[name]["peak"] = tracemalloc.get_traced_memory()[1]
            results[name]["seconds"] = round(time.monotonic() - start, 2)
            tracemalloc.stop()
    finally:
        await handler.close()
    results["stats"] = {k: v for k, v in crawler.stats.get_stats().items()
                        if k.startswith(("limits/", "retry/"))}
    return results


def main() -> None:
    args = sys.argv[1:]
    job = run
    if args[:1] == ["--render"]:
        job, args = render, args[1:]
    overrides = json.loads(args[0]) if args else {}
    bomb("gzip"), bomb("br")
    out = {"maxrss_before": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with HostileServer() as server:
        d = deferred_from_coro(job(server, overrides))
        d.addCallbacks(out.update, lambda f: out.update(failure=f.getTraceback()))
        d.addBoth(lambda _: reactor.stop())
        reactor.run()
    out["maxrss_after"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main()
