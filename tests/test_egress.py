"""Where requests may go (crawlproject.egress), component by component.

The policy is fuzzed against a reference written here from the IANA
special-purpose address registries; the guard runs on Twisted's own
``HostnameEndpoint`` and ``MemoryReactorClock`` (which records every TCP
connection asked for and resolves every name to 127.0.0.1); the middlewares
are built from real settings with ``get_crawler``; the impersonating handler
downloads from local servers. Nothing here leaves 127.0.0.x. The real crawl
(Scrapy's downloader, Chromium, cloud metadata addresses) is
tests/test_egress_crawl.py, in a network namespace.
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from scrapy import Request, Spider
from scrapy.exceptions import CannotResolveHostError
from scrapy.utils.test import get_crawler
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.base import PluggableResolverMixin
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.error import DNSLookupError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from zope.interface import implementer
from twisted.internet.interfaces import IHostnameResolver

from crawlproject.egress import resolver as resolver_module
from crawlproject.egress.middleware import EgressMiddleware
from crawlproject.egress.policy import METADATA, AddressPolicy
from crawlproject.egress.report import AddressRefused
from crawlproject.egress.resolver import GuardedResolver, operator_proxies
from crawlproject.identity.session import PROXY_ID
from crawlproject.middlewares.retry import BackoffRetryMiddleware

# ----------------------------------------------------------------- the reference

#: IANA IPv4 and IPv6 special-purpose registries (RFC 6890 and its updates, as of
#: 2026), every block whole, plus multicast: what a crawl of public sites never
#: needs. IPv6 outside 2000::/3 is not global unicast; NAT64 (64:ff9b::/96) and
#: 6to4 (2002::/16) addresses are what their embedded IPv4 address is.
REFERENCE_V4 = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24",
    "192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4")]
REFERENCE_V6 = [ipaddress.ip_network(n) for n in (
    "2001::/23", "2001:db8::/32", "2620:4f:8000::/48", "3fff::/20")]
GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
NAT64, SIX_TO_FOUR = ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("2002::/16")
GROUP_NETS = {"loopback": ["127.0.0.0/8", "::1/128"],
              "private": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                          "fc00::/7"],
              "link-local": ["169.254.0.0/16", "fe80::/10"]}


def embedded(ip):
    if ip.version == 6 and ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.version == 6 and ip in SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(ip) >> 80) & 0xFFFFFFFF)
    return None


def reference_public(ip) -> bool:
    if ip in METADATA:
        return False
    inner = embedded(ip)
    if inner is not None:
        return reference_public(inner)
    if ip.version == 4:
        return not any(ip in net for net in REFERENCE_V4)
    return ip in GLOBAL_UNICAST and not any(ip in net for net in REFERENCE_V6)


def reference_allowed(ip, groups, networks) -> bool:
    """The rule as docs/frontier.md states it."""
    if reference_public(ip):
        return True
    target = ip
    if ip in METADATA or (ip.version == 6 and ip.ipv4_mapped in METADATA) or (
            embedded(ip) is not None and embedded(ip) in METADATA):
        return any(net.num_addresses == 1 and ip == net.network_address for net in networks)
    inner = embedded(ip)
    if inner is not None and any(inner in ipaddress.ip_network(n)
                                 for g in groups for n in GROUP_NETS[g]):
        return True
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return any(ip in net for net in networks)   # never by a group
    in_group = any(target in ipaddress.ip_network(n) for g in groups for n in GROUP_NETS[g])
    return in_group or any(ip in net for net in networks)


SPECIAL = REFERENCE_V4 + REFERENCE_V6 + [ipaddress.ip_network(n) for n in (
    "::/96", "::ffff:0:0/96", "64:ff9b::/96", "2002::/16", "fc00::/7", "fe80::/10", "ff00::/8",
    "::1/128", "2000::/3", "5f00::/16")]


@st.composite
def addresses(draw):
    """Any address, half of them inside a special block (edges included) or a
    metadata address, where the rules differ."""
    kind = draw(st.sampled_from(["v4", "v6", "special", "metadata"]))
    if kind == "v4":
        return ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1)))
    if kind == "v6":
        return ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1)))
    if kind == "metadata":
        return draw(st.sampled_from(sorted(METADATA, key=str)))
    net = draw(st.sampled_from(SPECIAL))
    offset = draw(st.one_of(st.just(0), st.just(net.num_addresses - 1),
                            st.integers(0, net.num_addresses - 1)))
    return net.network_address + offset


@st.composite
def allow_lists(draw):
    groups = draw(st.lists(st.sampled_from(sorted(GROUP_NETS)), unique=True, max_size=3))
    nets = []
    for _ in range(draw(st.integers(0, 3))):
        ip = draw(addresses())
        prefix = draw(st.integers(0 if ip.version == 4 else 64, ip.max_prefixlen))
        nets.append(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
    return groups, nets


# ----------------------------------------------------------------- the policy

@pytest.mark.parametrize("address, group", [
    ("93.184.216.34", None), ("2606:2800:220:1:248:1893:25c8:1946", None),
    ("64:ff9b::5db8:d822", None),                        # NAT64 of a public address
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.31.0.1", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "private"), ("fd12::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"),
    ("169.254.170.2", "metadata"), ("100.100.100.200", "metadata"),
    ("168.63.129.16", "metadata"), ("::ffff:169.254.169.254", "metadata"),
    ("::ffff:127.0.0.1", "ipv4-mapped"), ("::ffff:8.8.8.8", "ipv4-mapped"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("0.1.2.3", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"), ("192.0.0.9", "reserved"),
    ("198.18.0.1", "reserved"), ("2001:db8::1", "reserved"), ("::7f00:1", "reserved"),
    ("64:ff9b::7f00:1", "loopback"), ("2002:7f00:1::1", "loopback"),  # they embed 127.0.0.1
])
def test_by_default_only_public_addresses_pass_and_each_refusal_names_its_group(address, group):
    refusal = AddressPolicy().check(ipaddress.ip_address(address))
    assert (refusal and refusal.group) == group
    if refusal:
        assert refusal.reason.startswith("address_refused: ")
        assert refusal.reason.endswith(" (DOWNLOAD_ALLOWED_NETWORKS)")


def test_groups_and_networks_open_what_they_name_but_metadata_only_by_its_own_address():
    policy = AddressPolicy.from_setting(["loopback", "link-local", "10.1.0.0/16", "fd00::/8"])
    allowed = ["127.0.0.1", "::1", "169.254.10.10", "fe80::1", "10.1.2.3", "64:ff9b::7f00:1"]
    refused = ["10.2.0.1", "192.168.1.1", "169.254.169.254", "fd00:ec2::254", "::ffff:127.0.0.1",
               "0.0.0.0"]
    assert [a for a in allowed if policy.check(ipaddress.ip_address(a))] == []
    assert [a for a in refused if not policy.check(ipaddress.ip_address(a))] == []
    exact = AddressPolicy.from_setting(["169.254.169.254/32", "::ffff:0:0/96"])
    assert exact.check(ipaddress.ip_address("169.254.169.254")) is None
    assert exact.check(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert exact.check(ipaddress.ip_address("169.254.170.2")).group == "metadata"
    assert AddressPolicy.from_setting("loopback, 192.168.0.0/16") == AddressPolicy.from_setting(
        ["192.168.0.0/16", "LOOPBACK"])


def test_a_refusal_says_which_host_which_address_and_why():
    policy = AddressPolicy()
    assert policy.check(ipaddress.ip_address("127.0.0.1")).reason == (
        "address_refused: 127.0.0.1 is loopback (DOWNLOAD_ALLOWED_NETWORKS)")
    assert policy.check(ipaddress.ip_address("::ffff:127.0.0.1"), "[::ffff:7f00:1]").reason == (
        "address_refused: [::ffff:7f00:1] (::ffff:127.0.0.1) is ipv4-mapped "
        "(DOWNLOAD_ALLOWED_NETWORKS)")
    assert policy.check_text("169.254.169.254", "meta.test").reason.startswith(
        "address_refused: meta.test (169.254.169.254) is metadata, cloud instance metadata")
    assert policy.check_text("fe80::1%eth9", "x").group == "link-local"


@pytest.mark.parametrize("entry", ["localhost", "10.0.0.0/33", "everything", "300.1.1.1"])
def test_an_entry_that_is_neither_a_network_nor_a_group_stops_the_crawl(entry):
    with pytest.raises(ValueError, match=r"DOWNLOAD_ALLOWED_NETWORKS: .*groups link-local, "
                                         r"loopback, private"):
        AddressPolicy.from_setting(["loopback", entry])


@hsettings(max_examples=1500, deadline=None)
@given(addresses())
def test_fuzz_the_default_policy_agrees_with_the_registries(ip):
    assert (AddressPolicy().check(ip) is None) == reference_public(ip), ip


@hsettings(max_examples=800, deadline=None)
@given(addresses(), allow_lists())
def test_fuzz_an_allow_list_opens_exactly_what_the_rule_says(ip, allow):
    groups, nets = allow
    policy = AddressPolicy(groups, nets)
    assert (policy.check(ip) is None) == reference_allowed(ip, groups, nets), (ip, groups, nets)


# ----------------------------------------------------------------- the guard (resolver)

@pytest.fixture
def guard(monkeypatch):
    """The process's guard, fresh for the test (and gone after it)."""
    fresh = GuardedResolver()
    monkeypatch.setattr(resolver_module, "_GUARD", fresh)
    return fresh


