"""The live dashboard (crawlproject/dashboard, ``crawlctl dashboard``): a real
dashboard process on a real Redis, driven over HTTP and by Playwright in the
system Chromium; the live test crawls the multi-host demo site with two real nodes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import re
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from crawlproject.dashboard.auth import COOKIE, Credentials
from crawlproject.dashboard.server import BindRefused, check_bind, is_loopback
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.keys import FrontierKeys, ProxyKeys, start_urls_key
from crawlproject.rendering.addon import CHROMIUM_ARGS, chromium_path
from tests.crawl_helpers import ROOT, Node, node_env, wait_for_node_loops

DASHBOARD = ROOT / "crawlproject" / "dashboard"
ARTIFACTS = ROOT / "tests" / "artifacts"
TOKEN = "correct-horse-battery-staple-42"
PASSWORD = "s3cret-basic-pw"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


RAW = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())


class Dashboard:
    """``crawlctl dashboard`` in a subprocess on a free port (its URL from its first line)."""

    def __init__(self, redis_url: str, *args: str, env: dict | None = None):
        base = {k: v for k, v in os.environ.items() if not k.startswith("DASHBOARD_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url, "dashboard",
             "--port", "0", "--interval", "0.5", *args], cwd=ROOT, env={**base, **(env or {})},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        self.pumps = [threading.Thread(target=self._pump, args=(stream, put), daemon=True)
                      for stream, put in ((self.proc.stdout, self.lines.put),
                                          (self.proc.stderr, self.err.append))]
        for pump in self.pumps:
            pump.start()
        self.first = self._line(60)
        self.url = re.search(r"(http://\S+?)/ ", self.first).group(1) if self.first else None

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line)
        put(None)

    def _line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the dashboard printed nothing in {timeout}s: "
                                 f"{''.join(self.err)[-2000:]}") from None

    def log(self) -> str:
        return "".join(line for line in self.err if line)

    def wait(self, timeout: float = 60) -> int:
        """Its exit code, once it exited by itself (and its output is read)."""
        code = self.proc.wait(timeout)
        for pump in self.pumps:
            pump.join(10)
        return code

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> Dashboard:
        assert self.url, f"no address: {self.first!r} {self.log()[-2000:]}"
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        for pump in self.pumps:
            pump.join(10)


def http(url: str, method: str = "GET", data: bytes | None = None, **headers):
    """(status, headers, body) without following redirects."""
    request = urllib.request.Request(url, method=method, data=data,
                                     headers={k.replace("_", "-"): v for k, v in headers.items()})
    try:
        with RAW.open(request, timeout=30) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode()


def in_own_loop(coroutine_function) -> None:
    """Run it in a thread of its own: a Playwright test before it on this worker
    leaves its event loop running in the main thread (asyncio.run refuses)."""
    import asyncio

    failure = []

    def run():
        try:
            asyncio.run(coroutine_function())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            failure.append(exc)

    thread = threading.Thread(target=run, name="in-process-dashboard")
    thread.start()
    thread.join(300)
    assert not thread.is_alive(), "the in-process dashboard test did not end"
    if failure:
        raise failure[0]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def csrf_of(page: str) -> str:
    return re.search(r'<meta name="csrf-token" content="([^"]+)"', page).group(1)


def first_event(url: str, **headers) -> dict:
    """The first ``update`` event of the stream."""
    request = urllib.request.Request(url, headers={k.replace("_", "-"): v
                                                   for k, v in headers.items()})
    with RAW.open(request, timeout=30) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        for raw in stream:
            line = raw.decode()
            if line.startswith("data: "):
                return json.loads(line[6:])
    raise AssertionError("the stream ended without an update")


def wait_until(predicate, timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(step)


def dead_letters(redis, spider: str, count: int) -> None:
    """*count* dead letters in *spider*'s frontier, made as a node makes them."""
    frontier = Frontier(redis, spider, "n1")
    batch = Batch()
    for i in range(count):
        batch.add(json.dumps({"url": f"http://127.0.0.1/{i}"}), f"fp{i}".encode() * 5, 0)
    batch.take = count
    taken = frontier.sync(batch).taken
    dead = Batch()
    for member, payload in taken:   # (a requeue keys each by its payload's URL)
        dead.fail(member, "dead", {"payload": payload.decode(), "priority": 0,
                                   "url": "http://127.0.0.1/", "reason": "HTTP 503",
                                   "attempts": 3})
    frontier.sync(dead)
    assert redis.llen(FrontierKeys(spider).dead) == count


