"""URLs and hosts in one canonical form, for fetching, dedupe, politeness and robots.txt.

One page should be one URL and one site one host, whatever spelling a link, a
seed or a redirect used: ``http://User:pw@Example.COM.:80/a;jsessionid=1`` is
``http://example.com/a``. :func:`canonicalize` makes that form once, when a
request enters the frontier (:class:`~crawlproject.scheduler.RedisScheduler`)
or a seed becomes a request (:mod:`crawlproject.seeds`), so that the URL
fetched, its fingerprint (Scrapy's ``canonicalize_url`` of it), its politeness
key (:func:`canonical_host`) and its robots.txt origin (:func:`origin`) agree.

What changes in the URL fetched (what Nutch's and Heritrix's default rules do):

* the host: lower case, IDN as punycode (w3lib's ``safe_url_string``, which
  Scrapy's ``Request`` applies already), trailing dots removed (``host.`` is
  the same server, and was a second politeness slot and robots.txt fetch),
  IPv6 in its RFC 5952 form; the port when it is the scheme's default;
* credentials (``user:pw@``): removed, counted, logged once per host without
  them. For a host listed in ``URL_CREDENTIALS_HOSTS`` they travel sealed in
  ``meta["url_credentials"]`` (AES-GCM under a key derived from
  ``FRONTIER_SECRET``, bound to the host: never in clear in Redis, a dead
  letter or a log line) and :class:`~crawlproject.middlewares.urlcredentials.UrlCredentialsMiddleware`
  sends them as ``Authorization: Basic`` to that host only, as Scrapy's
  ``HttpAuthMiddleware`` does for its ``http_auth_domain``;
* session ids: path parameters (``;jsessionid=...``) and query parameters
  whose name matches ``URL_SESSION_PARAMS`` (a regex, whole name, any case)
  are removed; the other parameters keep their order and spelling (Scrapy's
  fingerprint sorts them already; the site gets the query it linked to).

Nothing else is rewritten (no sorting, no ``www.``, no trailing slash): those
name other resources on some sites. A request with ``meta["verbatim_url"]``
(Scrapy 2.19: sent as written) only loses its credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import socket
import unicodedata
from functools import lru_cache
from ipaddress import ip_address
from typing import NamedTuple
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from crawlproject.defaults import setting

logger = logging.getLogger(__name__)

__all__ = ["canonical_host", "canonicalize", "origin", "redact_userinfo", "strip_userinfo",
           "Canonical", "CredentialSeal", "CREDENTIALS_META",
           "UrlCanonicalizer", "canonicalizer_for", "DEFAULT_PORTS"]

DEFAULT_PORTS = {"http": 80, "https": 443}
#: stat of each kind of change (``urls/<kind>``)
CREDENTIALS, SESSION_PATH, SESSION_QUERY, HOST, PORT = (
    "credentials", "session_id_path", "session_id_query", "host", "port")
#: meta key of a request's sealed URL credentials (URL_CREDENTIALS_HOSTS)
CREDENTIALS_META = "url_credentials"
# Hosts whose stripped credentials were logged: at most this many lines a node.
_LOGGED_HOSTS_MAX = 1000
# An IPv4 address in another notation (127.1, 0x7f.0.0.1, 2130706433): 1 to 4
# numeric labels, as the resolver's inet_aton reads them.
_IPV4_NUMBERS = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}", re.I)
_DOTTED_QUAD = (r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/?#@\s]*@")
_USERINFO_BYTES = re.compile(_USERINFO.pattern.encode())


@lru_cache(maxsize=65536)
def canonical_host(host: str) -> str:
    """*host* as every part of the crawl names it: lower case, without
    brackets or trailing dots, an IDN as punycode, an IPv6 address in its
    RFC 5952 form (``[::0:1]`` → ``::1``), an IPv4 address written another
    way as its dotted quad (``127.1``, ``0x7f.0.0.1``, ``2130706433``: the
    server the resolver connects to, as browsers read them too). ``""``
    stays ``""``; a name IDNA cannot encode stays as it is, lower-cased."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:   # IPv6 (a zone id, fe80::1%eth0, kept)
        try:
            address = ip_address(host)
        except ValueError:
            return host.lower()
        if address.ipv4_mapped is not None:   # RFC 5952 §5: ::ffff:192.0.2.1
            return f"::ffff:{address.ipv4_mapped}"
        return address.compressed
    host = host.rstrip(". \t\r\n\f\v") or host   # (junk spaces too: idempotent)
    if _IPV4_NUMBERS.fullmatch(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:   # 256, 08...: no address; a name as any other
            return host.lower()
    if not host.isascii():
        try:  # what w3lib (so Scrapy's Request) does to a host name
            host = unicodedata.normalize("NFKC", host).encode("idna").decode("ascii")
        except UnicodeError:
            pass
    return host.lower()


@lru_cache(maxsize=4096)
def is_loopback_host(host: str) -> bool:
    """Whether *host* names this machine by its form alone, without a DNS
    lookup: ``localhost``, a ``*.localhost`` name (RFC 6761, as browsers treat
    it) or a loopback address (``127.0.0.2``, ``[::1]``, ``127.1``)."""
    name = canonical_host(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ip_address(name).is_loopback
    except ValueError:
        return False


def _netloc(host: str, port: int | None) -> str:
    host = f"[{host}]" if ":" in host else host
    return host if port is None else f"{host}:{port}"


def origin(url: str) -> str:
    """``scheme://host[:port]`` of *url* in the canonical form (robots.txt
    applies per origin): no credentials, the default port left out."""
    try:
        parts = urlsplit(url)
    except ValueError:   # "http://[x/": no request has it (Scrapy refuses it)
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0].rpartition('@')[2]}".lower()
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:   # not a number: kept as written, it names no other site
        return f"{scheme}://{canonical_host(parts.netloc.rpartition('@')[2])}"
    if port == DEFAULT_PORTS.get(scheme):
        port = None
    return f"{scheme}://{_netloc(canonical_host(parts.hostname or ''), port)}"


