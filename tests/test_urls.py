"""One canonical form of a URL and its host (crawlproject/urls.py): the function
table-driven and fuzzed; the scheduler, the politeness keys, robots.txt origins,
the dedupe and the seeds using it; one real crawl of a local site linked to under
many spellings, with credentials and session ids, that must be one site of
one page each, and whose password must be found nowhere."""

import base64
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from hypothesis import example, given, settings as hsettings, strategies as st
from scrapy import Request, Spider
from scrapy.utils.request import fingerprint
from scrapy.utils.test import get_crawler

from crawlproject import defaults
from crawlproject.frontier.sitelimits import host_key
from crawlproject.policy import InputPolicy
from crawlproject.robots.middleware import origin_of
from crawlproject.scheduler import RedisScheduler
from crawlproject.scheduling.sitepoliteness import SitePoliteness
from crawlproject.seeds import InvalidSeed, invalid_record, request_from_seed
from crawlproject.urls import (UrlCanonicalizer, canonical_host, canonicalize,
                               is_loopback_host, origin, redact_userinfo, session_matcher,
                               strip_userinfo)
from tests.crawl_helpers import Node, node_env

SESSIONS = session_matcher(defaults.URL_SESSION_PARAMS)
URLS = UrlCanonicalizer(session_params=SESSIONS)


def canon(url):
    return canonicalize(url, SESSIONS).url


@pytest.mark.parametrize("url, expected, changes", [
    ("http://example.com/a?b=1", "http://example.com/a?b=1", ()),
    ("http://127.0.0.5./", "http://127.0.0.5/", ("host",)),
    ("http://127.0.0.5..:80/", "http://127.0.0.5/", ("host", "port")),
    ("http://EXAMPLE.com:80/A", "http://example.com/A", ("host", "port")),   # path keeps case
    ("https://example.com:443/", "https://example.com/", ("port",)),
    ("https://example.com:80/", "https://example.com:80/", ()),             # not https' default
    ("http://example.com:8080/", "http://example.com:8080/", ()),
    ("http://example.com:/", "http://example.com/", ("port",)),
    ("http://example.com:0080/", "http://example.com/", ("port",)),
    ("http://[::0:1]:80/x", "http://[::1]/x", ("host", "port")),
    ("http://[2001:DB8::1]:8080/", "http://[2001:db8::1]:8080/", ("host",)),
    ("http://bücher.DE./", "http://xn--bcher-kva.de/", ("host",)),
    ("http://127.1/", "http://127.0.0.1/", ("host",)),
    ("http://0x7F.0.0.1.:80/", "http://127.0.0.1/", ("host", "port")),
    ("http://2130706433/", "http://127.0.0.1/", ("host",)),
    ("http://0177.0.0.01/", "http://127.0.0.1/", ("host",)),
    ("http://127.0.0.256/", "http://127.0.0.256/", ()),
    ("http://cafe.bad/", "http://cafe.bad/", ()),
    ("http://user:pw@example.com/", "http://example.com/", ("credentials",)),
    ("http://user@example.com/", "http://example.com/", ("credentials",)),
    ("http://@example.com/", "http://example.com/", ()),
    ("http://u:p@HOST.:80/a;jsessionid=1?x=1&PHPSESSID=2&y=3#f", "http://host/a?x=1&y=3#f",
     ("credentials", "host", "port", "session_id_path", "session_id_query")),
    ("http://h/a;JSESSIONID=AB12;v=2/b", "http://h/a;v=2/b", ("session_id_path",)),
    ("http://h/a;jsessionid=1;phpsessid=2", "http://h/a", ("session_id_path",)),
    ("http://h/a?sid=0123456789abcdef0", "http://h/a", ("session_id_query",)),
    ("http://h/a?sid=12", "http://h/a?sid=12", ()),   # a short sid names a page: kept
    ("http://h/a?b=2&sid=0123456789abcdef0&a=1", "http://h/a?b=2&a=1", ("session_id_query",)),  # order kept
    ("http://h/a?ASPSESSIONIDQQGGQGPG=x&q=%20", "http://h/a?q=%20", ("session_id_query",)),
    ("http://h/a?CFID=1&CFTOKEN=2", "http://h/a", ("session_id_query",)),
    ("http://h/a?side=1&sids=2&mysid=3", "http://h/a?side=1&sids=2&mysid=3", ()),  # whole names
    ("http://h/a?x=jsessionid", "http://h/a?x=jsessionid", ()),
    ("http://h/?", "http://h/?", ()),
    ("ftp://u:p@h:21/", "ftp://h:21/", ("credentials",)),                  # only credentials
    ("http://h:99999999/", "http://h:99999999/", ()),                       # no port: left
])
def test_canonical_form(url, expected, changes):
    result = canonicalize(url, SESSIONS)
    assert (result.url, result.changes) == (expected, changes)
    assert canonicalize(result.url, SESSIONS).changes == ()                 # idempotent
    # the scheduler's cheap "nothing to do" never skips a URL that has something
    assert URLS.needs_work(url) or not changes


