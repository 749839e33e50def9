"""Which addresses a node may connect to: the rule of ``DOWNLOAD_ALLOWED_NETWORKS``.

Plain classes over :mod:`ipaddress` (no Scrapy, no Twisted). An address is
allowed when it is globally reachable, or inside a network the operator lists:

* globally reachable: :attr:`ipaddress.IPv4Address.is_global` (and IPv6), and
  none of the ranges that this Python's ``is_global`` misses (multicast,
  IANA special-purpose blocks such as ``192.0.0.0/24``, IPv6 outside the
  global unicast block ``2000::/3``); NAT64 (``64:ff9b::/96``) and 6to4
  (``2002::/16``) addresses are judged by the IPv4 address they embed;
* listed: a CIDR (``"10.1.0.0/16"``, ``"fd12::/64"``, a bare address) or a
  named group: ``loopback``, ``private`` (RFC 1918, ``fc00::/7``,
  ``100.64.0.0/10``), ``link-local``.

Cloud metadata addresses (:data:`METADATA`) are refused even when their group is
allowed: only a listed CIDR of that one address (``169.254.169.254/32``) opens
one. IPv4-mapped IPv6 (``::ffff:127.0.0.1``), ``0.0.0.0``, ``::``, multicast
and reserved addresses are refused unless a listed CIDR covers them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

SETTING = "DOWNLOAD_ALLOWED_NETWORKS"


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


#: The named groups an operator may list, and what each opens.
GROUPS: dict[str, tuple[IPNetwork, ...]] = {
    "loopback": _nets("127.0.0.0/8", "::1/128"),
    "private": _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                     "fc00::/7"),
    "link-local": _nets("169.254.0.0/16", "fe80::/10"),
}

#: Cloud metadata and platform endpoints: credentials and instance secrets a page
#: must never make a node fetch. Refused unless listed as exactly that address.
METADATA: dict[IPAddress, str] = {ipaddress.ip_address(a): what for a, what in {
    "169.254.169.254": "cloud instance metadata: AWS, GCP, Azure, OCI, OpenStack...",
    "fd00:ec2::254": "AWS instance metadata over IPv6",
    "169.254.170.2": "AWS ECS task metadata and credentials",
    "169.254.170.23": "AWS EKS Pod Identity agent",
    "fd00:ec2::23": "AWS EKS Pod Identity agent over IPv6",
    "fd20:ce::254": "Google Compute Engine metadata over IPv6",
    "fe80::a9fe:a9fe": "OpenStack metadata over IPv6",
    "100.100.100.200": "Alibaba Cloud instance metadata",
    "168.63.129.16": "Azure platform endpoint, WireServer",
}.items()}

# Special-purpose blocks (IANA registries) that Python 3.11's is_global calls
# global, or that later Pythons open in part (anycast services a crawl has no
# use for): refused whatever the Python version.
_SPECIAL = _nets("192.0.0.0/24", "192.31.196.0/24", "192.52.193.0/24", "192.88.99.0/24",
                 "192.175.48.0/24", "2001::/23", "2620:4f:8000::/48", "3fff::/20")
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")


@dataclass(frozen=True)
class Refusal:
    """Why a connection to *address* (for *host*) is refused; *group* names the
    kind of address (``loopback``, ``private``, ``link-local``, ``metadata``,
    ``ipv4-mapped``, ``unspecified``, ``multicast``, ``reserved``)."""

    host: str
    address: str
    group: str
    detail: str = ""

    @property
    def reason(self) -> str:
        """The reason a dead letter carries: ``address_refused: 127.0.0.1 is loopback
        (DOWNLOAD_ALLOWED_NETWORKS)``."""
        who = (self.address if self.host in (self.address, f"[{self.address}]")
               else f"{self.host} ({self.address})")
        detail = f", {self.detail}" if self.detail else ""
        return f"address_refused: {who} is {self.group}{detail} ({SETTING})"


def parse_address(text: str) -> IPAddress | None:
    """*text* as an IP address (IPv6 in brackets too), else None (a host name)."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def classify(ip: IPAddress) -> tuple[str, str] | None:
    """``(group, detail)`` of a non-public address; None for a globally reachable one."""
    if ip in METADATA or getattr(ip, "ipv4_mapped", None) in METADATA:
        return "metadata", METADATA.get(ip) or METADATA[ip.ipv4_mapped]
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return "ipv4-mapped", ""
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            inner = classify(embedded)
            return None if inner is None else (inner[0], f"it embeds {embedded}")
    if ip.is_unspecified or ip in _THIS_NETWORK:
        return "unspecified", ""
    for group, networks in GROUPS.items():
        if any(ip in net for net in networks):
            return group, ""
    if ip.is_multicast:
        return "multicast", ""
    if (not ip.is_global or ip.is_reserved or any(ip in net for net in _SPECIAL)
            or (ip.version == 6 and ip not in _GLOBAL_UNICAST_V6)):
        return "reserved", ""
    return None


