"""Bodies, bombs, drips and headers bounded in every download handler (issue 46).

Hostile pages come from tests/hostile_http.py, a real HTTP server on 127.0.0.1.
Scrapy's own client (Twisted) and the rendering handler (the system Chromium)
run in a process of their own (tests/limits_probe.py: the asyncio reactor, a
heap measured with tracemalloc) with the project's settings; the impersonating
handler (curl_cffi) runs here on an asyncio loop. Bombs are 64 MiB of zeros (a
few KiB on the wire): with Scrapy's 1 GiB limit they decompress whole. The one
stand-in: the probe's scheduler only records ``mark_failed`` calls (the
frontier's dead letters are tested with a real Redis elsewhere)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tracemalloc

import pytest
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from crawlproject.identity.session import IDENTITY
from crawlproject.limits.compression import LimitedHttpCompressionMiddleware
from crawlproject.limits.headers import HeaderLimits, HeaderLimitsMixin, ResponseHeadersTooLarge
from tests.crawl_helpers import ROOT, readme_settings
from tests.hostile_http import BOMB_SIZE, HostileServer, bomb

MiB = 1024 * 1024
CHUNK = 64 * 1024            # Scrapy decompresses in steps of this size


def project_settings() -> Settings:
    settings = Settings()
    settings.setmodule("crawlproject.settings", priority="project")
    return settings


def test_the_project_and_the_readme_block_limit_bodies_in_mib_and_bound_headers():
    # the README block as a crawl gets it: its add-ons applied
    for values in (project_settings(), readme_settings()):
        assert 1 * MiB <= values["DOWNLOAD_MAXSIZE"] <= 16 * MiB
        assert 0 < values["DOWNLOAD_WARNSIZE"] < values["DOWNLOAD_MAXSIZE"]
        middlewares = dict(values["DOWNLOADER_MIDDLEWARES"])
        assert middlewares["crawlproject.limits.compression.LimitedHttpCompressionMiddleware"] \
            == 590
        assert middlewares["scrapy.downloadermiddlewares.httpcompression."
                           "HttpCompressionMiddleware"] is None
        handlers = {load_object(h) for h in dict(values["DOWNLOAD_HANDLERS"]).values()}
        # Scrapy's HTTP/1.1 client with the header bounds, or the rendering add-on's
        # handler, which has the same bounds (and sends unrendered requests through it)
        assert handlers and all(issubclass(h, HeaderLimitsMixin) for h in handlers), handlers
    with pytest.raises(ValueError, match="DOWNLOAD_HEADERS_MAXSIZE"):
        HeaderLimits.from_settings(Settings({"DOWNLOAD_HEADERS_MAXSIZE": -1}))


@pytest.fixture(scope="module")
def scrapys_client():
    """What Scrapy's client did with each hostile page (tests/limits_probe.py)."""
    done = subprocess.run([sys.executable, "-m", "tests.limits_probe"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert "failure" not in results, results["failure"]
    return results


def test_bombs_through_scrapys_client_stop_at_the_limit_and_are_dead_lettered(scrapys_client):
    limit = project_settings().getint("DOWNLOAD_MAXSIZE")
    r = scrapys_client
    assert r["handler"] == "crawlproject.limits.headers.BoundedHTTP11DownloadHandler"
    for bomb in ("gzip-bomb", "br-bomb"):
        outcome = r[bomb]
        assert outcome["wire"] < 100_000                      # a few KiB were sent ...
        assert outcome["error"] == "IgnoreRequest"            # ... refused, not decoded whole
        assert limit < outcome["decompressed"] <= limit + CHUNK
        assert outcome["peak"] < 2 * limit + MiB < BOMB_SIZE  # the heap never held the bomb
    # a request's own download_maxsize (as robots.txt has) holds on the decompressed size
    assert r["meta-maxsize"]["error"] == "IgnoreRequest"
    assert r["meta-maxsize"]["decompressed"] <= MiB + CHUNK
    assert r["stats"]["limits/decompressed_too_large"] == 3
    assert [reason.split(":")[0] for _, kind, reason in r["dead"]
            if "/drip" not in _] == ["decompressed_too_large"] * 3
    assert r["ok"] == {"status": 200, "wire": 2, "body": 2, "peak": r["ok"]["peak"]}


def test_a_drip_ends_at_the_download_deadline_and_header_floods_are_refused(scrapys_client):
    r = scrapys_client
    # DOWNLOAD_TIMEOUT is a deadline for the whole download, not an idle timeout:
    # a byte every 0.2 s does not keep it alive
    assert r["drip"]["error"] == "DownloadTimeoutError" and r["dripped"] >= 1
    # the server answered and dripped: not retried (as long again, for the same
    # end), dead-lettered with the reason
    assert r["drip"]["retried"] is False and r["stats"]["retry/dripping"] == 1
    assert [kind for url, kind, reason in r["dead"] if url.endswith("/drip")] == ["download"]
    for flood in ("headers", "endless-headers", "huge-header"):
        assert r[flood]["error"] == "ResponseHeadersTooLarge", r[flood]
        assert r[flood]["peak"] < 8 * MiB
    assert "1000 response headers" in r["headers"]["message"]
    assert r["stats"]["limits/headers_too_large"] == 3


# ------------------------------------------------------------ the impersonating handler

curl_cffi = pytest.importorskip("curl_cffi")

from crawlproject.impersonate import HANDLER, errors  # noqa: E402
from crawlproject.impersonate.handler import ImpersonateDownloadHandler  # noqa: E402


def impersonated(url: str, **meta) -> Request:
    request = Request(url, meta={IDENTITY: {"profile": "chrome131"}, "download_timeout": 10,
                                 **meta})
    return request


def run_impersonated(coro_fn, **settings):
    async def main():
        values = {key: project_settings()[key] for key in
                  ("DOWNLOAD_MAXSIZE", "DOWNLOAD_WARNSIZE")}
        crawler = get_crawler(Spider, {**values, "IMPERSONATE_ENABLED": True,
                                       "DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER},
                                       **settings})
        handler = ImpersonateDownloadHandler(crawler)
        compression = LimitedHttpCompressionMiddleware.from_crawler(crawler)
        try:
            return await coro_fn(handler, compression, crawler)
        finally:
            await handler.close()

    return asyncio.run(main())


def test_bombs_through_the_impersonating_handler_are_decoded_by_scrapy_within_the_limit():
    limit = project_settings().getint("DOWNLOAD_MAXSIZE")

    async def fetch(handler, compression, crawler):
        out = {}
        for name, path, meta in (("gzip", "/gzip-bomb", {}), ("br", "/br-bomb", {}),
                                 ("meta", "/br-bomb", {"download_maxsize": MiB})):
            request = impersonated(server.url + path, **meta)
            compression.process_request(request)          # Accept-Encoding: gzip, ..., br
            tracemalloc.start()
            response = await handler.download_request(request)
            with pytest.raises(IgnoreRequest) as refused:
                compression.process_response(request, response)
            out[name] = (response, refused.value.__cause__.decompressed_size,
                         tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        return out, crawler.stats.get_stats()

    bomb("gzip"), bomb("br")      # made before the heap is measured (the server is here)
    with HostileServer() as server:
        out, stats = run_impersonated(fetch)
        assert all(dict(h)["Accept-Encoding"].endswith("br, zstd") for _, h in server.requests)
    for name in ("gzip", "br"):
        response, decompressed, peak = out[name]
        # libcurl did not decode (it would, without a limit): the body is as sent
        assert response.headers[b"Content-Encoding"] and len(response.body) < 100_000
        assert limit < decompressed <= limit + CHUNK
        assert peak < 2 * limit + MiB < BOMB_SIZE
    assert out["meta"][1] <= MiB + CHUNK
    assert stats["limits/decompressed_too_large"] == 3


def test_the_impersonating_handler_ends_drips_refuses_header_floods_and_sends_no_h2c():
    async def fetch(handler, compression, crawler):
        out = {}
        await handler.download_request(impersonated(server.url + "/plain"))
        with pytest.raises(errors.DownloadTimeout):
            await handler.download_request(impersonated(server.url + "/drip",
                                                        download_timeout=1))
        for path in ("/headers", "/headers-1500", "/huge-header", "/endless-headers"):
            with pytest.raises(errors.HeadersTooLarge) as refused:
                await handler.download_request(impersonated(server.url + path))
            out[path] = str(refused.value)
        return out, crawler.stats.get_stats()

    with HostileServer() as server:
        out, stats = run_impersonated(fetch)
        sent = dict((name.lower(), value) for name, value in server.headers_of("/plain"))
        assert server.dripped >= 1
    # plain http as Chrome sends it: HTTP/1.1, no h2c upgrade
    assert "upgrade" not in sent and "http2-settings" not in sent
    assert "upgrade" not in sent.get("connection", "").lower()
    assert "DOWNLOAD_HEADERS_MAXCOUNT" in out["/headers-1500"]     # ours, under libcurl's
    assert stats["impersonate/errors/headers_too_large"] == 4
    assert stats["limits/headers_too_large"] == 4
    # refused for good: not retried (the site would send the same), dead-lettered
    retry = RetryMiddleware.from_crawler(get_crawler(Spider))
    for exc in (errors.HeadersTooLarge("x"), ResponseHeadersTooLarge("x")):
        assert not isinstance(exc, retry.exceptions_to_retry)


# ------------------------------------------------------------ the rendering handler

def test_the_rendering_handler_stops_pages_over_their_limits_while_they_load():
    from crawlproject.rendering.addon import chromium_path

    if chromium_path() is None:
        pytest.skip("no Chromium here")
    done = subprocess.run([sys.executable, "-m", "tests.limits_probe", "--render",
                           json.dumps({"RENDER_MAXSIZE": 24 * MiB})], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout)
    assert "failure" not in r, r["failure"]
    # the document against meta download_maxsize, counted by the browser as it arrives
    assert r["big"]["error"] == "RenderedPageTooLarge"
    assert r["small"]["status"] == 200 and r["small"]["body"] > 100_000
    # a bomb as the page (DOWNLOAD_MAXSIZE) or as its script (RENDER_MAXSIZE) is stopped
    # in the browser: the node never gets its 64 MiB
    assert "DOWNLOAD_MAXSIZE" in r["bomb"]["message"]
    assert "RENDER_MAXSIZE" in r["loads-bomb"]["message"]
    for name in ("bomb", "loads-bomb"):
        assert r[name]["error"] == "RenderedPageTooLarge" and r[name]["peak"] < 8 * MiB
    # what it does not render is Scrapy's download, with the header bounds
    assert r["headers"]["error"] == "ResponseHeadersTooLarge"
    assert r["stats"] == {"limits/rendered_too_large": 3, "limits/headers_too_large": 1}