def test_hosts_keys_and_origins_of_one_server_are_one():
    variants = ["127.0.0.5", "127.0.0.5.", "127.0.0.5..", " 127.0.0.5 "]
    assert {canonical_host(h) for h in variants} == {"127.0.0.5"}
    assert {host_key(h) for h in ["127.0.0.5.", "http://127.0.0.5.:80/", "127.0.0.5:81",
                                  "HTTP://U:P@127.0.0.5./x"]} == {"127.0.0.5"}
    assert host_key("bücher.de.") == "xn--bcher-kva.de" and host_key("[::0:1]") == "::1"
    urls = ["http://127.0.0.5/", "http://127.0.0.5.:80/a", "http://U:P@127.0.0.5./",
            "HTTP://127.0.0.5:80/robots.txt"]
    assert {origin_of(Request(u)) for u in urls} == {"http://127.0.0.5"}
    assert origin("https://[::0:1]:443/") == "https://[::1]"
    assert origin("http://h:8080/") == "http://h:8080"
    for mode in ("host", "domain"):
        politeness = SitePoliteness.from_settings(get_crawler(settings_dict={
            "FRONTIER_POLITENESS_KEY": mode}).settings)
        assert {politeness.key(Request(u)) for u in urls} == {"127.0.0.5"}


def test_a_loopback_host_is_known_by_its_form_without_a_lookup():
    # One check for client hints (identity), the dashboard's Host header and its bind address.
    for host in ("localhost", "LOCALHOST.", "shop.localhost", "127.0.0.1", "127.0.0.2", "127.1",
                 "::1", "[::1]", "[::0:1]"):
        assert is_loopback_host(host), host
    for host in ("", "0.0.0.0", "::", "10.1.2.3", "localhost.example", "notlocalhost",
                 "evil.example", "::ffff:10.0.0.1"):
        assert not is_loopback_host(host), host


def test_credentials_are_redacted_from_free_text_and_from_a_url_s_authority_only():
    assert redact_userinfo("seed http://u:pw@h/x and https://a@b.c/") == \
        "seed http://h/x and https://b.c/"
    assert redact_userinfo(b'{"url": "HTTP://u:pw@h/"}') == b'{"url": "HTTP://h/"}'   # a raw seed
    assert strip_userinfo("http://u:p@h/a?next=http://x:y@z/") == "http://h/a?next=http://x:y@z/"
    assert strip_userinfo("http://h/a@b") == "http://h/a@b"


# -- fuzz: any spelling of one page is that page -------------------------------------

