"""GuardedResolver: the reactor's name resolver, minus the addresses the policy refuses.

Scrapy's HTTP/1.1 and HTTP/2 handlers connect through Twisted's
``HostnameEndpoint``, which resolves every host, IP literals included, through
``reactor.nameResolver``; Twisted's ``connectTCP`` (the CONNECT tunnel to an
HTTPS proxy) resolves names through ``reactor.resolver``, which
``installNameResolver`` sets to this resolver too. So a host, a redirect
target or a proxy whose addresses are all refused cannot be connected to:
its resolution completes with no address (a DNS lookup error to Scrapy) and
the refusal is remembered per host, with its reason, for the middlewares that
dead-letter the request (:mod:`crawlproject.egress.report`).

One guard per process (the reactor has one resolver): :func:`install_guard`
configures it from a crawler's settings and wraps whatever resolver the
reactor has (Scrapy's ``CachingThreadedResolver`` by default), once.
:class:`~crawlproject.scheduler.RedisScheduler` calls it when it opens, so
every user of the shared frontier has it; ``TWISTED_DNS_RESOLVER =
"crawlproject.egress.resolver.GuardedResolver"`` installs it in any project.
Resolution stays the wrapped resolver's (threaded, cached): nothing here
blocks the reactor.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Callable, Iterable

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (IHostnameResolver, IHostResolution,
                                         IResolutionReceiver)
from zope.interface import implementer

from scrapy.exceptions import CannotResolveHostError

from crawlproject.defaults import setting
from crawlproject.egress.policy import AddressPolicy, Refusal, parse_address
from crawlproject.egress.report import (DNS_ERRORS, AddressRefused, connection_endpoint,
                                        refuse, report_for)
from crawlproject.identity.session import PROXY_ID

logger = logging.getLogger(__name__)

#: Hosts whose last resolution outcome is remembered (refused or not).
MAX_REMEMBERED = 10_000


@implementer(IHostResolution)
class _Resolution:
    def __init__(self, name: str):
        self.name = name

    def cancel(self) -> None:  # pragma: no cover - Twisted never calls it
        raise NotImplementedError


@implementer(IResolutionReceiver)
class _Checked:
    """Passes on the allowed addresses of *host*; tells the guard the outcome."""

    def __init__(self, guard: "GuardedResolver", receiver, host: str):
        self.guard, self.receiver, self.host = guard, receiver, host
        self.allowed, self.refused = 0, None

    def resolutionBegan(self, resolution) -> None:
        self.receiver.resolutionBegan(resolution)

    def addressResolved(self, address) -> None:
        refusal = self.guard.policy.check_text(address.host, self.host)
        if refusal is None:
            self.allowed += 1
            self.receiver.addressResolved(address)
        elif self.refused is None:
            self.refused = refusal

    def resolutionComplete(self) -> None:
        self.guard.outcome(self.host, None if self.allowed else self.refused)
        self.receiver.resolutionComplete()


@implementer(IHostnameResolver)
class GuardedResolver:
    """An ``IHostnameResolver`` over *inner* that answers only allowed addresses.

    Connections to *trusted* ``(host, port)`` pairs (the proxies the operator
    configured) are not filtered. :meth:`refusal` tells why the last
    resolution of a host gave nothing; *on_refused* hears each refusal.
    """

    def __init__(self, policy: AddressPolicy | None = None, inner=None,
                 trusted: Iterable[tuple[str, int]] = (),
                 on_refused: Callable[[Refusal], None] | None = None):
        self.policy = policy or AddressPolicy()
        self.inner = inner
        self.reactor = None
        self.on_refused = on_refused
        self.set_trusted(trusted)
        self._outcomes: OrderedDict[str, Refusal | None] = OrderedDict()

    # -- as Scrapy's TWISTED_DNS_RESOLVER -------------------------------------------------
    @classmethod
    def from_crawler(cls, crawler, reactor) -> "GuardedResolver":
        """The process's guard, configured from *crawler*'s settings, over Scrapy's
        ``CachingThreadedResolver`` (Scrapy passes its ``CrawlerProcess`` here)."""
        from scrapy.resolver import CachingThreadedResolver

        CachingThreadedResolver.from_crawler(crawler, reactor).install_on_reactor()
        guard = process_guard()
        guard.configure(policy_from_settings(crawler.settings),
                        operator_proxies(crawler.settings))
        guard.reactor = reactor
        return guard

    def install_on_reactor(self) -> None:
        """Wrap the reactor's resolver (Scrapy calls this after :meth:`from_crawler`)."""
        self.wrap(self.reactor)

    # -- configuration ---------------------------------------------------------------------
    def configure(self, policy: AddressPolicy, trusted: Iterable[tuple[str, int]]) -> None:
        """Take *policy* and the *trusted* proxy endpoints (a later crawler's win)."""
        if self.inner is not None and policy != self.policy:
            logger.warning("DOWNLOAD_ALLOWED_NETWORKS changed from %r to %r: one address "
                           "policy holds for every crawler of a process", self.policy, policy)
        self.policy = policy
        self.set_trusted(trusted)
        self._outcomes.clear()

    def set_trusted(self, trusted: Iterable[tuple[str, int]]) -> None:
        self.trusted = frozenset((_host_key(h), int(p)) for h, p in trusted)
        self._trusted_hosts = frozenset(h for h, _ in self.trusted)

    def wrap(self, reactor) -> None:
        """Install on *reactor* over its current resolver (nothing if already there)."""
        current = reactor.nameResolver
        if current is self:
            return
        self.inner, self.reactor = current, reactor
        reactor.installNameResolver(self)
        logger.info("Address guard on every connection (DOWNLOAD_ALLOWED_NETWORKS): %r, "
                    "over %s", self.policy,
                    type(getattr(current, "_simpleResolver", current)).__name__)

    # -- what the policy says ---------------------------------------------------------------
    def exempt(self, host: str, port: int) -> bool:
        """A connection to a proxy the operator configured (port 0: Twisted's
        ``connectTCP`` resolves without a port, the HTTPS proxy tunnel's way)."""
        key = _host_key(host)
        return (key, port) in self.trusted or (port == 0 and key in self._trusted_hosts)

    def refusal(self, host: str) -> Refusal | None:
        """Why the last resolution of *host* gave no address, if the policy did it."""
        return self._outcomes.get(_host_key(host))

    def outcome(self, host: str, refusal: Refusal | None) -> None:
        key = _host_key(host)
        self._outcomes.pop(key, None)
        self._outcomes[key] = refusal
        if len(self._outcomes) > MAX_REMEMBERED:
            self._outcomes.popitem(last=False)
        if refusal is not None and self.on_refused is not None:
            self.on_refused(refusal)

    # -- IHostnameResolver ------------------------------------------------------------------
    def resolveHostName(self, resolutionReceiver, hostName: str, portNumber: int = 0,
                        addressTypes=None, transportSemantics: str = "TCP"):
        """Resolve with the wrapped resolver, passing on only allowed addresses."""
        if self.exempt(hostName, portNumber):
            return self.inner.resolveHostName(resolutionReceiver, hostName, portNumber,
                                              addressTypes, transportSemantics)
        literal = parse_address(hostName)
        if literal is not None:
            return self._literal(resolutionReceiver, hostName, literal, portNumber, addressTypes)
        return self.inner.resolveHostName(_Checked(self, resolutionReceiver, hostName),
                                          hostName, portNumber, addressTypes, transportSemantics)

    def _literal(self, receiver, host: str, ip, port: int, types):
        # Answered here: an IP needs no lookup (Scrapy's default resolver cannot
        # even look up an IPv6 one), and a refused one never reaches the inner.
        resolution = _Resolution(host)
        receiver.resolutionBegan(resolution)
        refusal = self.policy.check(ip, host)
        if refusal is None:
            kind = IPv4Address if ip.version == 4 else IPv6Address
            if types is None or kind in types:
                receiver.addressResolved(kind("TCP", str(ip), port))
        self.outcome(host, refusal)
        receiver.resolutionComplete()
        return resolution

    # -- for handlers that connect by themselves (curl_cffi, the browser's proxy) -----------
    async def addresses(self, host: str, port: int) -> list[str]:
        """The allowed addresses of *host* (empty: not found), or
        :class:`~crawlproject.egress.report.AddressRefused` if all were refused."""
        exempt = self.exempt(host, port)
        ip = parse_address(host)
        if ip is not None:
            refusal = None if exempt else self.policy.check(ip, host)
            if refusal is not None:
                self.outcome(host, refusal)
                raise AddressRefused(refusal)
            return [str(ip)]
        collect = _Collect()
        receiver = collect if exempt else _Checked(self, collect, host)
        self.inner.resolveHostName(receiver, host, port)
        await collect.done.asFuture(asyncio.get_running_loop())
        if not collect.found and getattr(receiver, "refused", None) is not None:
            raise AddressRefused(receiver.refused)
        return collect.found