# -- the vendored chart library -----------------------------------------------------------
def test_the_vendored_uplot_is_the_one_the_lockfile_pins():
    """package-lock.json's integrity is the npm tarball's sha512; the files served
    from static/ are that tarball's, byte for byte."""
    pinned = json.loads((DASHBOARD / "package.json").read_text())["dependencies"]["uplot"]
    lock = json.loads((DASHBOARD / "package-lock.json").read_text())
    entry = lock["packages"]["node_modules/uplot"]
    assert entry["version"] == pinned and re.fullmatch(r"\d+\.\d+\.\d+", pinned), pinned
    assert lock["packages"][""]["dependencies"]["uplot"] == pinned
    tarball = DASHBOARD / "vendor" / f"uplot-{pinned}.tgz"
    algorithm, _, expected = entry["integrity"].partition("-")
    assert algorithm == "sha512"
    assert base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode() == expected
    with tarfile.open(tarball) as tar:
        for member, served in [("package/dist/uPlot.iife.min.js", "uPlot.iife.min.js"),
                               ("package/dist/uPlot.min.css", "uPlot.min.css"),
                               ("package/LICENSE", "uPlot.LICENSE")]:
            assert tar.extractfile(member).read() == (DASHBOARD / "static" / served).read_bytes(), \
                served
        assert json.load(tar.extractfile("package/package.json"))["license"] == "MIT"


# -- binding and credentials --------------------------------------------------------------
def test_a_non_loopback_bind_without_credentials_refuses_to_start(redis_url):
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.1.2.3", "192.168.1.20"):
        assert not is_loopback(host), host
        with pytest.raises(BindRefused, match="without credentials"):
            check_bind(host, Credentials())
        check_bind(host, Credentials(token=TOKEN))          # allowed with a token ...
        check_bind(host, Credentials(username="op", password=PASSWORD))   # ... or basic auth
    # The command: refused before anything is bound, exit 2, one clear line.
    refused = Dashboard(redis_url, "shop", "--host", "0.0.0.0")
    assert refused.wait() == 2
    assert refused.first is None and "refusing to serve the dashboard on 0.0.0.0" in refused.log()
    # Credentials that cannot protect anything are refused too, and never printed.
    short = Dashboard(redis_url, "shop", "--host", "0.0.0.0", env={"DASHBOARD_TOKEN": "abc123"})
    assert short.wait() == 2 and "at least 16 characters" in short.log()
    half = Dashboard(redis_url, "shop", env={"DASHBOARD_USERNAME": "op"})
    assert half.wait() == 2 and "DASHBOARD_PASSWORD" in half.log()
    assert "abc123" not in short.log()