@implementer(IHostnameResolver)
class MappedResolver:
    """Answers names from a dict at once (several addresses per name)."""

    def __init__(self, names: dict[str, list[str]]):
        self.names, self.asked = names, []

    def resolveHostName(self, receiver, hostName, portNumber=0, addressTypes=None,
                        transportSemantics="TCP"):
        self.asked.append(hostName)
        receiver.resolutionBegan(SimpleNamespace(name=hostName))
        for address in self.names.get(hostName, ()):
            kind = IPv6Address if ":" in address else IPv4Address
            receiver.addressResolved(kind("TCP", address, portNumber))
        receiver.resolutionComplete()
        return SimpleNamespace(name=hostName)


def connect(reactor, host: str, port: int = 80):
    """Connect a HostnameEndpoint (as Scrapy's HTTP/1.1 handler does); its failure, if any."""
    failures = []
    HostnameEndpoint(reactor, host, port).connect(Factory.forProtocol(Protocol)).addErrback(
        failures.append)
    return failures[0].value if failures else None


def test_a_name_that_resolves_to_a_refused_address_is_never_connected_to(guard):
    reactor = MemoryReactorClock()          # resolves every name to 127.0.0.1
    guard.configure(AddressPolicy(), ())
    guard.wrap(reactor)
    assert reactor.nameResolver is guard
    for host in ("internal.test", "127.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1"):
        assert isinstance(connect(reactor, host), DNSLookupError), host
    assert reactor.tcpClients == []
    assert guard.refusal("internal.test").reason == (
        "address_refused: internal.test (127.0.0.1) is loopback (DOWNLOAD_ALLOWED_NETWORKS)")
    assert guard.refusal("169.254.169.254").group == "metadata"
    assert guard.refusal("::ffff:127.0.0.1").group == "ipv4-mapped"
    # Listed: the same name connects, and its refusal is forgotten.
    guard.configure(AddressPolicy(["loopback"]), ())
    assert connect(reactor, "internal.test", 8080) is None
    assert [c[:2] for c in reactor.tcpClients] == [("127.0.0.1", 8080)]
    assert guard.refusal("internal.test") is None


