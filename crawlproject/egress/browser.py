"""EgressProxy: the forward proxy on 127.0.0.1 that Chromium's every request goes through.

Chromium resolves names and follows redirects by itself, and Playwright's
request routing never sees a redirect's next hop: checking URLs before the
browser sends them would miss ``/away`` answering ``302`` to
``http://169.254.169.254/``. So the rendering handler launches the browser with
this proxy (``--proxy-server``; Playwright proxies loopback too): for each
request (``CONNECT host:port`` for https and WebSockets, an absolute URL for
http) it resolves the host through the address guard and connects to a checked
address itself. A refused one is answered ``403`` and never connected to;
Chromium never resolves a name, so nothing resolves to another address after
the check. One request per connection (``Connection: close``): a browser
connection never carries a second host's request over a checked one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from urllib.parse import urlsplit

from crawlproject.egress.policy import Refusal
from crawlproject.egress.report import AddressRefused

logger = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024          # bytes of a request or response head
HEAD_TIMEOUT = 30.0           # seconds a browser connection may take to send its request
CONNECT_TIMEOUT = 15.0        # seconds to connect to one checked address
#: Hop-by-hop headers dropped when an http request is passed on.
HOP_HEADERS = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization",
                         "te", "trailer", "upgrade"})
#: The header of this proxy's own 403: its value is a per-process token, so a
#: site cannot pass its own answer off as a refusal.
MARKER = "X-Crawlproject-Egress"


class EgressProxy:
    """Forward proxy that connects only to addresses *guard* allows (see the module
    docstring); *on_refused* hears every refused browser request."""

    def __init__(self, guard, on_refused=None):
        self.guard = guard
        self.on_refused = on_refused
        self.token = os.urandom(12).hex()
        self.server: asyncio.base_events.Server | None = None
        self._refused: dict[str, tuple[float, Refusal]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> str:
        """Listen on a free loopback port; the proxy's URL."""
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0, limit=MAX_HEAD)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        """Stop listening and drop the open connections."""
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def refusal(self, host: str, since: float = float("-inf")) -> Refusal | None:
        """The refusal of a browser request to *host* at monotonic time *since* or later."""
        seen = self._refused.get((host or "").lower().strip("[]"))
        return seen[1] if seen is not None and seen[0] >= since else None

    def latest(self, since: float) -> Refusal:
        """The last refusal since monotonic time *since* (a generic one if none)."""
        seen = max(self._refused.values(), key=lambda item: item[0], default=None)
        if seen is not None and seen[0] >= since:
            return seen[1]
        return Refusal("?", "?", "reserved", "refused by the browser's egress proxy")

    # -- one browser connection ----------------------------------------------------------
    def _accept(self, reader, writer) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader, writer) -> None:
        upstream = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            method, target, version, headers = _parse_head(head)
            host, port, path = _destination(method, target)
            upstream = await self._connect(writer, host, port)
            if upstream is None:
                return
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await _relay(reader, writer, *upstream)
            else:
                await self._forward(reader, writer, upstream, method, path, version, headers)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                ConnectionError, OSError, ValueError):
            pass  # a browser connection that went away or spoke nonsense: nothing to keep
        finally:
            for stream in (writer, upstream[1] if upstream else None):
                if stream is not None:
                    stream.close()

    async def _connect(self, writer, host: str, port: int):
        try:
            addresses = await self.guard.addresses(host, port)
        except AddressRefused as exc:
            self._refuse(host, exc.refusal)
            await _answer(writer, 403, exc.refusal.reason, {MARKER: self.token})
            return None
        for address in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(address, port),
                                              CONNECT_TIMEOUT)
            except (OSError, asyncio.TimeoutError):
                continue
        await _answer(writer, 502, f"cannot connect to {host}:{port}")
        return None

    def _refuse(self, host: str, refusal: Refusal) -> None:
        key = host.lower().strip("[]")
        self._refused.pop(key, None)
        self._refused[key] = (time.monotonic(), refusal)
        if len(self._refused) > 10_000:
            self._refused.pop(next(iter(self._refused)))
        if self.on_refused is not None:
            self.on_refused(refusal)

    async def _forward(self, reader, writer, upstream, method, path, version, headers) -> None:
        up_reader, up_writer = upstream
        kept = [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]
        length = next((v for k, v in headers if k.lower() == "content-length"), "0")
        if any(k.lower() == "transfer-encoding" for k, _ in headers):
            await _answer(writer, 411, "a request body needs a Content-Length here")
            return
        up_writer.write(_head(f"{method} {path} {version}", kept + [("Connection", "close")]))
        if int(length):
            up_writer.write(await reader.readexactly(int(length)))
        await up_writer.drain()
        # The answer's head says "close" to the browser: it never sends another
        # request (for another host, maybe) on this connection.
        status, answer = _parse_response_head(
            await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT * 4))
        kept = [(k, v) for k, v in answer if k.lower() not in HOP_HEADERS]
        writer.write(_head(status, kept + [("Connection", "close"), ("Proxy-Connection", "close")]))
        await _relay(reader, writer, up_reader, up_writer, client_to_server=False)


def _parse_head(head: bytes):
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    return method.upper(), target, version, _header_lines(lines[1:])


def _parse_response_head(head: bytes):
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], _header_lines(lines[1:])


def _header_lines(lines) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            out.append((name.strip(), value.strip()))
    return out


def _destination(method: str, target: str) -> tuple[str, int, str]:
    """``(host, port, path)`` a proxy request names (``ValueError`` if none)."""
    if method == "CONNECT":
        parts = urlsplit(f"//{target}")
        if not parts.hostname or not parts.port:
            raise ValueError(target)
        return parts.hostname, parts.port, ""
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(target)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, path


def _head(first: str, headers) -> bytes:
    lines = [first] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _answer(writer, status: int, text: str, headers: dict | None = None) -> None:
    body = f"{text}\n".encode()
    phrase = {403: "Forbidden", 411: "Length Required", 502: "Bad Gateway"}[status]
    head = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
            ("Connection", "close"), *(headers or {}).items()]
    writer.write(_head(f"HTTP/1.1 {status} {phrase}", head) + body)
    await writer.drain()


async def _relay(reader, writer, up_reader, up_writer, client_to_server: bool = True) -> None:
    """Copy bytes both ways (or only the answer) until either side is done."""
    async def pump(source, sink):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()

    tasks = [asyncio.ensure_future(pump(up_reader, writer))]
    # Without the browser->site copy, the browser closing still ends the relay.
    tasks.append(asyncio.ensure_future(pump(reader, up_writer) if client_to_server
                                       else reader.read()))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