def test_wrong_credentials_get_401_and_actions_need_the_csrf_header(redis, redis_url):
    env = {"DASHBOARD_TOKEN": TOKEN, "DASHBOARD_USERNAME": "op", "DASHBOARD_PASSWORD": PASSWORD}
    with Dashboard(redis_url, "shop", env=env) as dash:
        api = f"{dash.url}/api/spiders/shop/status"
        assert http(api)[0] == 401
        assert http(api, Authorization="Bearer wrong-token-wrong-token")[0] == 401
        assert http(api, Authorization=f"Bearer {TOKEN}x")[0] == 401
        status, headers, _ = http(api, Authorization=basic("op", "wrong-password"))
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert http(api, Authorization=basic("other", PASSWORD))[0] == 401
        assert http(api, Authorization=f"Bearer {TOKEN}")[0] == 200
        assert http(api, Authorization=basic("op", PASSWORD))[0] == 200
        # A browser without credentials gets the sign-in form; a wrong token, 401 again.
        status, _, page = http(f"{dash.url}/spider/shop", Accept="text/html")
        assert status == 401 and '<label for="token">' in page
        assert http(f"{dash.url}/login", "POST", b"token=wrong-token-wrong-token")[0] == 401
        status, headers, _ = http(f"{dash.url}/login", "POST", f"token={TOKEN}".encode())
        cookie = headers["Set-Cookie"]
        assert status == 303 and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert TOKEN not in cookie                      # an HMAC of it, not the token
        session = cookie.split(";")[0]
        status, _, page = http(f"{dash.url}/spider/shop", Cookie=session)
        assert status == 200 and "Crawl dashboard: shop" in page
        assert http(f"{dash.url}/spider/shop", Cookie=f"{COOKIE}=0123abcd")[0] == 401
        # POST: authenticated is not enough, the page's CSRF token must come along.
        pause = f"{dash.url}/api/spiders/shop/actions/pause"
        assert http(pause, "POST", b"{}", Cookie=session)[0] == 403
        assert http(pause, "POST", b"{}", Cookie=session, X_CSRF_Token="guess")[0] == 403
        assert not redis.exists("{shop}:control")
        csrf = csrf_of(page)
        assert http(pause, "POST", b"{}", Cookie=session, X_CSRF_Token=csrf,
                    Origin="http://evil.example")[0] == 403
        assert not redis.exists("{shop}:control")
        assert http(pause, "POST", b"{}", X_CSRF_Token=csrf)[0] == 401      # no credentials
        status, _, body = http(pause, "POST", b"{}", Cookie=session, X_CSRF_Token=csrf,
                               Origin=dash.url)
        assert status == 200 and json.loads(body)["state"] == "pause", body
        assert redis.hget("{shop}:control", b"state") == b"pause"
        assert redis.hget("{shop}:control", b"by").startswith(b"dashboard:token@")
        assert http(f"{dash.url}/api/spiders/other/status",
                    Authorization=f"Bearer {TOKEN}")[0] == 404      # only the spiders named
    log = dash.log()
    assert TOKEN not in log and PASSWORD not in log and "wrong token" in log.lower()


def test_an_open_dashboard_answers_loopback_names_only(redis, redis_url):
    with Dashboard(redis_url, "shop") as dash:
        assert "loopback only" in dash.first
        status, _, page = http(f"{dash.url}/spider/shop")
        assert status == 200
        # A DNS-rebinding page (its own name, our address) gets nothing.
        assert http(f"{dash.url}/spider/shop", Host="evil.example")[0] == 421
        port = dash.url.rsplit(":", 1)[1]
        assert http(f"{dash.url}/spider/shop", Host=f"localhost:{port}")[0] == 200
        drain = f"{dash.url}/api/spiders/shop/actions/drain"
        assert http(drain, "POST", b"{}")[0] == 403
        assert http(drain, "POST", b"{}", X_CSRF_Token=csrf_of(page), Host="evil.example")[0] \
            == 421
        assert not redis.exists("{shop}:control")
        status, _, body = http(drain, "POST", b"{}", X_CSRF_Token=csrf_of(page))
        assert status == 200 and redis.hget("{shop}:control", b"state") == b"drain"
        assert http(f"{dash.url}/api/spiders/shop/actions/reset", "POST", b"{}",
                    X_CSRF_Token=csrf_of(page))[0] == 404


def test_no_secret_and_no_markup_from_redis_reach_the_page(tmp_path):
    """The Redis password (URL), proxy credentials and hostile strings in Redis:
    never in the HTML, the JSON, the event stream or the log; markup escaped."""
    import redis as redis_lib

    from devtools.services import RedisServer

    server = RedisServer(data_dir=tmp_path / "redis", password="topsecret-redis-pw")
    server.start()
    try:
        url = server.url
        assert "topsecret-redis-pw@" in url
        client = redis_lib.Redis.from_url(url)
        client.hset("{shop}:node_reports", '<img src=x onerror="alert(1)">-1-a',
                    json.dumps({"at": int(time.time() * 1000), "pages": 1,
                                "state": "<script>alert(2)</script>"}))
        client.hset(FrontierKeys("shop").kstate, "<b>evil</b>", "0|0|0|0|0")
        client.sadd(ProxyKeys("shop").pool, "http://user:proxy-pass-xyz@127.0.0.1:3128")
        with Dashboard(url, "shop") as dash:
            status, _, page = http(f"{dash.url}/spider/shop")
            _, _, data = http(f"{dash.url}/api/spiders/shop/status")
            event = json.dumps(first_event(f"{dash.url}/api/spiders/shop/events"))
            assert status == 200 and "redis://***@" in page
            assert json.loads(data)["redis"].startswith("redis://***@")
            for text in (page, data, event, dash.first):
                assert "topsecret" not in text and "proxy-pass-xyz" not in text
            for text in (page, event):
                assert "<img src=x" not in text and "<script>alert" not in text
                assert "<b>evil</b>" not in text
            assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
            assert "&lt;b&gt;evil&lt;/b&gt;" in page and "127.0.0.1:3128" in page
        assert "topsecret" not in dash.log() and "proxy-pass-xyz" not in dash.log()
        client.close()
    finally:
        server.stop()