def test_only_the_allowed_answers_of_a_mixed_resolution_are_passed_on(guard):
    reactor = MemoryReactorClock()
    reactor.nameResolver = MappedResolver({"mixed.test": ["10.0.0.1", "93.184.216.34"],
                                           "gone.test": []})
    guard.wrap(reactor)
    assert connect(reactor, "mixed.test") is None
    reactor.advance(1)                      # HostnameEndpoint's next attempt, if any
    assert [c[0] for c in reactor.tcpClients] == ["93.184.216.34"]
    assert guard.refusal("mixed.test") is None
    assert isinstance(connect(reactor, "gone.test"), DNSLookupError)
    assert guard.refusal("gone.test") is None        # not found is not refused


def test_ip_literals_are_answered_without_the_wrapped_resolver_and_v6_ones_work(guard):
    inner = MappedResolver({})
    reactor = MemoryReactorClock()
    reactor.nameResolver = inner
    guard.wrap(reactor)
    assert connect(reactor, "2606:2800:220:1:248:1893:25c8:1946", 443) is None
    assert connect(reactor, "169.254.169.254") is not None
    assert inner.asked == [] and len(reactor.tcpClients) == 1


def test_operator_proxies_are_trusted_on_their_port_and_port_0_only(guard, tmp_path,
                                                                    monkeypatch):
    for name in [n for n in __import__("os").environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("https_proxy", "http://10.0.0.8:8080")   # HttpProxyMiddleware's
    listed = tmp_path / "proxies.txt"
    listed.write_text("# ours\nhttp://10.0.0.7:3128\n")
    settings = get_crawler(Spider, {"PROXY_POOL_ENABLED": True,
                                    "PROXY_POOL": ["http://u:p@127.0.0.9:8888"],
                                    "PROXY_POOL_FILE": str(listed),
                                    "STORED_PROXY_ALLOW": ["http://[fd00::5]:80"]}).settings
    trusted = operator_proxies(settings)
    assert trusted == {("127.0.0.9", 8888), ("10.0.0.7", 3128), ("fd00::5", 80),
                       ("10.0.0.8", 8080)}
    off = get_crawler(Spider, {"PROXY_POOL": ["http://127.0.0.9:8888"]}).settings
    assert operator_proxies(off) == {("10.0.0.8", 8080)}   # a pool that is off: not its proxies
    reactor = MemoryReactorClock()
    guard.configure(AddressPolicy(), trusted)
    guard.wrap(reactor)
    assert connect(reactor, "127.0.0.9", 8888) is None        # the proxy, as Scrapy connects
    assert connect(reactor, "127.0.0.9", 80) is not None      # anything else there: refused
    assert guard.exempt("127.0.0.9", 0) and not guard.exempt("127.0.0.8", 0)  # connectTCP's way


def test_as_twisted_dns_resolver_it_wraps_scrapys_default_resolver(guard):
    class Reactor(PluggableResolverMixin):
        pass

    reactor = Reactor()
    crawler = get_crawler(Spider, {"DOWNLOAD_ALLOWED_NETWORKS": ["private"]})
    built = GuardedResolver.from_crawler(crawler, reactor)
    built.install_on_reactor()
    assert built is guard and reactor.nameResolver is guard
    assert guard.policy == AddressPolicy(["private"])
    assert type(guard.inner._simpleResolver).__name__ == "CachingThreadedResolver"  # Scrapy's
    guard.wrap(reactor)                                                 # once only
    assert reactor.nameResolver is guard and guard.inner is not guard


def test_addresses_for_handlers_that_resolve_by_themselves(guard):
    guard.configure(AddressPolicy.from_setting(["127.0.0.2/32"]), [("proxy.test", 3128)])
    guard.inner = MappedResolver({"site.test": ["127.0.0.2"], "evil.test": ["127.0.0.1"],
                                  "proxy.test": ["10.9.9.9"]})

    async def scenario():
        assert await guard.addresses("site.test", 80) == ["127.0.0.2"]
        assert await guard.addresses("proxy.test", 3128) == ["10.9.9.9"]   # trusted
        assert await guard.addresses("nowhere.test", 80) == []
        for host in ("evil.test", "[::1]", "proxy.test"):
            with pytest.raises(AddressRefused, match="address_refused: "):
                await guard.addresses(host, 80)

    asyncio.run(scenario())


# ----------------------------------------------------------------- the middlewares

def crawler_with_frontier(**settings):
    crawler = get_crawler(Spider, settings)
    failed = []
    crawler.engine = SimpleNamespace(scheduler=SimpleNamespace(
        mark_failed=lambda request, reason, kind: failed.append((request.url, reason, kind))))
    crawler.spider = Spider.from_crawler(crawler, "s")
    crawler.stats.open_spider()
    return crawler, failed


@pytest.mark.parametrize("url, meta, group", [
    ("http://169.254.169.254/latest/meta-data/", {}, "metadata"),
    ("http://[::1]:8080/", {}, "loopback"),
    ("http://[::ffff:127.0.0.1]/", {}, "ipv4-mapped"),
    ("http://0.0.0.0:6379/", {}, "unspecified"),
    ("http://[fd00:ec2::254]/", {"proxy": "http://203.0.113.80:3128"}, "metadata"),
    ("https://example.com/", {"proxy": "http://10.0.0.9:3128"}, "private"),   # not the operator's
    ("http://proxy.internal:3128/admin", {}, "proxy"),  # the operator's proxy, fetched directly
])
def test_ip_literals_and_untrusted_proxies_are_refused_before_any_connection(guard, url, meta,
                                                                             group):
    crawler, failed = crawler_with_frontier(
        PROXY_POOL_ENABLED=True, PROXY_POOL=["http://10.0.0.7:3128", "http://proxy.internal:3128"])
    mw = EgressMiddleware.from_crawler(crawler)
    request = Request(url, meta=meta)
    with pytest.raises(AddressRefused) as refused:
        mw.process_request(request)
    assert refused.value.refusal.group == group
    assert failed == [(url, refused.value.refusal.reason, "download")]
    assert crawler.stats.get_value("egress/refused") == 1
    assert crawler.stats.get_value(f"egress/refused/{group}") == 1


def test_allowed_requests_and_trusted_proxies_pass(guard):
    crawler, failed = crawler_with_frontier(DOWNLOAD_ALLOWED_NETWORKS=["10.1.0.0/16"],
                                            STORED_PROXY_ALLOW=["http://127.0.0.9:3128"])
    mw = EgressMiddleware.from_crawler(crawler)
    for request in (Request("http://10.1.2.3/"), Request("https://example.com/"),
                    Request("http://example.com/", meta={"proxy": "http://127.0.0.9:3128"}),
                    Request("http://example.com/", meta={"proxy": "http://proxy.example:80"})):
        assert mw.process_request(request) is None
    assert failed == []


def test_a_connection_the_guard_refused_is_given_up_with_its_reason_never_retried(guard):
    guard.inner = MappedResolver({"internal.test": ["127.0.0.1"], "pool.test": ["10.0.0.3"]})
    crawler, failed = crawler_with_frontier(RETRY_TIMES=5)
    retry = BackoffRetryMiddleware.from_crawler(crawler)
    egress = EgressMiddleware.from_crawler(crawler)

    async def resolve(host):
        with pytest.raises(AddressRefused):
            await guard.addresses(host, 80)

    asyncio.run(resolve("internal.test"))
    asyncio.run(resolve("pool.test"))
    request = Request("http://internal.test/page")
    error = CannotResolveHostError("no results for hostname lookup: internal.test")
    # The retry middleware alone (no EgressMiddleware in the project): no retry either.
    with pytest.raises(AddressRefused):
        retry.process_exception(request, error)
    with pytest.raises(AddressRefused):
        egress.process_exception(request, DNSLookupError("internal.test"))
    reason = "address_refused: internal.test (127.0.0.1) is loopback (DOWNLOAD_ALLOWED_NETWORKS)"
    assert failed == [(request.url, reason, "download")] * 2
    # A DNS error the guard did not cause is retried as before.
    other = Request("http://gone.test/")
    assert isinstance(retry.process_exception(other, error), Request)
    assert egress.process_exception(other, error) is None
    # A pool proxy from Redis that resolves to a refused address: the pool reroutes.
    proxied = Request("http://example.com/", meta={"proxy": "http://pool.test:80",
                                                   PROXY_ID: "pool.test:80"})
    assert egress.process_exception(proxied, error) is None
    assert crawler.stats.get_value("egress/refused") == 2


# ----------------------------------------------------------------- curl_cffi pinned

class Server:
    """A local HTTP server that says which address it listens on."""

    def __init__(self, host: str):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                body = host.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_impersonating_handler_connects_only_to_the_address_the_guard_checked(guard):
    """libcurl resolves names itself: ``pinned.test`` is known to the guard only
    (a handler that let libcurl resolve it would fail), ``evil.test`` resolves to
    a refused address whose server must see nothing."""
    pytest.importorskip("curl_cffi")
    from crawlproject.impersonate.handler import ImpersonateDownloadHandler
    from crawlproject.impersonate import HANDLER

    good, evil = Server("127.0.0.2"), Server("127.0.0.1")
    guard.inner = MappedResolver({"pinned.test": ["127.0.0.2"], "evil.test": ["127.0.0.1"]})
    guard.configure(AddressPolicy.from_setting(["127.0.0.2/32"]), ())

    async def main():
        crawler, failed = crawler_with_frontier(
            IMPERSONATE_ENABLED=True, DOWNLOAD_HANDLERS={"http": HANDLER, "https": HANDLER})
        handler = ImpersonateDownloadHandler(crawler)
        meta = {"_crawlproject_identity": {"profile": "chrome131"}, "download_timeout": 10}
        try:
            response = await handler.download_request(
                Request(f"http://pinned.test:{good.port}/a", meta=meta))
            with pytest.raises(AddressRefused):
                await handler.download_request(
                    Request(f"http://evil.test:{evil.port}/b", meta=meta))
            return response, failed
        finally:
            await handler.close()

    try:
        response, failed = asyncio.run(main())
    finally:
        good.close()
        evil.close()
    assert (response.status, response.body) == (200, b"127.0.0.2")
    assert good.seen == ["/a"] and evil.seen == []
    assert [reason for _, reason, _ in failed] == [
        "address_refused: evil.test (127.0.0.1) is loopback (DOWNLOAD_ALLOWED_NETWORKS)"]


# ----------------------------------------------------------------- the browser's proxy

def test_the_browsers_proxy_tunnels_and_forwards_to_checked_addresses_only(guard):
    """What Chromium sends through EgressProxy: CONNECT (https, WebSockets) and
    absolute-URL requests (http); a refused host gets a 403 with the proxy's
    token and no connection, an allowed one its answer, closed after it."""
    from crawlproject.egress.browser import MARKER, EgressProxy

    site, evil = Server("127.0.0.2"), Server("127.0.0.1")
    guard.inner = MappedResolver({"site.test": ["127.0.0.2"], "evil.test": ["127.0.0.1"]})
    guard.configure(AddressPolicy.from_setting(["127.0.0.2/32"]), ())
    refused = []

    async def exchange(port: int, data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), 10)   # until the proxy closes
        writer.close()
        return answer

    async def main():
        proxy = EgressProxy(guard, refused.append)
        port = int((await proxy.start()).rpartition(":")[2])
        try:
            forwarded = await exchange(port, (
                f"GET http://site.test:{site.port}/page?q=1 HTTP/1.1\r\nHost: site.test\r\n"
                f"Proxy-Connection: keep-alive\r\n\r\n").encode())
            tunnel = await exchange(port, (
                f"CONNECT site.test:{site.port} HTTP/1.1\r\n\r\n"
                f"GET /tunnelled HTTP/1.0\r\nHost: site.test\r\n\r\n").encode())
            denied = [await exchange(port, f"CONNECT evil.test:{evil.port} HTTP/1.1\r\n\r\n"
                                     .encode()),
                      await exchange(port, f"GET http://evil.test:{evil.port}/ HTTP/1.1\r\n\r\n"
                                     .encode())]
            return forwarded, tunnel, denied, proxy.token, proxy.refusal("evil.test")
        finally:
            await proxy.close()

    try:
        forwarded, tunnel, denied, token, refusal = asyncio.run(main())
    finally:
        site.close()
        evil.close()
    head, _, body = forwarded.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"Connection: close" in head
    assert body == b"127.0.0.2"
    assert tunnel.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200")
    assert site.seen == ["/page?q=1", "/tunnelled"] and evil.seen == []
    for answer in denied:
        assert answer.startswith(b"HTTP/1.1 403 ") and f"{MARKER}: {token}".encode() in answer
    assert refusal.reason == ("address_refused: evil.test (127.0.0.1) is loopback "
                              "(DOWNLOAD_ALLOWED_NETWORKS)")
    assert len(refused) == 2
