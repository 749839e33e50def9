"""A tiny HTTP forward proxy for tests and benchmarks: real sockets on
127.0.0.1, served by an asyncio loop in a thread.

:class:`ForwardProxy` relays ``GET http://host:port/path`` requests (the form
Scrapy sends to an HTTP proxy for ``http://`` URLs) and ``CONNECT host:port``
tunnels (for ``https://`` URLs: the TLS handshake goes through untouched),
requires Basic auth, and records what it relayed (a tunnel as path ``CONNECT``).
It can answer a captcha page with 403 for one host (a site that banned this
exit address; a tunnel to it is refused with 403) instead of relaying. The client
connection is kept alive between requests (as real proxies do) unless the
answer cannot be delimited; each relayed request opens its own upstream
connection. :func:`closed_port` gives a port that refuses connections.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

CAPTCHA = b"<html><title>Captcha</title><body>Please solve this captcha</body></html>"


@dataclass(frozen=True)
class Relayed:
    host: str
    path: str
    status: int
    t: float  # time.monotonic()


class ForwardProxy:
    """An authenticating HTTP forward proxy (see the module docstring)."""

    def __init__(self, username: str, password: str, ban_host: str | None = None):
        self.username, self.password, self.ban_host = username, password, ban_host
        self._auth = b"Basic " + base64.b64encode(f"{username}:{password}".encode())
        self.records: list[Relayed] = []
        self.unauthorised = 0
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.username}:{self.password}@127.0.0.1:{self.port}"

    def __enter__(self) -> "ForwardProxy":
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        async def stop():
            self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def relayed(self, host: str | None = None, status: int | None = None) -> list[Relayed]:
        with self._cond:
            return [r for r in self.records if (host is None or r.host == host)
                    and (status is None or r.status == status)]

    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait until *predicate(records)* holds (woken by each relayed request)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.records), timeout)

    def _record(self, host: str, path: str, status: int) -> None:
        with self._cond:
            self.records.append(Relayed(host, path, status, time.monotonic()))
            self._cond.notify_all()

    async def _handle(self, reader, writer) -> None:
        try:
            while await self._serve(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader, writer) -> bool:
        """Answer one request; True if the client connection stays open."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
        client_close = any(k.strip().lower() == "connection" and "close" in v.lower()
                           for k, v in headers)
        auth = next((v.strip().encode() for k, v in headers
                     if k.lower() == "proxy-authorization"), None)
        if auth != self._auth:
            self.unauthorised += 1
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                         b"Proxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return not client_close
        if method == "CONNECT":
            return await self._tunnel(target, reader, writer)
        url = urlsplit(target)
        path = url.path or "/"
        if url.hostname == self.ban_host:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/html\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(CAPTCHA), CAPTCHA))
            await writer.drain()
            self._record(url.hostname, path, 403)
            return not client_close
        status, keep = await self._relay(method, url, path, headers, writer)
        self._record(url.hostname, path, status)
        return keep and not client_close

    async def _tunnel(self, target: str, reader, writer) -> bool:
        """Open a CONNECT tunnel and relay bytes both ways until one side closes."""
        host, _, port = target.rpartition(":")
        if host == self.ban_host:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            self._record(host, "CONNECT", 403)
            return True
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            self._record(host, "CONNECT", 502)
            return False
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        self._record(host, "CONNECT", 200)

        async def pipe(src, dst):
            try:
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        return False

    async def _relay(self, method, url, path, headers, writer) -> tuple[int, bool]:
        """Relay one GET; returns (status, whether the client may keep the connection)."""
        up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
        keep = [(k, v) for k, v in headers
                if k.lower() not in ("proxy-authorization", "proxy-connection", "connection")]
        query = f"?{url.query}" if url.query else ""
        request = f"{method} {path}{query} HTTP/1.1\r\n" + "".join(
            f"{k}:{v}\r\n" for k, v in keep) + "Connection: close\r\n\r\n"
        up_writer.write(request.encode("latin-1"))
        await up_writer.drain()
        answer = await up_reader.read()
        up_writer.close()
        head, sep, body = answer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = [line for line in lines[1:] if not line.lower().startswith(b"connection:")]
        names = {line.split(b":", 1)[0].strip().lower() for line in fields}
        # The upstream answer ends at its EOF; the client can only keep the
        # connection if the answer says where it ends.
        delimited = b"content-length" in names or b"transfer-encoding" in names
        if not delimited:
            fields.append(b"Connection: close")
        writer.write(b"\r\n".join([lines[0], *fields]) + sep + body)
        await writer.drain()
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
        return status, delimited


def closed_port() -> int:
    """A local port nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