def test_an_unreachable_redis_is_shown_and_the_dashboard_stays_up():
    from devtools.services import free_port

    url = f"redis://:topsecret-redis-pw@127.0.0.1:{free_port()}/0"
    with Dashboard(url, "shop") as dash:
        status, _, page = http(f"{dash.url}/spider/shop")
        assert status == 200 and "Cannot read the crawl state: Redis: ConnectionError" in page
        status, _, body = http(f"{dash.url}/api/spiders/shop/status")
        assert status == 503 and "ConnectionError" in json.loads(body)["error"]
        assert json.loads(body)["redis"].startswith("redis://***@127.0.0.1:")
        time.sleep(2)   # four more failed reads by the sampler: not four more log lines
        assert dash.proc.poll() is None
    assert "topsecret" not in page + body + dash.log()
    assert dash.log().count("Reading the state of shop failed") == 1, dash.log()


# -- in the browser -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(),
                                              args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.problems = []   # console errors (a CSP violation is one), uncaught exceptions
    page.on("console", lambda m: m.type == "error" and page.problems.append(m.text))
    page.on("pageerror", lambda exc: page.problems.append(str(exc)))
    yield page
    context.close()


def shown(page, field: str) -> int:
    return int(page.locator(f'[data-field="{field}"]').inner_text().replace(",", ""))


CONTRAST = """() => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  const lin = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const background = (el) => {
    for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length < 4 || c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    const box = el.getBoundingClientRect();
    if (!own || !box.width || !box.height || getComputedStyle(el).visibility === "hidden") continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(background(el));
    out.push({text: el.textContent.trim().slice(0, 40),
              ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)});
  }
  return out;
}"""


def assert_readable(page) -> None:
    """WCAG AA: at least 4.5:1 for every visible text."""
    ratios = page.evaluate(CONTRAST)
    assert len(ratios) > 20, ratios
    low = [r for r in ratios if r["ratio"] < 4.5]
    assert not low, low


def test_keyboard_labels_contrast_and_requeue_dead_letters(page, redis, redis_url):
    from playwright.sync_api import expect

    dead_letters(redis, "shop", 3)
    with Dashboard(redis_url, "shop") as dash:
        page.goto(f"{dash.url}/")                          # one spider: its page
        expect(page.locator("#live")).to_have_text("live", timeout=20_000)
        assert page.url.endswith("/spider/shop") and page.locator("html").get_attribute("lang")
        assert shown(page, "frontier.dead") == 3
        # Labels: every control has a name, every table a caption, every chart a text.
        for button in page.locator("button").all():
            assert button.inner_text().strip() or button.get_attribute("aria-label")
        tables = page.locator("table:not(.u-legend)")    # (uPlot's legend is a table)
        assert tables.count() == page.locator("table:not(.u-legend) > caption").count() > 0
        for chart in page.locator("[role=img]").all():
            assert "Chart:" in chart.get_attribute("aria-label")
        assert_readable(page)
        # Keyboard: Tab reaches the button, Enter opens the dialog, Escape cancels.
        requeue = page.locator("button[data-action=replay]")
        for _ in range(60):
            if requeue.evaluate("b => b === document.activeElement"):
                break
            page.keyboard.press("Tab")
        else:
            raise AssertionError("Tab never reached the requeue button")
        page.keyboard.press("Enter")
        dialog = page.locator("dialog#confirm")
        expect(dialog).to_be_visible()
        expect(page.locator("#confirm-cancel")).to_be_focused()    # the safe choice first
        assert "dead letters of shop" in dialog.inner_text()
        assert_readable(page)
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
        expect(page.locator("#action-result")).to_have_text("Requeue dead letters: cancelled")
        expect(requeue).to_be_focused()
        assert redis.llen(FrontierKeys("shop").dead) == 3
        # Enter, Tab to the confirm button, Enter: requeued through `crawlctl replay`'s code.
        page.keyboard.press("Enter")
        expect(page.locator("#confirm-cancel")).to_be_focused()
        page.keyboard.press("Tab")
        expect(page.locator("#confirm-ok")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator("#action-result")).to_have_text(
            "shop: requeued 3 dead letter(s)", timeout=20_000)
        assert redis.llen(FrontierKeys("shop").dead) == 0
        assert redis.zcard(FrontierKeys("shop").delayed) == 3       # fresh retries, due now
        expect(page.locator('[data-field="frontier.dead"]')).to_have_text("0", timeout=20_000)
        expect(page.locator('[data-field="frontier.delayed"]')).to_have_text("3")
        assert not page.problems, page.problems
    # The sign-in page of a token dashboard: a labelled field, readable.
    with Dashboard(redis_url, "shop", env={"DASHBOARD_TOKEN": TOKEN}) as dash:
        page.goto(f"{dash.url}/spider/shop")
        field = page.get_by_label("Access token")
        expect(field).to_be_focused()
        field.fill("wrong-token-wrong-token")
        page.keyboard.press("Enter")
        expect(page.get_by_role("alert")).to_have_text("Wrong token.")
        page.get_by_label("Access token").fill(TOKEN)
        page.keyboard.press("Enter")
        expect(page.locator("h1")).to_have_text("Crawl dashboard: shop")
        expect(page.locator("#live")).to_have_text("live", timeout=20_000)