def redact_userinfo(text: str | bytes) -> str | bytes:
    """*text* (a URL, a raw seed, a log argument; str or bytes) without the
    ``user:pw@`` of any URL in it: for what is logged or stored of input that
    is not a request."""
    if isinstance(text, bytes):
        return _USERINFO_BYTES.sub(rb"\1", text) if b"@" in text else text
    return _USERINFO.sub(r"\1", text) if "@" in text else text


def strip_userinfo(url: str) -> str:
    """*url* without ``user:pw@`` in its authority, otherwise as it is."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class CredentialSeal:
    """URL credentials sealed for the frontier: AES-GCM (``cryptography``,
    a Scrapy dependency) under a key derived from each ``FRONTIER_SECRET``
    (the first seals, any opens), the host as associated data: a token opens
    only for the host it was made for, and only on a node of the crawl."""

    PREFIX = "c1:"

    def __init__(self, secrets):
        self._keys = [hmac.new(bytes(s), b"crawlproject url credentials",
                               hashlib.sha256).digest() for s in secrets]
        if not self._keys:
            raise ValueError("a CredentialSeal needs at least one secret")

    def seal(self, host: str, userinfo: str) -> str:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        sealed = AESGCM(self._keys[0]).encrypt(nonce, userinfo.encode(), host.encode())
        return self.PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def open(self, host: str, token) -> str | None:
        """The ``user:password`` of *token* for *host*, or None (another host,
        another crawl's secret, altered, not a token)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not isinstance(token, str) or not token.startswith(self.PREFIX):
            return None
        try:
            raw = base64.urlsafe_b64decode(token[len(self.PREFIX):])
        except (binascii.Error, ValueError):
            return None
        if len(raw) < 12 + 16:
            return None
        for key in self._keys:
            try:
                return AESGCM(key).decrypt(raw[:12], raw[12:], host.encode()).decode()
            except (InvalidTag, UnicodeDecodeError):
                continue
        return None


def seal_from_settings(settings) -> CredentialSeal | None:
    """The crawl's :class:`CredentialSeal`, None without ``FRONTIER_SECRET``."""
    from crawlproject.signing import secrets_from_settings

    keys = secrets_from_settings(settings)
    return CredentialSeal(keys) if keys else None


class Canonical(NamedTuple):
    """What :func:`canonicalize` made of a URL."""

    url: str
    #: the kinds of change made (``credentials``, ``session_id_path``,
    #: ``session_id_query``, ``host``, ``port``)
    changes: tuple
    #: ``"user:password"`` removed (URL-decoded), or None: for a site allowed
    #: to receive them only; never log it
    userinfo: str | None = None


def session_matcher(names: str) -> re.Pattern:
    """The regex of session-id parameter names (a whole name, any case);
    ValueError naming the setting if *names* does not compile."""
    try:
        return re.compile(f"(?:{names})", re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"URL_SESSION_PARAMS is not a regular expression: {exc}") from None


#: Names that are a session id only with a token for value: ``sid`` is also a
#: story, site or search id (``?sid=12`` names a page: removing it would merge
#: distinct pages, a loss; a session's ``sid`` is a long random token).
AMBIGUOUS_SESSION_NAMES = frozenset({"sid"})
_TOKEN = re.compile(r"[0-9A-Za-z_.-]{16,}")


def _is_session(name: str, value: str, names: re.Pattern) -> bool:
    name = unquote_plus(name)
    if not names.fullmatch(name):
        return False
    return name.lower() not in AMBIGUOUS_SESSION_NAMES or bool(
        _TOKEN.fullmatch(unquote_plus(value)))


def _strip_path_sessions(path: str, names: re.Pattern) -> str:
    # ;name=value path parameters (Java's ;jsessionid=, also after any segment)
    def keep(match: re.Match) -> str:
        return ("" if _is_session(match.group(1), match.group(2) or "", names)
                else match.group(0))
    return re.sub(r";([^/;=?#]*)(?:=([^/;?#]*))?", keep, path)


def _strip_query_sessions(query: str, names: re.Pattern) -> str:
    # Only whole name=value pairs go; the others keep their order and spelling.
    pairs = query.split("&")
    kept = [p for p in pairs if not _is_session(*p.partition("=")[::2], names)]
    return query if len(kept) == len(pairs) else "&".join(kept)


def canonicalize(url: str, session_params: re.Pattern | None = None, *,
                 hosts: bool = True) -> Canonical:
    """*url* in its canonical form (see the module docstring) and what changed.

    *session_params*: the names of session-id parameters to remove (None:
    none); *hosts*: also the host and port (False: only credentials and
    session ids). A URL that is not http(s), or whose port is not a number,
    only loses its credentials."""
    try:
        parts = urlsplit(url)
    except ValueError:   # "http://[x/": no request has it (Scrapy refuses it)
        return Canonical(url, ())
    scheme = parts.scheme.lower()
    changes = []
    userinfo, sep, hostport = parts.netloc.rpartition("@")
    if userinfo:
        changes.append(CREDENTIALS)
    netloc, path, query = hostport, parts.path, parts.query
    if hosts and scheme in DEFAULT_PORTS:
        netloc = _canonical_netloc(scheme, hostport, changes)
    if session_params is not None and scheme in DEFAULT_PORTS:
        if ";" in path:
            stripped = _strip_path_sessions(path, session_params)
            if stripped != path:
                changes.append(SESSION_PATH)
                path = stripped
        if query:
            stripped = _strip_query_sessions(query, session_params)
            if stripped != query:
                changes.append(SESSION_QUERY)
                query = stripped
    if not changes and not sep:
        return Canonical(url, ())
    rebuilt = urlunsplit((parts.scheme, netloc, path, query, parts.fragment))
    if not netloc and path.startswith("//"):
        # no host ("http://@//a"): urlunsplit would read the path's "//a" as the
        # authority, a request to host "a"; the authority stays empty instead
        rebuilt = f"{parts.scheme}://{rebuilt.partition(':')[2]}"
    if not query and url.partition("#")[0].endswith("?"):
        rebuilt = rebuilt.replace("#", "?#", 1) if parts.fragment else rebuilt + "?"
    return Canonical(rebuilt, tuple(changes), unquote_plus(userinfo) if userinfo else None)


def _canonical_netloc(scheme: str, hostport: str, changes: list) -> str:
    """*hostport* (``host[:port]``) canonical; the kinds of change added to *changes*."""
    if hostport.startswith("["):
        end = hostport.find("]") + 1
        if not end:
            return hostport
        host, port_text = hostport[:end], hostport[end:]
    else:
        host, _, port_text = hostport.partition(":")
        port_text = _ and ":" + port_text
    digits = port_text[1:]
    if digits and not (digits.isascii() and digits.isdigit()):
        return hostport   # not a port: Scrapy refuses it, nothing to spell otherwise
    port = int(digits) if digits else None
    if port == DEFAULT_PORTS[scheme]:
        port = None
    canonical = canonical_host(host) or host
    if _netloc(canonical, None) != host:
        changes.append(HOST)
    if port_text != (f":{port}" if port is not None else ""):
        changes.append(PORT)
    return _netloc(canonical, port)


class UrlCanonicalizer:
    """Canonicalises Scrapy requests for one crawl: counts what it changes
    (``urls/<kind>`` stats), logs credentials removed once per host (never the
    credentials), and keeps those of a host listed in ``URL_CREDENTIALS_HOSTS``
    sealed in ``meta["url_credentials"]`` (``FRONTIER_SECRET``; without it they
    are dropped too) for :class:`~crawlproject.middlewares.urlcredentials.UrlCredentialsMiddleware`.

    Settings: ``URL_CANONICAL_ENABLED`` (host and port in the URL fetched),
    ``URL_STRIP_SESSION_IDS`` and ``URL_SESSION_PARAMS``, ``URL_CREDENTIALS_HOSTS``.
    Get the crawl's one instance with :func:`canonicalizer_for`.
    """

    def __init__(self, *, hosts: bool = True, session_params: re.Pattern | None = None,
                 credential_hosts=(), stats=None, seal: CredentialSeal | None = None):
        self.hosts = hosts
        self.session_params = session_params
        self.credential_hosts = frozenset(canonical_host(h) for h in credential_hosts)
        self.stats = stats
        self.seal = seal
        self._logged: set[str] = set()
        # A cheap "nothing to do" for the usual URL (most links a page yields;
        # two regexes, ~0.6 us each): an authority without userinfo, port,
        # upper case, trailing dot or IPv4 address in another notation than
        # its dotted quad, and no session parameter name after it.
        self._authority = re.compile(
            r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#]*(?:[@:A-Z]|\.(?=[/?#]|$))"
            rf"|(?!{_DOTTED_QUAD}(?=[/?#]|$))(?i:{_IPV4_NUMBERS.pattern})(?=[/?#]|$))")
        self._session = (re.compile(rf"[;?&](?:{session_params.pattern})(?=[=&;#/]|$)",
                                    re.IGNORECASE) if session_params is not None else None)

    @classmethod
    def from_settings(cls, settings, stats=None) -> "UrlCanonicalizer":
        """Read the settings once (ValueError for a bad ``URL_SESSION_PARAMS``)."""
        sessions = (session_matcher(setting(settings, "URL_SESSION_PARAMS"))
                    if setting(settings, "URL_STRIP_SESSION_IDS") else None)
        hosts = setting(settings, "URL_CREDENTIALS_HOSTS")
        return cls(hosts=setting(settings, "URL_CANONICAL_ENABLED"), session_params=sessions,
                   credential_hosts=hosts, stats=stats,
                   seal=seal_from_settings(settings) if hosts else None)

    def needs_work(self, url: str) -> bool:
        """False when *url* is canonical for sure (a cheap test: most are)."""
        return (self._authority.match(url) is not None
                or self._session is not None and self._session.search(url) is not None)

    def canonical(self, request) -> Canonical:
        """What :func:`canonicalize` makes of *request*'s URL under these
        settings (nothing counted, nothing logged)."""
        if not self.needs_work(request.url):
            return Canonical(request.url, ())
        return self._canonical(request)

    def _canonical(self, request) -> Canonical:
        verbatim = bool(request.meta.get("verbatim_url"))
        return canonicalize(request.url, None if verbatim else self.session_params,
                            hosts=self.hosts and not verbatim)

    def request(self, request):
        """*request* with its canonical URL (the same object when nothing
        changes, else a copy made with ``replace``), counted (``urls/<kind>``)."""
        url = request.url
        if self.needs_work(url):
            result = self._canonical(request)
            if result.url != url:
                for kind in result.changes:
                    if self.stats is not None:
                        self.stats.inc_value(f"urls/{kind}")
                token = (self._credentials(result, request) if result.userinfo is not None
                         else None)
                if token is not None:
                    request = request.replace(url=result.url,
                                              meta={**request.meta, CREDENTIALS_META: token})
                else:
                    request = request.replace(url=result.url)
        if self.credential_hosts and CREDENTIALS_META in request.meta:
            request = self._unsent(request)
        return request

    def _unsent(self, request):
        # The Authorization header UrlCredentialsMiddleware made of the sealed
        # credentials (a retry's, a redirect's copy): never stored, made again.
        if b"Authorization" in request.headers:
            request = request.replace(headers=request.headers.copy())
            del request.headers[b"Authorization"]
        return request

    def _credentials(self, result: Canonical, request) -> str | None:
        """The sealed credentials *request* keeps for a host allowed them
        (unless it has an ``Authorization`` header of its own), else None:
        they are dropped, said once a host (never themselves)."""
        host = canonical_host(urlsplit(result.url).hostname or "")
        allowed = host in self.credential_hosts
        if allowed and self.seal is not None:
            if b"Authorization" in request.headers:
                return None   # its own header wins, as with HttpAuthMiddleware
            if self.stats is not None:
                self.stats.inc_value("urls/credentials_sealed")
            return self.seal.seal(host, result.userinfo)
        if host not in self._logged and len(self._logged) < _LOGGED_HOSTS_MAX:
            self._logged.add(host)
            if allowed:
                logger.warning("Credentials removed from the URLs of %s: URL_CREDENTIALS_HOSTS "
                               "lists it, but without FRONTIER_SECRET they could only be "
                               "stored in clear (counted in urls/credentials)", host)
            else:
                logger.warning("Credentials removed from the URLs of %s (counted in "
                               "urls/credentials; list the host in URL_CREDENTIALS_HOSTS to "
                               "send them as an Authorization header)", host or "(no host)")
        return None


def canonicalizer_for(crawler) -> UrlCanonicalizer:
    """The crawl's one :class:`UrlCanonicalizer` (built at the first call:
    the scheduler, the seed reader and the dupefilter share its stats and its
    once-per-host log)."""
    found = getattr(crawler, "_crawlproject_urls", None)
    if found is None:
        found = UrlCanonicalizer.from_settings(crawler.settings, getattr(crawler, "stats", None))
        crawler._crawlproject_urls = found
    return found