_hosts = st.sampled_from(["example.com", "127.0.0.5", "xn--bcher-kva.de", "a.b-c.org"])
_segment = st.text("abcXYZ019-_.~%", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
_param = st.tuples(st.sampled_from(["q", "page", "side", "Sids", "x_id"]),
                   st.text("abc123", max_size=4))
_session = st.tuples(st.sampled_from(["jsessionid", "PHPSESSID", "sid", "SessionId", "CFTOKEN",
                                      "ASPSESSIONIDABCDEFGH", "session_id"]),
                     st.text("ABC0123456789abcdef", min_size=16, max_size=32))


@hsettings(max_examples=300, deadline=None)
@given(host=_hosts, scheme=st.sampled_from(["http", "https"]),
       path=st.lists(_segment, max_size=3), params=st.lists(_param, max_size=3),
       sessions=st.lists(st.tuples(st.integers(0, 3), _session), max_size=3),
       path_session=st.one_of(st.none(), _session), upper=st.booleans(),
       dots=st.integers(0, 2), port=st.booleans(), userinfo=st.sampled_from(
           ["", "u@", "u:pw@", "U%40x:p%3Aw@"]),
       notation=st.sampled_from(["127.0.0.5", "127.5", "0x7f.0.0.5", "2130706437",
                                 "0177.0.0.05", "127.0.5"]))
def test_any_spelling_of_a_page_is_the_page(host, scheme, path, params, sessions,
                                             path_session, upper, dots, port, userinfo,
                                             notation):
    page = f"{scheme}://{host}/" + "/".join(path)
    query = "&".join(f"{k}={v}" for k, v in params)
    plain = page + (f"?{query}" if query else "")
    written = notation if host == "127.0.0.5" else host    # an IPv4 address, any notation
    spelled_host = (written.upper() if upper else written) + "." * dots
    spelled_port = {"http": ":80", "https": ":443"}[scheme] if port else ""
    pairs = [f"{k}={v}" for k, v in params]
    for position, (name, value) in sessions:
        pairs.insert(min(position, len(pairs)), f"{name}={value}")
    spelled_path = "/" + "/".join(path)
    if path_session:
        spelled_path += f";{path_session[0]}={path_session[1]}"
    spelled = f"{scheme}://{userinfo}{spelled_host}{spelled_port}{spelled_path}" + (
        "?" + "&".join(pairs) if pairs else "")
    result = canonicalize(spelled, SESSIONS)
    assert result.url == canon(plain)
    assert URLS.needs_work(spelled) or not result.changes
    assert URLS.request(Request(spelled)).url == result.url
    assert canonicalize(result.url, SESSIONS).changes == ()
    assert "@" not in urlsplit(result.url).netloc
    # the fetched URL, its fingerprint, its politeness key and its origin agree
    assert fingerprint(Request(result.url)) == fingerprint(Request(plain))
    assert origin(spelled) == origin(plain) == f"{scheme}://{host}"
    assert canonical_host(urlsplit(spelled).hostname) == host


_url_chars = st.sampled_from(list("aZ09.:@;=?&#/[]%-_~ ") + ["jsessionid", "sid", "xn--", "ü"])


@hsettings(max_examples=500, deadline=None)
@given(scheme=st.sampled_from(["http://", "https://", "HTTP://", "ftp://"]),
       rest=st.lists(_url_chars, max_size=20).map("".join))
@example(scheme="http://", rest="@//a")       # no host: not a request to host "a"
@example(scheme="http://", rest="u:p@//a/b")
def test_whatever_a_page_links_to_the_canonical_form_is_stable_and_has_no_credentials(
        scheme, rest):
    try:
        request = Request(scheme + rest)
    except ValueError:   # Scrapy refuses it: it never reaches the frontier
        return
    first = URLS.request(request)
    assert URLS.request(first).url == first.url
    parts = urlsplit(first.url)
    assert "@" not in parts.netloc
    if parts.scheme in ("http", "https") and parts.hostname:
        assert origin(first.url) == origin(request.url)
        assert canonical_host(parts.hostname) == canonical_host(urlsplit(request.url).hostname)


# -- the scheduler, the dedupe filter and the seeds ------------------------------------

class VariantsSpider(Spider):
    name = "variants"

    def parse(self, response):
        pass


def _scheduler(redis_url, **settings):
    crawler = get_crawler(VariantsSpider, {"REDIS_URL": redis_url, **settings})
    crawler.spider = VariantsSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    return scheduler, crawler


VARIANTS = ["http://127.0.0.5/a", "http://127.0.0.5./a", "http://127.0.0.5.:80/a",
            "HTTP://127.0.0.5:80/a;jsessionid=ABC", "http://u:secretpw@127.0.0.5/a?sid=0123456789abcdef0",
            "http://127.0.0.5/a?PHPSESSID=9"]


def test_the_scheduler_stores_one_canonical_request_for_every_spelling(redis_url):
    scheduler, crawler = _scheduler(redis_url)
    accepted = [scheduler.enqueue_request(Request(url)) for url in VARIANTS]
    assert accepted == [True] + [False] * (len(VARIANTS) - 1)
    adds = scheduler.client.outbox[0].adds
    assert len(adds) == 1
    stored = json.dumps([list(map(str, add)) for add in adds])
    assert "secretpw" not in stored and "127.0.0.5." not in stored
    stats = crawler.stats.get_stats()
    assert stats["urls/credentials"] == 1 and stats["urls/host"] == 2
    assert stats["urls/session_id_path"] == 1 and stats["urls/session_id_query"] == 2
    assert stats["urls/port"] == 2


def test_a_url_kept_verbatim_only_loses_its_credentials():
    urls = UrlCanonicalizer.from_settings(None)
    request = Request("http://u:p@H./a;jsessionid=1", meta={"verbatim_url": True})
    assert urls.request(request).url == "http://H./a;jsessionid=1"
    off = UrlCanonicalizer.from_settings(get_crawler(settings_dict={
        "URL_CANONICAL_ENABLED": False, "URL_STRIP_SESSION_IDS": False}).settings)
    assert off.request(Request("http://u:p@H.:80/a?sid=1")).url == "http://h.:80/a?sid=1"
    with pytest.raises(ValueError, match="URL_SESSION_PARAMS"):
        UrlCanonicalizer.from_settings(get_crawler(settings_dict={
            "URL_SESSION_PARAMS": "(unclosed"}).settings)


def test_credentials_go_sealed_and_only_to_a_listed_host_as_basic_auth(caplog, monkeypatch):
    """A listed host's URL credentials travel sealed (nothing of them in the
    stored payload), become Basic auth for that host only (not after a redirect
    elsewhere, not from an altered token, not without the secret), and the
    header is dropped again when the request goes back to the frontier."""
    from crawlproject.middlewares.urlcredentials import UrlCredentialsMiddleware
    from crawlproject.serialization import request_to_json
    from crawlproject.signing import Signer

    crawler = get_crawler(VariantsSpider, {"URL_CREDENTIALS_HOSTS": ["Intranet.Example."],
                                           "FRONTIER_SECRET": "s" * 16})
    crawler.stats.open_spider()
    spider = VariantsSpider.from_crawler(crawler)
    urls = UrlCanonicalizer.from_settings(crawler.settings, crawler.stats)
    sealed = urls.request(Request("http://user:s3cret@intranet.example/a"))
    assert sealed.url == "http://intranet.example/a" and b"Authorization" not in sealed.headers
    payload = request_to_json(sealed, spider, InputPolicy.from_settings(
        crawler.settings, VariantsSpider), Signer([b"s" * 16], spider.name))
    assert "s3cret" not in payload and "dXNlcjpzM2NyZXQ" not in payload
    middleware = UrlCredentialsMiddleware.from_crawler(crawler)
    middleware.process_request(sealed)
    assert sealed.headers[b"Authorization"] == b"Basic dXNlcjpzM2NyZXQ="
    retried = urls.request(sealed.copy())                  # back to the frontier: no header
    assert b"Authorization" not in retried.headers and retried.meta["url_credentials"]
    elsewhere = retried.replace(url="http://other.example/a")     # a redirect keeps the meta
    middleware.process_request(elsewhere)
    assert b"Authorization" not in elsewhere.headers
    altered = retried.replace(meta={"url_credentials": retried.meta["url_credentials"][:-4]})
    middleware.process_request(altered)
    assert b"Authorization" not in altered.headers
    assert crawler.stats.get_value("urls/credentials_refused") == 1
    with caplog.at_level("DEBUG"):
        for _ in range(3):
            other = urls.request(Request("http://user:s3cret@other.example/a"))
    assert other.url == "http://other.example/a" and "url_credentials" not in other.meta
    lines = [r.getMessage() for r in caplog.records if "Credentials removed" in r.getMessage()]
    assert len(lines) == 1 and "other.example" in lines[0] and "s3cret" not in caplog.text
    assert crawler.stats.get_value("urls/credentials_sent") == 1
    assert crawler.stats.get_value("urls/credentials") == 4
    monkeypatch.delenv("FRONTIER_SECRET", raising=False)
    unsecret = get_crawler(VariantsSpider, {"URL_CREDENTIALS_HOSTS": ["intranet.example"]})
    without = UrlCanonicalizer.from_settings(unsecret.settings)
    assert without.seal is None
    assert "url_credentials" not in without.request(
        Request("http://user:s3cret@intranet.example/a")).meta


def test_the_standalone_dupefilter_sees_one_page_for_every_spelling(redis_url):
    from crawlproject.dupefilter import RedisBloomDupeFilter

    crawler = get_crawler(VariantsSpider, {"REDIS_URL": redis_url,
                                           "DUPEFILTER_KEY": "{urls-test}:dupefilter"})
    dupefilter = RedisBloomDupeFilter.from_crawler(crawler)
    try:
        assert [dupefilter.request_seen(Request(u)) for u in VARIANTS] == \
            [False] + [True] * (len(VARIANTS) - 1)
    finally:
        dupefilter.clear()


def test_a_seed_becomes_a_canonical_request_and_a_bad_one_is_kept_without_credentials():
    crawler = get_crawler(VariantsSpider)
    spider = VariantsSpider.from_crawler(crawler)
    policy = InputPolicy.from_settings(crawler.settings, VariantsSpider)
    request = request_from_seed(b"http://u:p4ss@HOST.:80/a;jsessionid=1", spider, policy)
    assert request.url == "http://host/a" and b"Authorization" not in request.headers
    bad = b"http://u:p4ss@host/ has a space"
    with pytest.raises(InvalidSeed) as exc:
        request_from_seed(bad, spider, policy)
    assert "p4ss" not in invalid_record(bad, exc.value)


# -- a real crawl ----------------------------------------------------------------------

PASSWORD = "Pw0rdNeverSent"
HOST = "127.0.0.221"   # this test's own address; port 80, to spell its default port
#: a host of URL_CREDENTIALS_HOSTS (this helper's own port)
PRIVATE, PRIVATE_PORT = "127.0.0.222", 22001
BASIC = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()


class _Site(BaseHTTPRequestHandler):
    hits: list = []

    def do_GET(self):
        self.hits.append((self.server.server_address[0], self.path, dict(self.headers)))
        if self.path == "/robots.txt":
            body, status = b"User-agent: *\nAllow: /\n", 200
        elif self.path.startswith("/fail"):
            body, status = b"broken", 500
        elif self.path == "/moved":   # a redirect with credentials in its Location
            self.send_response(302)
            self.send_header("Location", f"http://user:{PASSWORD}@{HOST}.:80/a?sid=0123456789abcdef0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        elif self.path == "/":
            links = [f"http://user:{PASSWORD}@{HOST}./a", f"http://{HOST}:80/a;jsessionid=XYZ",
                     f"HTTP://{HOST.upper()}/a?PHPSESSID=1", f"http://{HOST}./a?sid=0123456789abcdef0", "/a",
                     f"http://USER:{PASSWORD}@{HOST}/fail", f"http://{HOST}/b?x=1&sid=0123456789abcdef0&y=2",
                     f"http://{HOST}.:80/b?x=1&y=2",
                     f"http://user:{PASSWORD}@{PRIVATE}:{PRIVATE_PORT}/private", "/moved"]
            body = "".join(f'<a href="{u}">l</a>' for u in links).encode()
            status = 200
        else:
            body, status = b"<p>page</p>", 200
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def variants_site():
    try:
        servers = [ThreadingHTTPServer((HOST, 80), _Site),
                   ThreadingHTTPServer((PRIVATE, PRIVATE_PORT), _Site)]
    except OSError as exc:   # port 80 needs root (the suite's machines run as root)
        pytest.skip(f"cannot listen on {HOST}:80: {exc}")
    _Site.hits = []
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield _Site.hits
    for server in servers:
        server.shutdown()
        server.server_close()


def _redis_dump(redis) -> bytes:
    """Every key and value in Redis, as bytes to grep."""
    out = []
    for key in redis.scan_iter(count=1000):
        kind = redis.type(key).decode()
        value = {"string": lambda: [redis.get(key)],
                 "list": lambda: redis.lrange(key, 0, -1),
                 "set": lambda: list(redis.smembers(key)),
                 "zset": lambda: redis.zrange(key, 0, -1),
                 "hash": lambda: [b for kv in redis.hgetall(key).items() for b in kv],
                 "stream": lambda: [repr(redis.xrange(key)).encode()]}[kind]()
        out += [key, *value]
    return b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in out)


@pytest.mark.slow
def test_a_crawl_of_every_spelling_fetches_each_page_once_and_the_password_nowhere(
        variants_site, redis, redis_url, mongo_uri, database, tmp_path):
    """One server linked to as `HOST.`, upper case, with `:80`, credentials and
    session ids: one robots.txt fetch, each page fetched once as its canonical
    URL, no Authorization header, and the password in no Redis key or value, no
    log line, no dead letter and no item. A host of URL_CREDENTIALS_HOSTS gets
    them as Basic auth, for its page only, and never in clear in Redis."""
    from crawlproject.frontier.queue import Frontier
    from crawlproject.keys import start_urls_key

    env = node_env(redis_url, mongo_uri, database.name)
    settings = {"SPIDER_MODULES": "tests.spiders", "DOWNLOAD_ALLOWED_NETWORKS": "loopback",
                "RETRY_TIMES": 0, "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "LOG_LEVEL": "DEBUG",
                "DOWNLOAD_DELAY": 0, "URL_CREDENTIALS_HOSTS": PRIVATE}
    redis.rpush(start_urls_key("urlvariants"), f"http://{HOST}/",
                f"http://u:{PASSWORD}@{HOST}.:80/;jsessionid=1",
                json.dumps({"url": f"http://u:{PASSWORD}@{HOST}/", "method": "EXPLODE"}))
    node = Node("v1", tmp_path, env, spider="urlvariants", settings=settings)
    try:
        assert node.wait(120) == 0, node.tail()
    finally:
        node.stop()
    fetched = Counter(path for host, path, _ in variants_site if host == HOST)
    # Two seeds of "/": seeds are dont_filter (scrapy-redis' way), both fetched as "/".
    assert fetched == {"/robots.txt": 1, "/": 2, "/a": 1, "/b?x=1&y=2": 1, "/fail": 1,
                       "/moved": 1}, fetched
    for host, path, headers in variants_site:
        if host == HOST:
            assert "Authorization" not in headers and headers["Host"] == HOST, (path, headers)
            assert PASSWORD not in json.dumps(headers)
    private = {path: headers.get("Authorization") for host, path, headers in variants_site
               if host == PRIVATE}
    assert private == {"/robots.txt": None, "/private": BASIC}
    log = node.text()
    assert PASSWORD not in log and PASSWORD.lower() not in log.lower()
    assert log.count(f"Credentials removed from the URLs of {HOST} ") == 1
    # Counted per request made: the spelled seed, and the links of each of the two "/"
    assert [node.stat(f"urls/{kind}") for kind in (
        "credentials", "session_id_path", "session_id_query", "host", "port")] == \
        [1 + 2 * 3 + 1, 1 + 2 * 1, 2 * 3 + 1, 1 + 2 * 3 + 1, 1 + 2 * 2 + 1]   # + /moved's hop
    assert node.stat("urls/credentials_sealed") == 2 and node.stat("urls/credentials_sent") == 1
    assert node.stat("seeds/invalid") == 1    # kept in the invalid list, without the password
    dead = Frontier(redis, "urlvariants", "test").dead_letters()
    assert [d["url"] for d in dead] == [f"http://{HOST}/fail"]
    # one politeness key a server, whatever spelling its links used
    from crawlproject.keys import FrontierKeys
    fields = {f.decode() for f in redis.hkeys(FrontierKeys("urlvariants").kstate)}
    assert {f for f in fields if not f.startswith("|")} == {HOST, PRIVATE}, fields
    dump = _redis_dump(redis)
    assert PASSWORD.encode() not in dump and f"{HOST}.".encode() not in dump
    assert BASIC.split()[1].encode()[:-2] not in dump
    assert f"{HOST}:80".encode() not in dump and b"jsessionid" not in dump.lower()
    items = sorted(d["url"] for d in database["urlvariants"].find())
    assert items == [f"http://{HOST}/", f"http://{HOST}/a", f"http://{HOST}/b?x=1&y=2",
                     f"http://{PRIVATE}:{PRIVATE_PORT}/private"]


def test_the_impersonating_handler_never_sends_url_credentials():
    """A request that never went through the frontier (another scheduler, a
    middleware's own download) still has its user:pw@: libcurl would send it
    as Authorization: Basic. The handler sends the URL without it."""
    pytest.importorskip("curl_cffi")
    from tests.test_impersonate import impersonated, run
    from tests.tls_fingerprint import FingerprintServer

    with FingerprintServer() as server:
        url = server.url.replace("https://", f"https://user:{PASSWORD}@") + "/private"

        async def fetch(handler, crawler):
            return await handler.download_request(impersonated(url))

        response = run(fetch)
        seen = server.requests
    assert response.status == 200 and len(seen) == 1
    assert seen[0].header("authorization") is None
    assert PASSWORD not in repr(seen[0].headers)