@pytest.mark.slow
def test_during_a_live_crawl_the_page_agrees_with_redis_and_pause_stops_fetching(
        page, redis, redis_url, mongo_uri, database, tmp_path):
    from playwright.sync_api import expect

    from devtools.demo.hosts import MultiHostSite

    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 0, "CONCURRENT_REQUESTS": 4,
                "DOWNLOAD_DELAY": 0.1, "LOG_LEVEL": "INFO"}
    env = node_env(redis_url, mongo_uri, database.name)
    with MultiHostSite(hosts, pages=400, latency_ms=20) as site, \
            Dashboard(redis_url, "hosts") as dash:
        nodes = [Node(f"d{i}", tmp_path, env, spider="hosts", settings=settings) for i in (1, 2)]
        try:
            for node in nodes:
                node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("hosts"), *site.root_urls())
            page.goto(f"{dash.url}/spider/hosts")
            expect(page.locator("#live")).to_have_text("live", timeout=20_000)
            rows = page.locator("#frag-nodes tbody tr")
            expect(rows).to_have_count(2, timeout=30_000)     # reports come every 5 s
            site.wait_for_requests(30, timeout=120)
            # Pause with the mouse: button, then the dialog's confirm button.
            page.locator("button[data-action=pause]").click()
            page.locator("#confirm-ok").click()
            for node in nodes:
                node.wait_for_log("Operator control: pause", timeout=30)
            expect(page.locator('[data-field="control.state"]')).to_have_text("pause")
            seen = [len(site.requests()), time.monotonic()]

            def settled():   # downloads already started end; then the site hears nothing
                now = len(site.requests())
                if now != seen[0]:
                    seen[:] = [now, time.monotonic()]
                return time.monotonic() - seen[1] >= 1.0

            wait_until(settled, 30, "started downloads to end")
            paused_at = len(site.requests())
            wait_for_node_loops(redis, "hosts", len(nodes))  # nothing may happen meanwhile
            assert len(site.requests()) == paused_at, "a paused crawl fetched pages"
            # While paused the frontier is stable: read it straight from Redis.
            keys = FrontierKeys("hosts")

            def in_redis():
                return {"queued": int(redis.hget(keys.kstate, "||qlen") or 0),
                        "inflight": redis.hlen(keys.inflight),
                        "delayed": redis.zcard(keys.delayed), "dead": redis.llen(keys.dead),
                        "invalid": redis.llen(keys.invalid)}

            frontier = in_redis()
            assert frontier["queued"] > 0, frontier     # mid-crawl: not a trivial 0 = 0
            for name, value in frontier.items():
                expect(page.locator(f'[data-field="frontier.{name}"]')).to_have_text(
                    f"{value:,}", timeout=15_000)
            assert in_redis() == frontier
            assert {name: shown(page, f"frontier.{name}") for name in frontier} == frontier
            assert shown(page, "frontier.nodes") == 2
            assert shown(page, "politeness.hosts") == len(hosts)
            expect(rows.filter(has_text="pause")).to_have_count(2, timeout=20_000)
            for row in rows.all():
                heartbeat = float(row.locator("td").nth(1).inner_text())
                assert 0 <= heartbeat < 10, row.inner_text()    # renewed while paused
            expect(page.locator(".u-over")).to_have_count(2)     # both charts drawn
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard-live-crawl.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            # Resume with the keyboard: focus, Enter, Tab to confirm, Enter.
            page.locator("button[data-action=resume]").focus()
            page.keyboard.press("Enter")
            page.keyboard.press("Tab")
            expect(page.locator("#confirm-ok")).to_have_text("Resume")
            page.keyboard.press("Enter")
            for node in nodes:
                node.wait_for_log("Operator control: run", timeout=30)
            site.wait_for_requests(paused_at + 20, timeout=60)     # fetching again
            expect(page.locator('[data-field="control.state"]')).to_have_text("run")
            assert not page.problems, page.problems
        finally:
            for node in nodes:
                node.stop()
    assert shot.stat().st_size > 10_000


