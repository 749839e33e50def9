"""A local TLS server that records what a client shows on the wire, for tests.

:class:`FingerprintServer` listens on 127.0.0.x with a self-signed certificate
made at start (``cryptography``), peeks at each connection's TLS ClientHello on
the raw socket (``MSG_PEEK``) before the handshake, and computes its JA3 and
JA4 with the parser below; then it completes the handshake with Python's
``ssl`` and serves HTTP/2 (when ALPN picks ``h2``) or HTTP/1.1. For HTTP/2 it
records the client's SETTINGS, WINDOW_UPDATE and PRIORITY frames and each
request's pseudo-header and header order (decoded with the small HPACK decoder
below): the "Akamai" HTTP/2 fingerprint.

Everything is written from the specifications (TLS 1.3: RFC 8446 §4.1.2 and
§4.2; JA3: salesforce/ja3 README; JA4: FoxIO's JA4 technical details; HTTP/2:
RFC 9113 §4-6; HPACK: RFC 7541), to check the client, not to trust it.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import socket
import ssl
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

# --------------------------------------------------------------------------- ClientHello

EXT_SNI, EXT_GROUPS, EXT_POINT_FORMATS = 0x0000, 0x000a, 0x000b
EXT_SIG_ALGS, EXT_ALPN = 0x000d, 0x0010
EXT_SUPPORTED_VERSIONS = 0x002b
#: pre_shared_key and early_data: present only when the client resumes a TLS session
EXT_RESUMPTION = (0x0029, 0x002a)
_JA4_VERSIONS = {0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3",
                 0x0002: "s2", 0xfeff: "d1", 0xfefd: "d2", 0xfefc: "d3"}


def is_grease(value: int) -> bool:
    """RFC 8701 GREASE values: 0x0a0a, 0x1a1a ... 0xfafa."""
    return (value & 0x0f0f) == 0x0a0a and (value >> 8) == (value & 0xff)


@dataclass(frozen=True)
class ClientHello:
    """The fields of a TLS ClientHello that fingerprints are made of (GREASE kept)."""

    record_version: int
    version: int                                   # legacy_version of the handshake
    ciphers: tuple[int, ...]
    extensions: tuple[int, ...]                    # in the order sent
    server_name: str | None = None
    alpn: tuple[bytes, ...] = ()
    groups: tuple[int, ...] = ()
    point_formats: tuple[int, ...] = ()
    signature_algorithms: tuple[int, ...] = ()
    supported_versions: tuple[int, ...] = ()

    # JA3: SSLVersion,Ciphers,Extensions,EllipticCurves,EllipticCurvePointFormats
    # (decimal, dash-joined, GREASE out); JA3N sorts the extensions (Chrome
    # permutes them on every connection since version 110).
    def ja3_text(self, sort_extensions: bool = False) -> str:
        extensions = _no_grease(self.extensions)
        if sort_extensions:
            extensions = sorted(extensions)
        return ",".join([str(self.version), _dec(_no_grease(self.ciphers)), _dec(extensions),
                         _dec(_no_grease(self.groups)), _dec(self.point_formats)])

    @property
    def resumed(self) -> bool:
        return any(e in self.extensions for e in EXT_RESUMPTION)

    def fresh(self) -> "ClientHello":
        """This hello as the client sends it without a session to resume (a
        browser's second connection to a site resumes: one more extension)."""
        return replace(self, extensions=tuple(e for e in self.extensions
                                              if e not in EXT_RESUMPTION))

    @property
    def ja3(self) -> str:
        return hashlib.md5(self.ja3_text().encode()).hexdigest()

    @property
    def ja3n(self) -> str:
        return hashlib.md5(self.ja3_text(sort_extensions=True).encode()).hexdigest()

    def ja4_parts(self, original: bool = False) -> tuple[str, str, str, str]:
        """(a, ciphers, extensions, signature algorithms) of JA4 (raw: JA4_r /
        JA4_ro); *original* keeps the order sent and SNI/ALPN (the "o" variant)."""
        versions = _no_grease(self.supported_versions)
        version = _JA4_VERSIONS.get(max(versions) if versions else self.version, "00")
        ciphers = _no_grease(self.ciphers)
        extensions = _no_grease(self.extensions)
        a = (f"t{version}{'d' if EXT_SNI in extensions else 'i'}{min(len(ciphers), 99):02d}"
             f"{min(len(extensions), 99):02d}{_alpn_chars(self.alpn)}")
        if not original:
            ciphers = sorted(ciphers)
            extensions = sorted(e for e in extensions if e not in (EXT_SNI, EXT_ALPN))
        return (a, _hex(ciphers), _hex(extensions), _hex(self.signature_algorithms))

    def ja4_raw(self, original: bool = False) -> str:
        a, ciphers, extensions, sigs = self.ja4_parts(original)
        return f"{a}_{ciphers}_{extensions}_{sigs}" if sigs else f"{a}_{ciphers}_{extensions}"

    def ja4_hashed(self, original: bool = False) -> str:
        a, ciphers, extensions, sigs = self.ja4_parts(original)
        return f"{a}_{ja4_hash(ciphers)}_{ja4_hash(extensions, sigs)}"

    @property
    def ja4(self) -> str:
        return self.ja4_hashed()

    @property
    def ja4_o(self) -> str:
        return self.ja4_hashed(original=True)


def ja4_hash(values: str, signature_algorithms: str = "") -> str:
    """sha256 of a comma list (with ``_`` and the signature algorithms, if any), 12 hex
    characters; twelve zeros for an empty list."""
    if not values:
        return "0" * 12
    text = f"{values}_{signature_algorithms}" if signature_algorithms else values
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _no_grease(values) -> list[int]:
    return [v for v in values if not is_grease(v)]


def _dec(values) -> str:
    return "-".join(str(v) for v in values)


def _hex(values) -> str:
    return ",".join(f"{v:04x}" for v in values)


def _alpn_chars(alpn: tuple[bytes, ...]) -> str:
    if not alpn or not alpn[0]:
        return "00"
    first = alpn[0]
    if chr(first[0]).isalnum() and chr(first[-1]).isalnum() and first[0] < 128 and first[-1] < 128:
        return chr(first[0]) + chr(first[-1])
    text = first.hex()
    return text[0] + text[-1]


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated ClientHello")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("!H", self.take(2))[0]

    def u24(self) -> int:
        return int.from_bytes(self.take(3), "big")

    def vector(self, length_bytes: int) -> "_Reader":
        n = {1: self.u8, 2: self.u16, 3: self.u24}[length_bytes]()
        return _Reader(self.take(n))

    def u16_list(self) -> tuple[int, ...]:
        return tuple(struct.unpack(f"!{len(self.data) // 2}H", self.data[:len(self.data) // 2 * 2]))

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def client_hello_length(data: bytes) -> int | None:
    """How many bytes of TLS records hold the whole ClientHello starting *data*
    (None until the handshake header is in; raises ValueError if not TLS)."""
    if len(data) < 5:
        return None
    if data[0] != 22 or data[1] != 3:
        raise ValueError("not a TLS handshake record")
    body, pos = b"", 0
    while pos + 5 <= len(data):
        length = struct.unpack("!H", data[pos + 3:pos + 5])[0]
        body += data[pos + 5:pos + 5 + length]
        pos += 5 + length
        if len(body) >= 4:
            need = 4 + int.from_bytes(body[1:4], "big")
            if len(body) >= need:
                return pos
    return None


def parse_client_hello(data: bytes) -> ClientHello:
    """Parse the TLS records *data* begins with (RFC 8446 §4.1.2)."""
    if client_hello_length(data) is None:
        raise ValueError("incomplete ClientHello")
    record_version = struct.unpack("!H", data[1:3])[0]
    body, pos = b"", 0
    while pos + 5 <= len(data) and data[pos] == 22:
        length = struct.unpack("!H", data[pos + 3:pos + 5])[0]
        body += data[pos + 5:pos + 5 + length]
        pos += 5 + length
    r = _Reader(body)
    if r.u8() != 1:
        raise ValueError("not a ClientHello")
    hello = r.vector(3)
    version = hello.u16()
    hello.take(32)                      # random
    hello.vector(1)                     # legacy_session_id
    ciphers = hello.vector(2).u16_list()
    hello.vector(1)                     # legacy_compression_methods
    fields: dict = {"extensions": []}
    if hello.left:
        extensions = hello.vector(2)
        while extensions.left:
            kind = extensions.u16()
            payload = extensions.vector(2)
            fields["extensions"].append(kind)
            _extension(kind, payload, fields)
    return ClientHello(record_version, version, ciphers, tuple(fields.pop("extensions")),
                       **fields)


def _extension(kind: int, payload: _Reader, fields: dict) -> None:
    if kind == EXT_SNI:
        names = payload.vector(2)
        while names.left:
            name_type, name = names.u8(), names.vector(2).data
            if name_type == 0:
                fields["server_name"] = name.decode("ascii", "replace")
    elif kind == EXT_ALPN:
        protocols, out = payload.vector(2), []
        while protocols.left:
            out.append(protocols.vector(1).data)
        fields["alpn"] = tuple(out)
    elif kind == EXT_GROUPS:
        fields["groups"] = payload.vector(2).u16_list()
    elif kind == EXT_POINT_FORMATS:
        fields["point_formats"] = tuple(payload.vector(1).data)
    elif kind == EXT_SIG_ALGS:
        fields["signature_algorithms"] = payload.vector(2).u16_list()
    elif kind == EXT_SUPPORTED_VERSIONS:
        fields["supported_versions"] = payload.vector(1).u16_list()


# --------------------------------------------------------------------------- HPACK

# RFC 7541 Appendix A.
STATIC_TABLE = [
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
    (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
    (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
    (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
    ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
    ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
    ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
    ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
    ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
    ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
    ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
]

# RFC 7541 Appendix B is a canonical Huffman code: the codes follow from the
# code lengths, symbols of one length in increasing order. Every printable
# ASCII character has a code of at most 19 bits; bytes with longer codes
# (controls, 0x80-0xff) never appear in the headers of the clients tested here
# and are refused.
_HUFFMAN_LENGTHS = {
    5: "012aceiost",
    6: " %-./3456789=A_bdfghlmnpru",
    7: ":BCDEFGHIJKLMNOPQRSTUVWYjkqvwxyz",
    8: "&*,;XZ",
    10: "!\"()?",
    11: "'+|",
    12: "#>",
    13: "\x00$@[]~",
    14: "^}",
    15: "<`{",
    19: "\\\xc3\xd0",
}


def _huffman_table() -> dict[tuple[int, int], int]:
    table, code, previous = {}, 0, None
    for length in sorted(_HUFFMAN_LENGTHS):
        if previous is not None:
            code <<= length - previous
        for char in _HUFFMAN_LENGTHS[length]:
            table[(length, code)] = ord(char)
            code += 1
        previous = length
    return table


_HUFFMAN = _huffman_table()


def huffman_decode(data: bytes) -> bytes:
    out, code, length = bytearray(), 0, 0
    for byte in data:
        for shift in range(7, -1, -1):
            code, length = (code << 1) | ((byte >> shift) & 1), length + 1
            symbol = _HUFFMAN.get((length, code))
            if symbol is not None:
                out.append(symbol)
                code, length = 0, 0
            elif length > 30:
                raise ValueError("Huffman code outside printable ASCII")
    if length > 7 or code != (1 << length) - 1:
        raise ValueError("bad Huffman padding")
    return bytes(out)


class HpackDecoder:
    """RFC 7541 decoding with a dynamic table (one per connection)."""

    def __init__(self, max_size: int = 4096):
        self.dynamic: list[tuple[str, str]] = []
        self.max_size = max_size

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        headers, pos = [], 0
        while pos < len(block):
            byte = block[pos]
            if byte & 0x80:                          # indexed field
                index, pos = _integer(block, pos, 7)
                headers.append(self._entry(index))
            elif byte & 0x40:                        # literal, incremental indexing
                name, value, pos = self._literal(block, pos, 6)
                headers.append((name, value))
                self._add(name, value)
            elif byte & 0x20:                        # dynamic table size update
                self.max_size, pos = _integer(block, pos, 5)
                self._evict()
            else:                                    # literal, not indexed / never indexed
                name, value, pos = self._literal(block, pos, 4)
                headers.append((name, value))
        return headers

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[str, str, int]:
        index, pos = _integer(block, pos, prefix)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return name, value, pos

    def _entry(self, index: int) -> tuple[str, str]:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        return self.dynamic[index - len(STATIC_TABLE) - 1]

    def _add(self, name: str, value: str) -> None:
        self.dynamic.insert(0, (name, value))
        self._evict()

    def _evict(self) -> None:
        while self.dynamic and sum(32 + len(n) + len(v) for n, v in self.dynamic) > self.max_size:
            self.dynamic.pop()


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7f) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _string(block: bytes, pos: int) -> tuple[str, int]:
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 7)
    raw = block[pos:pos + length]
    return (huffman_decode(raw) if huffman else raw).decode("latin-1"), pos + length


def encode_integer(value: int, prefix: int, first: int = 0) -> bytes:
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes([first | value])
    out, value = bytearray([first | mask]), value - mask
    while value >= 128:
        out.append((value & 0x7f) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    """Literals without indexing, no Huffman (what a test server needs to answer)."""
    names = {name: i + 1 for i, (name, _) in reversed(list(enumerate(STATIC_TABLE)))}
    out = bytearray()
    for name, value in headers:
        raw = value.encode("latin-1")
        if name in names:
            out += encode_integer(names[name], 4)
        else:
            out += b"\x00" + encode_integer(len(name), 7) + name.encode("latin-1")
        out += encode_integer(len(raw), 7) + raw
    return bytes(out)


# --------------------------------------------------------------------------- records


@dataclass
class Connection:
    """One TCP connection: its ClientHello and, with HTTP/2, its connection frames."""

    id: int
    hello: ClientHello | None = None
    alpn: str | None = None                               # what the server selected
    error: str | None = None
    settings: list[tuple[int, int]] = field(default_factory=list)
    window_update: int | None = None
    priorities: list[str] = field(default_factory=list)   # PRIORITY frames, as Akamai writes them
    frames: list[int] = field(default_factory=list)       # frame types, in order (first 50)

    def akamai(self, pseudo_order: str) -> str:
        """The HTTP/2 fingerprint: SETTINGS|WINDOW_UPDATE|PRIORITY|pseudo-header order."""
        settings = ";".join(f"{k}:{v}" for k, v in self.settings)
        return (f"{settings}|{self.window_update or '00'}|"
                f"{','.join(self.priorities) or '0'}|{pseudo_order}")


@dataclass
class Seen:
    """One request as the server received it."""

    connection: Connection
    protocol: str                           # "HTTP/2" or "HTTP/1.1"
    method: str
    path: str
    headers: list[tuple[str, str]]          # regular headers in the order sent (h2: lower case)
    pseudo: list[str] = field(default_factory=list)      # h2 pseudo-headers in order
    stream_priority: str = ""               # the HEADERS frame's priority (exclusive:dep:weight)
    body: bytes = b""

    @property
    def pseudo_order(self) -> str:
        return ",".join(p[1] for p in self.pseudo)

    @property
    def akamai(self) -> str | None:
        return self.connection.akamai(self.pseudo_order) if self.protocol == "HTTP/2" else None

    @property
    def header_names(self) -> list[str]:
        return [name.lower() for name, _ in self.headers]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def fingerprint(self) -> dict:
        """What a bot defence compares: JA4 (stable under extension permutation) and
        JA3N of the hello as a fresh handshake shows it, the HTTP/2 fingerprint, the
        header order."""
        hello = self.connection.hello.fresh() if self.connection.hello else None
        return {"ja4": hello.ja4 if hello else None, "ja3n": hello.ja3n if hello else None,
                "akamai": self.akamai, "protocol": self.protocol,
                "header_order": tuple(self.header_names)}


Route = Callable[[Seen], tuple[int, list[tuple[str, str]], bytes]]


def default_route(seen: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
    return 200, [("content-type", "text/html; charset=utf-8")], b"<html><body>ok</body></html>"


# --------------------------------------------------------------------------- server


def make_certificate(directory: Path, hosts: tuple[str, ...] = ("localhost",),
                     ips: tuple[str, ...] = ("127.0.0.1",)) -> tuple[Path, Path]:
    """A self-signed EC certificate for *hosts* and *ips*: (cert, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else ips[0])])
    now = datetime.datetime.now(datetime.timezone.utc)
    alt = [x509.DNSName(h) for h in hosts] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class FingerprintServer:
    """HTTPS on *host* (port 0: a free one) that records every ClientHello and request.

    *alpn*: what the server offers (``("http/1.1",)`` for a site without HTTP/2);
    *tls_fail*: answer every ClientHello (or those for which it returns True, if a
    callable) with plain text instead of a ServerHello (a TLS error for the client);
    *route*: ``Seen -> (status, headers, body)``; *latency*: seconds per answer.
    """

    def __init__(self, host: str = "127.0.0.1", alpn: tuple[str, ...] = ("h2", "http/1.1"),
                 route: Route = default_route, tls_fail=False, latency: float = 0.0):
        self.host, self.alpn, self.route = host, alpn, route
        self.tls_fail, self.latency = tls_fail, latency
        self.connections: list[Connection] = []
        self.requests: list[Seen] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="tlsfp-")
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def __enter__(self) -> "FingerprintServer":
        cert, key = make_certificate(Path(self._tmp.name), ips=(self.host,))
        self.cert_path = cert
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.context.set_alpn_protocols(list(self.alpn))
        self._sock = socket.create_server((self.host, 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        accept = threading.Thread(target=self._accept, daemon=True, name="tlsfp-accept")
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._sock.close()
        self._tmp.cleanup()

    # ---- queries

    def seen(self, path: str | None = None) -> list[Seen]:
        with self._cond:
            return [s for s in self.requests if path is None or s.path == path]

    def wait_for(self, predicate, timeout: float = 30) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    # ---- serving

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _serve(self, raw: socket.socket) -> None:
        with self._cond:
            record = Connection(len(self.connections) + 1)
            self.connections.append(record)
        try:
            raw.settimeout(10)
            data = self._peek_hello(raw)
            record.hello = parse_client_hello(data)
            if self.tls_fail is True or (callable(self.tls_fail) and self.tls_fail(record.hello)):
                raw.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            sock = self.context.wrap_socket(raw, server_side=True)
            record.alpn = sock.selected_alpn_protocol()
            sock.settimeout(1.0)
            if record.alpn == "h2":
                _H2(self, sock, record).serve()
            else:
                self._serve_http1(sock, record)
        except Exception as exc:  # recorded for the test to look at, never raised in a thread
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self._cond:
                self._cond.notify_all()
            try:
                raw.close()
            except OSError:
                pass

    def _peek_hello(self, raw: socket.socket) -> bytes:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self._stop.is_set():
            data = raw.recv(65536, socket.MSG_PEEK)
            if not data:
                raise ConnectionError("closed before a ClientHello")
            size = client_hello_length(data)
            if size is not None:
                return data[:size]
            time.sleep(0.005)   # the rest of the ClientHello is still on its way
        raise TimeoutError("no complete ClientHello")

    def _record(self, seen: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        with self._cond:
            self.requests.append(seen)
            self._cond.notify_all()
        if self.latency:
            time.sleep(self.latency)
        return self.route(seen)

    def _serve_http1(self, sock, record: Connection) -> None:
        buffer = b""
        while not self._stop.is_set():
            while b"\r\n\r\n" not in buffer:
                chunk = self._recv(sock)
                if chunk is None:
                    continue
                if not chunk:
                    return
                buffer += chunk
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = [(k.strip(), v.strip()) for k, _, v in (l.partition(":") for l in lines[1:])]
            length = int(next((v for k, v in headers if k.lower() == "content-length"), "0"))
            while len(buffer) < length:
                chunk = self._recv(sock)
                if chunk == b"":
                    return
                buffer += chunk or b""
            body, buffer = buffer[:length], buffer[length:]
            status, out_headers, payload = self._record(
                Seen(record, "HTTP/1.1", method, path, headers, body=body))
            head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(payload)}"]
            head += [f"{k}: {v}" for k, v in out_headers]
            sock.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + payload)

    def _recv(self, sock) -> bytes | None:
        """Bytes, b"" at EOF, None on a read timeout (to look at the stop flag)."""
        try:
            return sock.recv(65536)
        except (socket.timeout, TimeoutError):
            return None if not self._stop.is_set() else b""
        except (ConnectionError, ssl.SSLError, OSError):
            return b""


# HTTP/2 frame types (RFC 9113 §6) and flags
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class _H2:
    """The server side of one HTTP/2 connection, just enough to answer GETs and POSTs."""

    def __init__(self, server: FingerprintServer, sock, record: Connection):
        self.server, self.sock, self.record = server, sock, record
        self.buffer = b""
        self.decoder = HpackDecoder()
        self.streams: dict[int, dict] = {}

    def serve(self) -> None:
        if self._read(len(PREFACE)) != PREFACE:
            raise ValueError("no HTTP/2 preface")
        self._send(SETTINGS, 0, 0, b"")
        while True:
            header = self._read(9)
            if header is None:
                return
            length = int.from_bytes(header[:3], "big")
            kind, flags = header[3], header[4]
            stream = struct.unpack("!I", header[5:9])[0] & 0x7fffffff
            payload = self._read(length) if length else b""
            if payload is None:
                return
            if len(self.record.frames) < 50:
                self.record.frames.append(kind)
            if self._frame(kind, flags, stream, payload) is False:
                return

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes):
        if kind == SETTINGS and not flags & ACK:
            if not self.record.settings:
                self.record.settings = [struct.unpack("!HI", payload[i:i + 6])
                                        for i in range(0, len(payload), 6)]
            self._send(SETTINGS, ACK, 0, b"")
        elif kind == WINDOW_UPDATE and stream == 0 and self.record.window_update is None:
            self.record.window_update = struct.unpack("!I", payload)[0] & 0x7fffffff
        elif kind == PRIORITY:
            dep = struct.unpack("!I", payload[:4])[0]
            self.record.priorities.append(
                f"{stream}:{dep >> 31}:{dep & 0x7fffffff}:{payload[4] + 1}")
        elif kind == PING and not flags & ACK:
            self._send(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            return False
        elif kind in (HEADERS, CONTINUATION):
            self._headers(kind, flags, stream, payload)
        elif kind == DATA:
            state = self.streams.setdefault(stream, {"block": b"", "body": b""})
            state["body"] += _unpad(flags, payload)
            if payload:
                increment = struct.pack("!I", len(payload))
                self._send(WINDOW_UPDATE, 0, 0, increment)
                self._send(WINDOW_UPDATE, 0, stream, increment)
            if flags & END_STREAM:
                self._answer(stream)
        return None

    def _headers(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        state = self.streams.setdefault(stream, {"block": b"", "body": b""})
        if kind == HEADERS:
            payload = _unpad(flags, payload)
            if flags & PRIORITY_FLAG:
                dep = struct.unpack("!I", payload[:4])[0]
                state["priority"] = f"{dep >> 31}:{dep & 0x7fffffff}:{payload[4] + 1}"
                payload = payload[5:]
            state["end_stream"] = bool(flags & END_STREAM)
        state["block"] += payload
        if flags & END_HEADERS:
            state["headers"] = self.decoder.decode(state.pop("block"))
            state["block"] = b""
            if state.get("end_stream"):
                self._answer(stream)

    def _answer(self, stream: int) -> None:
        state = self.streams.pop(stream)
        fields = state.get("headers", [])
        pseudo = [(k, v) for k, v in fields if k.startswith(":")]
        regular = [(k, v) for k, v in fields if not k.startswith(":")]
        values = dict(pseudo)
        seen = Seen(self.record, "HTTP/2", values.get(":method", ""), values.get(":path", ""),
                    regular, [k for k, _ in pseudo], state.get("priority", ""), state["body"])
        status, headers, body = self.server._record(seen)
        block = encode_headers([(":status", str(status)),
                                ("content-length", str(len(body)))] + headers)
        self._send(HEADERS, END_HEADERS | (0 if body else END_STREAM), stream, block)
        for start in range(0, len(body), 16384):
            last = start + 16384 >= len(body)
            self._send(DATA, END_STREAM if last else 0, stream, body[start:start + 16384])

    def _send(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        self.sock.sendall(len(payload).to_bytes(3, "big") + bytes([kind, flags])
                          + struct.pack("!I", stream) + payload)

    def _read(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            chunk = self.server._recv(self.sock)
            if chunk is None:
                continue
            if not chunk:
                return None
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data


def _unpad(flags: int, payload: bytes) -> bytes:
    if flags & PADDED:
        pad = payload[0]
        return payload[1:len(payload) - pad]
    return payload