@implementer(IResolutionReceiver)
class _Collect:
    def __init__(self):
        self.found: list[str] = []
        self.done: Deferred = Deferred()

    def resolutionBegan(self, resolution) -> None:
        pass

    def addressResolved(self, address) -> None:
        self.found.append(address.host)

    def resolutionComplete(self) -> None:
        self.done.callback(None)


def _host_key(host: str) -> str:
    host = host.lower().rstrip(".")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


_GUARD: GuardedResolver | None = None


def process_guard() -> GuardedResolver:
    """The process's one guard (configured and installed or not)."""
    global _GUARD
    if _GUARD is None:
        _GUARD = GuardedResolver()
    return _GUARD


def active_guard() -> GuardedResolver | None:
    """The guard if it resolves names in this process (installed on the reactor), else None."""
    return _GUARD if _GUARD is not None and _GUARD.inner is not None else None


def policy_from_settings(settings) -> AddressPolicy:
    """The policy ``DOWNLOAD_ALLOWED_NETWORKS`` states (``ValueError`` if it is malformed)."""
    return AddressPolicy.from_setting(setting(settings, "DOWNLOAD_ALLOWED_NETWORKS"))


def operator_proxies(settings) -> set[tuple[str, int]]:
    """``(host, port)`` of the proxies the operator configured: ``PROXY_POOL`` and
    ``PROXY_POOL_FILE`` (with the pool on), ``STORED_PROXY_ALLOW``, and the
    ``*_proxy`` environment variables Scrapy's ``HttpProxyMiddleware`` reads.
    Proxies read from Redis are not among them: they pass the policy like a site."""
    from urllib.request import getproxies

    from crawlproject.proxies.pool import InvalidProxy, parse_proxy

    entries = list(setting(settings, "STORED_PROXY_ALLOW"))
    if setting(settings, "PROXY_POOL_ENABLED"):
        entries += setting(settings, "PROXY_POOL")
        entries += _file_entries(setting(settings, "PROXY_POOL_FILE"))
    if settings.getbool("HTTPPROXY_ENABLED"):
        entries += [url for scheme, url in getproxies().items() if scheme in ("http", "https")]
    out = set()
    for entry in entries:
        try:
            proxy = parse_proxy(entry)
        except InvalidProxy:  # the proxy middleware names it; never used, never trusted
            continue
        out.add((_host_key(proxy.host), proxy.port))
    return out