def test_sign_in_is_rate_limited_per_client_and_logged_as_a_summary(redis, redis_url):
    """300 wrong tokens were answered in 0.12 s, each with a WARNING line. Now a
    client gets 10 tries a minute, then 429 with Retry-After (even with the
    right token: guessing stays at 10 a minute), and the log has one line."""
    with Dashboard(redis_url, "shop", env={"DASHBOARD_TOKEN": TOKEN}) as dash:
        answers = [http(f"{dash.url}/login", "POST", f"token=wrong-{i:020d}".encode())
                   for i in range(30)]
        assert [a[0] for a in answers] == [401] * 10 + [429] * 20
        assert 1 <= int(answers[-1][1]["Retry-After"]) <= 60
        status, headers, page = http(f"{dash.url}/login", "POST", f"token={TOKEN}".encode())
        assert status == 429 and "Set-Cookie" not in headers and "try again in" in page
        # The same client's Bearer token: every credential check goes through the limiter.
        assert http(f"{dash.url}/api/spiders/shop/status",
                    Authorization=f"Bearer {TOKEN}")[0] == 429
    lines = [line for line in dash.log().splitlines() if "wrong token" in line.lower()]
    assert len(lines) == 1 and ": 1 attempt(s)" in lines[0], lines


class InProcessDashboard:
    """The real aiohttp app (create_app) on a loopback port in this process, its
    sign-in limiter on a clock the test moves: no subprocess, no sleeping."""

    def __init__(self, redis, redis_url, env, **limits):
        from crawlproject.dashboard import DashboardConfig, create_app
        from crawlproject.dashboard.auth import SignInLimiter

        self.now = [1000.0]
        config = DashboardConfig(["shop"], redis_url, credentials=Credentials.from_env(env),
                                 interval=60)
        self.app = create_app(config, client=redis)
        self.limiter = SignInLimiter(10, 60.0, clock=lambda: self.now[0], **limits)
        self.app["signins"] = self.limiter

    async def __aenter__(self):
        from aiohttp.test_utils import TestClient, TestServer

        self.client = TestClient(TestServer(self.app, host="127.0.0.1"))
        await self.client.start_server()
        return self

    async def __aexit__(self, *exc):
        await self.client.close()

    async def get(self, path="/api/spiders/shop/status", **headers) -> tuple[int, dict]:
        async with self.client.get(path, headers=headers, allow_redirects=False) as answer:
            await answer.read()
            return answer.status, dict(answer.headers)


def in_own_loop(coroutine_function) -> None:
    """Run it in a thread of its own: a Playwright test before it on this worker
    leaves its event loop running in the main thread (asyncio.run refuses)."""
    import asyncio

    failure = []

    def run():
        try:
            asyncio.run(coroutine_function())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            failure.append(exc)

    thread = threading.Thread(target=run, name="in-process-dashboard")
    thread.start()
    thread.join(300)
    assert not thread.is_alive(), "the in-process dashboard test did not end"
    if failure:
        raise failure[0]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


BASIC_ENV = {"DASHBOARD_USERNAME": "op", "DASHBOARD_PASSWORD": PASSWORD, "DASHBOARD_TOKEN": TOKEN}


