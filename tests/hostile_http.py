"""A hostile HTTP/1.1 server for the download-limit tests: bombs, drips, header floods.

:class:`HostileServer` listens on 127.0.0.x on a thread of its own (an asyncio
loop), so a test can reach it from an asyncio loop (curl_cffi), from the
Twisted reactor of a subprocess, or both. It records the request headers of
every request (names and values in the order received) and serves:

* ``/gzip-bomb``, ``/br-bomb``: :data:`BOMB_SIZE` zero bytes compressed with
  gzip or brotli (``Content-Encoding`` set), a few KiB on the wire;
* ``/drip``: the headers, then one byte every 0.2 s for ever (no length: the
  body ends when the connection does), counting the bytes sent;
* ``/headers``: :data:`MANY_HEADERS` distinct headers (``/headers-1500``: 1,500,
  under libcurl's own bound of 5,000); ``/huge-header``: one
  header of 1 MiB; ``/endless-headers``: header lines until the client goes;
* ``/big-html``: a 300 KB HTML page; ``/loads-bomb``: a small page whose
  script is the gzip bomb;
* anything else: ``200 ok``.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import threading

import brotli

BOMB_SIZE = 64 * 1024 * 1024
MANY_HEADERS = 10_000


@functools.lru_cache(maxsize=None)
def bomb(encoding: str) -> bytes:
    """:data:`BOMB_SIZE` zero bytes, compressed (made once per process)."""
    zeros = bytes(BOMB_SIZE)
    if encoding == "gzip":
        return gzip.compress(zeros, compresslevel=9)
    return brotli.compress(zeros, quality=5)


class HostileServer:
    """``with HostileServer() as server: server.url + "/gzip-bomb"`` (see the module)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.port = 0
        self.requests: list[tuple[str, list[tuple[str, str]]]] = []
        self.dripped = 0
        self.header_bytes_sent = 0
        self.closed = threading.Event()      # a drip's or a flood's client went away
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def headers_of(self, path: str) -> list[tuple[str, str]]:
        """The headers of the first request for *path*."""
        return next(h for p, h in self.requests if p == path)

    def __enter__(self) -> "HostileServer":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, self.host, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = [tuple(p.strip() for p in line.split(":", 1))
                           for line in lines[1:] if ":" in line]
                self.requests.append((path, headers))
                await getattr(self, "_" + path.strip("/").replace("-", "_"),
                              self._ok)(writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError,
                asyncio.CancelledError):
            pass
        finally:
            self.closed.set()
            writer.close()

    async def _ok(self, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: 2\r\n\r\nok")
        await writer.drain()

    async def _bomb(self, writer, encoding: str) -> None:
        body = bomb(encoding)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                     b"Content-Encoding: %s\r\nContent-Length: %d\r\n\r\n"
                     % (encoding.encode(), len(body)) + body)
        await writer.drain()

    async def _gzip_bomb(self, writer) -> None:
        await self._bomb(writer, "gzip")

    async def _br_bomb(self, writer) -> None:
        await self._bomb(writer, "br")

    async def _drip(self, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        while True:
            writer.write(b"x")
            await writer.drain()
            self.dripped += 1
            await asyncio.sleep(0.2)
            if writer.is_closing() or writer.transport.get_extra_info("socket") is None:
                raise ConnectionError

    async def _headers(self, writer) -> None:
        lines = b"".join(b"X-Flood-%d: %d\r\n" % (i, i) for i in range(MANY_HEADERS))
        await self._head(writer, lines)

    async def _big_html(self, writer) -> None:
        body = b"<html><body>" + b"<p>big</p>" * 30_000 + b"</body></html>"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def _loads_bomb(self, writer) -> None:
        body = b'<html><body><p>small</p><script src="/gzip-bomb"></script></body></html>'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def _headers_1500(self, writer) -> None:
        await self._head(writer, b"".join(b"X-Many-%d: %d\r\n" % (i, i) for i in range(1500)))

    async def _huge_header(self, writer) -> None:
        await self._head(writer, b"X-Huge: " + b"a" * (1024 * 1024) + b"\r\n")

    async def _endless_headers(self, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Endless: " + b"e" * 100 + b"\r\n"
        while True:
            writer.write(line * 100)
            self.header_bytes_sent += len(line) * 100
            await writer.drain()
            await asyncio.sleep(0)

    async def _head(self, writer, lines: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + lines
                     + b"Content-Length: 2\r\n\r\nok")
        await writer.drain()
