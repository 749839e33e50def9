"""Starting the dashboard: where it may listen, and the loop it runs in.

An open dashboard (no credentials) can pause a crawl, so it listens on a
loopback address only; any other address (``0.0.0.0``, a LAN address, a name
that resolves to one) needs ``DASHBOARD_TOKEN`` (or ``--token-file``) or
``DASHBOARD_USERNAME``/``DASHBOARD_PASSWORD``, else it refuses to start before
binding anything. Plain HTTP: put a TLS proxy or an SSH tunnel in front of a
dashboard reached over a network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
from typing import Callable

from aiohttp import web

from crawlproject.dashboard import DashboardConfig, create_app
from crawlproject.dashboard.auth import Credentials
from crawlproject.urls import is_loopback_host

logger = logging.getLogger(__name__)


class BindRefused(ValueError):
    """A non-loopback address without credentials (or an address that does not resolve)."""


def is_loopback(host: str) -> bool:
    """Whether every address *host* names is a loopback address."""
    if is_loopback_host(host):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False   # an address, and not a loopback one
    except ValueError:
        pass   # a name: resolve it
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise BindRefused(f"cannot resolve the dashboard address {host!r}: {exc}") from None
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def check_bind(host: str, credentials: Credentials) -> None:
    """Refuse an open dashboard on anything but loopback."""
    if not credentials.configured and not is_loopback(host):
        raise BindRefused(
            f"refusing to serve the dashboard on {host} without credentials: set "
            "DASHBOARD_TOKEN (or --token-file) or DASHBOARD_USERNAME and DASHBOARD_PASSWORD, "
            "or bind 127.0.0.1")


async def serve(config: DashboardConfig, host: str, port: int,
                ready: Callable[[str], None] = print, stop: asyncio.Event | None = None) -> None:
    """Serve until *stop* is set (default: SIGINT or SIGTERM); *ready* gets the URL."""
    check_bind(host, config.credentials)
    app = create_app(config)
    # Streams are cancelled at shutdown; nothing else takes long.
    runner = web.AppRunner(app, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        ready(f"http://{shown}:{bound[1]}/")
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def run(config: DashboardConfig, host: str, port: int) -> int:
    """``crawlctl dashboard``: log to stderr, print the address, serve until a signal."""
    check_bind(host, config.credentials)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s [%(name)s] %(levelname)s: %(message)s")

    def ready(url: str) -> None:
        auth = ("token" if config.credentials.token else "") + (
            " + " if config.credentials.token and config.credentials.password else "") + (
            "basic auth" if config.credentials.password else "")
        print(f"Dashboard of {', '.join(config.spiders)} on {url} "
              f"({'sign-in: ' + auth if auth else 'no sign-in: loopback only'}); "
              "Ctrl-C stops it", flush=True)

    try:
        asyncio.run(serve(config, host, port, ready))
    except OSError as exc:   # the port is taken, the address is not ours
        raise BindRefused(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return 0