def test_wrong_basic_passwords_get_429_long_before_a_thousand(redis, redis_url):
    """1,000 wrong Basic passwords were 1,000 answers of 401 in 0.87 s: now the
    11th is refused (429, Retry-After), and so is the right password, the right
    Bearer token and the session cookie from that client until the lock ends."""
    async def run():
        async with InProcessDashboard(redis, redis_url, BASIC_ENV) as dash:
            statuses = [(await dash.get(Authorization=basic("op", f"guess-{i:04d}")))[0]
                        for i in range(1000)]
            assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}
            status, headers = await dash.get(Authorization=basic("op", PASSWORD))
            assert status == 429 and 1 <= int(headers["Retry-After"]) <= 60
            assert (await dash.get(Authorization=f"Bearer {TOKEN}"))[0] == 429
            cookie = Credentials(token=TOKEN).cookie_value()
            assert (await dash.get(Cookie=f"{COOKIE}={cookie}"))[0] == 429
            dash.now[0] += 59
            assert (await dash.get(Authorization=basic("op", PASSWORD)))[0] == 429
            dash.now[0] += 1      # the lock ends with the window of the 10 failures
            assert (await dash.get(Authorization=basic("op", PASSWORD)))[0] == 200

    in_own_loop(run)


@pytest.mark.parametrize("kind", ["bearer", "cookie"])
def test_wrong_bearer_tokens_and_cookies_are_limited_too(redis, redis_url, kind):
    def wrong(i):
        return ({"Authorization": f"Bearer wrong-token-{i:012d}"} if kind == "bearer"
                else {"Cookie": f"{COOKIE}={'0' * 60}{i:04d}"})

    async def run():
        async with InProcessDashboard(redis, redis_url, {"DASHBOARD_TOKEN": TOKEN}) as dash:
            statuses = [(await dash.get(**wrong(i)))[0] for i in range(15)]
            assert statuses == [401] * 10 + [429] * 5
            assert (await dash.get(Authorization=f"Bearer {TOKEN}"))[0] == 429
            # no credential at all (a browser's first request) is no guess
            assert dash.limiter.retry_after("127.0.0.2") == 0

    in_own_loop(run)


def test_a_locked_client_stays_locked_whatever_other_addresses_do(redis, redis_url):
    """A limiter that tracked 10,000 clients forgot the oldest to make room, a
    locked one included: an attacker rotating addresses unlocked itself. Now
    20,000 other addresses (IPv4 and IPv6) failing do not unlock it."""
    async def run():
        async with InProcessDashboard(redis, redis_url, BASIC_ENV,
                                      global_limit=10**9) as dash:
            for i in range(10):
                assert (await dash.get(Authorization=basic("op", f"g{i}")))[0] == 401
            assert (await dash.get(Authorization=basic("op", PASSWORD)))[0] == 429
            for i in range(10_000):
                dash.limiter.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
                dash.limiter.failed(f"2001:db8:{i:x}::1")
            assert len(dash.limiter._failures) <= dash.limiter.max_clients
            assert (await dash.get(Authorization=basic("op", PASSWORD)))[0] == 429
            dash.now[0] += 60
            assert (await dash.get(Authorization=basic("op", PASSWORD)))[0] == 200

    in_own_loop(run)


def test_guessing_from_ever_new_addresses_is_throttled_for_all_but_signed_in_clients():
    from crawlproject.dashboard.auth import SignInLimiter, client_key

    now = [1000.0]
    limiter = SignInLimiter(limit=10, window=60, clock=lambda: now[0], global_limit=100)
    limiter.succeeded("192.0.2.7")                      # the operator, signed in before
    for i in range(99):
        assert limiter.retry_after(f"198.51.100.{i}") == 0
        limiter.failed(f"198.51.100.{i}")               # one guess per address
    limiter.failed("203.0.113.1")                       # the 100th within the minute
    assert limiter.retry_after("203.0.113.200") == 60   # a new address: throttled too
    assert limiter.retry_after("192.0.2.7") == 0        # ... but not the operator
    now[0] += 60
    assert limiter.retry_after("203.0.113.200") == 0
    # Addresses of one IPv6 /64 are one client; IPv4-mapped is IPv4.
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff::9") \
        == "2001:db8:1:2::/64"
    assert client_key("::ffff:198.51.100.4") == "198.51.100.4"
    for i in range(10):
        limiter.failed(f"2001:db8:1:2::{i + 1:x}")
    assert limiter.retry_after("2001:db8:1:2:dead::beef") == 60