def _shown(ip: IPAddress) -> str:
    # Python 3.11 writes ::ffff:127.0.0.1 as ::ffff:7f00:1: keep the IPv4 visible.
    mapped = getattr(ip, "ipv4_mapped", None)
    return f"::ffff:{mapped}" if mapped is not None else str(ip)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour  # 2002::/16, else None


class AddressPolicy:
    """The addresses a node may connect to (see the module docstring)."""

    def __init__(self, groups: Iterable[str] = (), networks: Iterable[IPNetwork] = ()):
        self.groups = frozenset(groups)
        self.networks = tuple(networks)
        # A metadata address opens only by its own /32 or /128, never by a group
        # or a wider network that happens to hold it.
        self._exact = frozenset(n.network_address for n in self.networks
                                if n.num_addresses == 1)

    @classmethod
    def from_setting(cls, entries) -> "AddressPolicy":
        """Build from ``DOWNLOAD_ALLOWED_NETWORKS`` (group names and CIDRs); a
        bad entry raises ``ValueError`` naming it and what is accepted."""
        if isinstance(entries, str):
            entries = [e for e in entries.replace(",", " ").split() if e]
        groups, networks = [], []
        for entry in entries or ():
            text = str(entry).strip().lower()
            if text in GROUPS:
                groups.append(text)
                continue
            try:
                networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
            except ValueError:
                raise ValueError(f"{SETTING}: {entry!r} is neither a network (CIDR such as "
                                 f"'10.0.0.0/8' or an address) nor one of the groups "
                                 f"{', '.join(sorted(GROUPS))}") from None
        return cls(groups, networks)

    def __eq__(self, other) -> bool:
        return (isinstance(other, AddressPolicy) and self.groups == other.groups
                and set(self.networks) == set(other.networks))

    def __hash__(self) -> int:
        return hash((self.groups, frozenset(self.networks)))

    def __repr__(self) -> str:
        listed = sorted(self.groups) + [str(n) for n in self.networks]
        return f"AddressPolicy({listed or 'public addresses only'})"

    def check(self, ip: IPAddress, host: str | None = None) -> Refusal | None:
        """None if a connection to *ip* is allowed, else the :class:`Refusal`."""
        kind = classify(ip)
        if kind is None:
            return None
        group, detail = kind
        if group == "metadata":
            if ip in self._exact:
                return None
        elif group in self.groups or any(ip in net for net in self.networks):
            return None
        shown = _shown(ip)
        return Refusal(host if host is not None else shown, shown, group, detail)

    def check_text(self, address: str, host: str | None = None) -> Refusal | None:
        """:meth:`check` of an address given as text (a resolver's answer); text
        that is no address (a scope id Python cannot read...) is refused."""
        ip = parse_address(address)
        if ip is None:
            return Refusal(host or address, address, "reserved", "not an address")
        return self.check(ip, host)
