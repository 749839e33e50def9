"""The fingerprint server's parsers (tests/tls_fingerprint.py), checked against values
computed by others: FoxIO's JA4 specification example, a ClientHello a public fingerprint
service reported for Chrome 143 (JA3, JA3N, JA4, JA4_o, JA4_r), RFC 7541's Huffman examples;
then against real clients whose wire format we set ourselves (Python's ssl, curl_cffi told
an exact JA3 and HTTP/2 fingerprint)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import struct

import pytest

from tests.tls_fingerprint import (FingerprintServer, HpackDecoder, encode_headers,
                                   huffman_decode, is_grease, parse_client_hello)

GREASE_A, GREASE_B = 0x3a3a, 0xdada


def _vec(length_bytes: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def _u16s(values) -> bytes:
    return b"".join(struct.pack("!H", v) for v in values)


def build_hello(ciphers, extensions, *, sni="tls.example.org", groups=(29, 23, 24),
                sigs=(0x0403, 0x0804, 0x0401), alpn=(b"h2", b"http/1.1"),
                versions=(GREASE_A, 0x0304, 0x0303), split: int | None = None) -> bytes:
    """A ClientHello with *extensions* (types) in this order; known ones get a real body."""
    bodies = {
        0x0000: _vec(2, b"\x00" + _vec(2, sni.encode())) if sni else b"",
        0x000a: _vec(2, _u16s(groups)),
        0x000b: _vec(1, b"\x00"),
        0x000d: _vec(2, _u16s(sigs)),
        0x0010: _vec(2, b"".join(_vec(1, p) for p in alpn)),
        0x002b: _vec(1, _u16s(versions)),
        0x0033: _vec(2, _u16s([29]) + _vec(2, b"\x11" * 32)),
    }
    ext = b"".join(struct.pack("!H", e) + _vec(2, bodies.get(e, b"")) for e in extensions)
    hello = (b"\x03\x03" + b"\x42" * 32 + _vec(1, b"\x07" * 32) + _vec(2, _u16s(ciphers))
             + _vec(1, b"\x00") + _vec(2, ext))
    handshake = b"\x01" + _vec(3, hello)
    if split is None:
        return b"\x16\x03\x01" + _vec(2, handshake)
    return (b"\x16\x03\x01" + _vec(2, handshake[:split])
            + b"\x16\x03\x01" + _vec(2, handshake[split:]))


# Chrome 143 as a public TLS fingerprint service reported it (ciphers and extensions in the
# order sent; GREASE added where Chrome puts it).
CHROME143_CIPHERS = [GREASE_A, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9,
                     0xcca8, 0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035]
CHROME143_EXTENSIONS = [GREASE_A, 0x002d, 0x0033, 0x0010, 0xfe0d, 0x0017, 0x44cd, 0x0000, 0x000b,
                        0x000a, 0x002b, 0xff01, 0x0023, 0x0012, 0x0005, 0x000d, 0x001b, GREASE_B]
CHROME143_SIGS = (0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601)


def chrome143(**kwargs) -> bytes:
    return build_hello(CHROME143_CIPHERS, CHROME143_EXTENSIONS, sigs=CHROME143_SIGS,
                       groups=(GREASE_B, 4588, 29, 23, 24), **kwargs)


def test_grease_values():
    assert all(is_grease(v) for v in (0x0a0a, 0x1a1a, 0x3a3a, 0xaaaa, 0xfafa))
    assert not any(is_grease(v) for v in (0x0a1a, 0x1301, 0x000a, 0xabab))


def test_chrome143_hello_gives_the_published_fingerprints():
    hello = parse_client_hello(chrome143())
    assert hello.server_name == "tls.example.org"
    assert hello.alpn == (b"h2", b"http/1.1")
    assert hello.ja3_text() == (
        "771,4865-4866-4867-49195-49199-49196-49200-52393-52392-49171-49172-156-157-47-53,"
        "45-51-16-65037-23-17613-0-11-10-43-65281-35-18-5-13-27,4588-29-23-24,0")
    assert hello.ja3 == "98487aa16281980e7d1120d399efb6a4"
    assert hello.ja3n == "8e19337e7524d2573be54efb2b0784c9"
    assert hello.ja4 == "t13d1516h2_8daaf6152771_d8a2da3f94cd"
    assert hello.ja4_o == "t13d1516h2_acb858a92679_f96a17c57971"
    assert hello.ja4_raw() == (
        "t13d1516h2_002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,"
        "cca9_0005,000a,000b,000d,0012,0017,001b,0023,002b,002d,0033,44cd,fe0d,ff01_0403,"
        "0804,0401,0503,0805,0501,0806,0601")


def test_extension_order_changes_ja3_and_ja4_o_not_ja3n_or_ja4():
    permuted = [CHROME143_EXTENSIONS[0], *reversed(CHROME143_EXTENSIONS[1:-1]),
                CHROME143_EXTENSIONS[-1]]
    a = parse_client_hello(chrome143())
    b = parse_client_hello(build_hello(CHROME143_CIPHERS, permuted, sigs=CHROME143_SIGS,
                                       groups=(GREASE_B, 4588, 29, 23, 24)))
    assert (a.ja4, a.ja3n) == (b.ja4, b.ja3n)
    assert a.ja3 != b.ja3 and a.ja4_o != b.ja4_o


def test_ja4_specification_example():
    # FoxIO's JA4 technical details: the worked example and its "o" variant.
    hello = parse_client_hello(build_hello(
        [GREASE_A, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8,
         0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035],
        [0x001b, 0x0000, 0x0033, 0x0010, 0x4469, 0x0017, 0x002d, 0x000d, 0x0005, 0x0023,
         0x0012, 0x002b, 0xff01, 0x000b, 0x000a, 0x0015],
        sigs=(0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601)))
    assert hello.ja4 == "t13d1516h2_8daaf6152771_e5627efa2ab1"
    assert hello.ja4_o == "t13d1516h2_acb858a92679_18f69afefd3d"


def test_ja4_edge_cases():
    # no SNI (an IP address), TLS 1.2 only, ALPN http/1.1, no signature algorithms
    hello = parse_client_hello(build_hello([0x002f], [0x0010, 0x000a], sni=None,
                                           alpn=(b"http/1.1",)))
    assert hello.ja4.startswith("t12i0102h1_")
    assert hello.ja4.endswith("_" + hashlib.sha256(b"000a").hexdigest()[:12])
    empty = parse_client_hello(build_hello([], [], sni=None))
    assert empty.ja4 == "t12i000000_000000000000_000000000000"


def test_a_hello_split_over_two_records_is_one_hello():
    assert parse_client_hello(chrome143(split=40)).ja4 == parse_client_hello(chrome143()).ja4


def test_truncated_or_foreign_bytes_are_refused():
    with pytest.raises(ValueError):
        parse_client_hello(chrome143()[:100])
    with pytest.raises(ValueError):
        parse_client_hello(b"GET / HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize("encoded, text", [
    # RFC 7541 Appendix C.4 and C.6
    ("f1e3c2e5f23a6ba0ab90f4ff", "www.example.com"),
    ("a8eb10649cbf", "no-cache"),
    ("25a849e95bb8e8b4bf", "custom-value"),
    ("d07abe941054d444a8200595040b8166e082a62d1bff", "Mon, 21 Oct 2013 20:13:21 GMT"),
    ("9d29ad171863c78f0b97c8e9ae82ae43d3", "https://www.example.com"),
    ("94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
     "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"),
])
def test_huffman_examples_of_rfc7541(encoded, text):
    assert huffman_decode(bytes.fromhex(encoded)).decode() == text


def test_hpack_request_examples_of_rfc7541_with_the_dynamic_table():
    # RFC 7541 C.4.1-C.4.3: three requests on one connection, Huffman-coded.
    decoder = HpackDecoder()
    first = decoder.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"))
    second = decoder.decode(bytes.fromhex("828684be5886a8eb10649cbf"))
    third = decoder.decode(bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"))
    assert first == [(":method", "GET"), (":scheme", "http"), (":path", "/"),
                     (":authority", "www.example.com")]
    assert second[-1] == ("cache-control", "no-cache")
    assert second[3] == (":authority", "www.example.com")
    assert third[-1] == ("custom-key", "custom-value")
    assert third[1] == (":scheme", "https")
    assert third[3] == (":authority", "www.example.com")   # index 63: the older entry


def test_the_encoder_answers_what_the_decoder_reads():
    headers = [(":status", "404"), ("content-type", "text/html"), ("x-long", "v" * 300)]
    assert HpackDecoder().decode(encode_headers(headers)) == headers


# ------------------------------------------------------------------ real clients


def test_python_ssl_client_is_seen_as_configured():
    with FingerprintServer(alpn=("http/1.1",)) as server:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384")
        ctx.set_alpn_protocols(["http/1.1"])
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            with ctx.wrap_socket(raw, server_hostname="fp.localhost") as sock:
                sock.sendall(b"GET /py HTTP/1.1\r\nHost: fp\r\nX-B: 1\r\nX-A: 2\r\n\r\n")
                assert sock.recv(100).startswith(b"HTTP/1.1 200")
        assert server.wait_for(lambda s: s.seen("/py"), 10)
        seen = server.seen("/py")[0]
        hello = seen.connection.hello
        expected = [c["id"] & 0xffff for c in ctx.get_ciphers() if c["protocol"] != "TLSv1.3"]
        assert [c for c in hello.ciphers if c != 0x00ff] == expected  # 0x00ff: renegotiation SCSV
        assert hello.server_name == "fp.localhost" and hello.alpn == (b"http/1.1",)
        assert hello.ja4.startswith(f"t12d{len(hello.ciphers):02d}")
        assert seen.protocol == "HTTP/1.1" and seen.header_names == ["host", "x-b", "x-a"]


@pytest.fixture
def curl_cffi():
    return pytest.importorskip("curl_cffi")


def test_curl_told_an_exact_ja3_and_http2_fingerprint_is_seen_with_them(curl_cffi):
    from curl_cffi.requests import AsyncSession

    # extensions curl_cffi can send from a bare JA3 string (no extra_fp needed)
    ja3 = ("771,4865-4866-4867-49195-49199-49196-49200-52393-52392-49171-49172-156-157-47-53,"
           "0-23-65281-10-11-35-16-13-51-45-43,29-23-24,0")
    akamai = "4:6291456;1:65536;3:1000|15663105|0|m,s,p,a"   # orders no client uses
    printable = "".join(chr(c) for c in range(33, 127)).replace(":", "")

    async def fetch(url):
        async with AsyncSession(verify=False) as session:
            return await session.get(url, ja3=ja3, akamai=akamai,
                                     headers={"X-Printable": printable})

    with FingerprintServer() as server:
        response = asyncio.run(fetch(f"https://localhost:{server.port}/exact"))
        assert response.status_code == 200
        seen = server.seen("/exact")[0]
    assert seen.connection.hello.ja3_text() == ja3
    assert seen.akamai == akamai
    assert seen.header("x-printable") == printable      # Huffman-decoded, every character


def test_a_tls_failing_server_records_the_hello_and_fails_the_client(curl_cffi):
    from curl_cffi.requests import AsyncSession
    from curl_cffi.requests.exceptions import RequestException

    async def fetch(url):
        async with AsyncSession(verify=False) as session:
            return await session.get(url, impersonate="chrome131", timeout=5)

    with FingerprintServer(tls_fail=True) as server:
        with pytest.raises(RequestException):
            asyncio.run(fetch(server.url + "/x"))
        assert server.wait_for(lambda s: s.connections and s.connections[0].hello, 5)
        assert server.connections[0].hello.alpn[0] == b"h2"
        assert not server.seen()


def test_a_resumed_hello_compares_as_its_fresh_one():
    resumed = parse_client_hello(build_hello(CHROME143_CIPHERS, CHROME143_EXTENSIONS + [0x0029],
                                             sigs=CHROME143_SIGS,
                                             groups=(GREASE_B, 4588, 29, 23, 24)))
    fresh = parse_client_hello(chrome143())
    assert resumed.resumed and not fresh.resumed
    assert resumed.ja4 != fresh.ja4 and resumed.fresh().ja4 == fresh.ja4