def test_sign_in_limiter_reports_each_client_once_a_window():
    from crawlproject.dashboard.auth import SignInLimiter

    now = [1000.0]
    limiter = SignInLimiter(limit=3, window=60, clock=lambda: now[0])
    assert limiter.retry_after("a") == 0 and not limiter.pending
    for _ in range(3):
        limiter.failed("a")
    assert limiter.due_reports() == [("a", 3)]          # the first report at once
    assert limiter.retry_after("a") == 60 and limiter.retry_after("b") == 0
    for _ in range(5):
        limiter.failed("a", refused=True)
    now[0] += 30
    assert limiter.due_reports() == [] and limiter.pending
    assert limiter.retry_after("a") == 30                # refused tries do not extend it
    now[0] += 30
    assert limiter.retry_after("a") == 0
    assert limiter.due_reports() == [("a", 5)] and not limiter.pending
    now[0] += 120
    limiter.due_reports()
    assert limiter._failures == {} and limiter._reported_at == {}   # quiet clients forgotten


def stream_events(url: str, count: int) -> list[str]:
    """The ``data:`` lines of the first *count* ``update`` events, as sent."""
    out = []
    with RAW.open(urllib.request.Request(url), timeout=60) as stream:
        for raw in stream:
            line = raw.decode()
            if line.startswith("data: "):
                out.append(line[6:])
                if len(out) == count:
                    return out
    raise AssertionError(f"the stream ended after {len(out)} updates")


def test_the_event_stream_sends_changes_only_and_bounded_values(redis, redis_url):
    """Every interval each client got every fragment, changed or not, and values
    of any size (100,000 characters in Redis: 210 KB per client per interval).
    Now a stream sends a fragment only when it changed since its last event,
    and each value read from Redis is cut to a bound, marked as truncated."""
    big = 100_000
    Frontier(redis, "shop", "n1").sync(_entry_for("h" * big))
    redis.hset("{shop}:control", mapping={"state": "pause", "since": 1, "by": "b" * big})
    redis.hset(FrontierKeys("shop").stats, "s" * big, 1)
    with Dashboard(redis_url, "shop") as dash:
        events = stream_events(f"{dash.url}/api/spiders/shop/events", 4)
        status = http(f"{dash.url}/api/spiders/shop/status")[2]
    first, later = json.loads(events[0]), [json.loads(e) for e in events[1:]]
    assert {"control", "hosts", "totals", "frontier"} <= set(first["html"])
    assert len(events[0]) < 20_000, len(events[0])           # was > 300,000
    assert "truncated" in first["html"]["hosts"]
    # `by` is cut where the control hash is read (100 characters, crawlproject.control)
    assert "b" * 100 in first["html"]["control"] and "b" * 101 not in first["html"]["control"]
    for event in later:             # nothing changed in Redis: only the time line
        assert set(event["html"]) <= {"updated", "nodes", "rates"}, set(event["html"])
        assert event["sample"] is not None
    assert sum(map(len, events[1:])) < 3 * 2_000
    assert len(status) < 20_000 and "b" * 1000 not in status


def _entry_for(key: str) -> Batch:
    batch = Batch()
    batch.add(json.dumps({"url": "http://127.0.0.1/x"}), b"\x02" * 20, 0, key=key)
    batch.take = 1
    return batch


def test_a_control_key_of_the_wrong_type_is_shown_and_its_actions_refused(redis, redis_url):
    """The page says what is wrong with the control key (nodes pause) and the
    buttons answer 409 with the way out, not a 500 with WRONGTYPE."""
    redis.set("{shop}:control", "pause")
    with Dashboard(redis_url, "shop") as dash:
        status, _, page = http(f"{dash.url}/spider/shop")
        assert status == 200 and "{shop}:control is a string, not a hash" in page
        status, _, body = http(f"{dash.url}/api/spiders/shop/actions/resume", "POST", b"{}",
                               X_CSRF_Token=csrf_of(page))
        assert status == 409 and "--force" in json.loads(body)["message"], body
    assert redis.get("{shop}:control") == b"pause"