def _file_entries(path: str) -> list[str]:
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as lines:
            return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    except (OSError, UnicodeDecodeError):  # the proxy middleware stops the crawl for it
        return []


def install_guard(crawler) -> GuardedResolver | None:
    """Configure the process's guard from *crawler*'s settings and put it on the
    reactor over its resolver, now if the reactor runs, else once it does
    (after Scrapy installed ``TWISTED_DNS_RESOLVER``). None without a reactor."""
    from scrapy.utils.reactor import is_reactor_installed

    guard = process_guard()
    guard.configure(policy_from_settings(crawler.settings), operator_proxies(crawler.settings))
    guard.on_refused = report_for(crawler).resolver_refused
    if not is_reactor_installed():
        logger.warning("No Twisted reactor: the address guard (DOWNLOAD_ALLOWED_NETWORKS) "
                       "cannot check the connections of Scrapy's own download handlers")
        return None
    from twisted.internet import reactor

    if reactor.running:
        guard.wrap(reactor)
    else:
        reactor.callWhenRunning(guard.wrap, reactor)
    return guard


def refusal_of(request, exception) -> Refusal | None:
    """The guard's refusal behind *exception* (a DNS lookup error of a host whose
    last resolution the policy emptied), else None."""
    guard = active_guard()
    if guard is None or not isinstance(exception, DNS_ERRORS):
        return None
    host, _ = connection_endpoint(request)
    return guard.refusal(host)


async def checked_addresses(crawler, request, host: str, port: int) -> list[str] | None:
    """The addresses a handler that connects by itself (curl_cffi, the browser) may
    use for *request*'s connection to *host*; None when no guard is active in this
    process (it resolves as it always did). A refused target raises
    :class:`AddressRefused` (the request given up); a refused pool proxy raises
    ``CannotResolveHostError``, a failed proxy the pool reroutes around."""
    guard = active_guard()
    if guard is None:
        return None
    try:
        return await guard.addresses(host, port)
    except AddressRefused as exc:
        if request.meta.get(PROXY_ID) and request.meta.get("proxy") \
                and connection_endpoint(request) == (host, port):
            raise CannotResolveHostError(exc.refusal.reason) from None
        raise refuse(crawler, request, exc.refusal) from None
