"""Connecting through MONGO_URI: with authentication, a readWrite user stores
items; a wrong password fails at open with a clear error that never shows the
password, and loses nothing (the seed stays in Redis, a later node with the
right password crawls everything). TLS options (``tls``, ``tlsCAFile``) and
``authSource`` come from the URI too."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from urllib.parse import quote_plus

import pymongo
import pytest

from crawlproject.keys import start_urls_key
from devtools.demo.site import DemoSite, expected_items
from crawlproject.pipelines.mongo import MongoPipelineError
from devtools.services import MongoServer, create_mongo_user
from tests.crawl_helpers import Node, assert_matches_catalog, node_env, stored_products
from tests.test_pipeline_mongo import make_pipeline, product, store

USER = "crawler"
PASSWORD = "S3cr#t:p@ss/w0rd"
WRONG = "Wr0ng-H0rse-Battery"
DATABASE = "crawl"


@pytest.fixture(scope="module")
def auth_mongo(tmp_path_factory):
    """A MongoDB-wire server with --auth and a readWrite user on ``crawl``."""
    server = MongoServer(storage_path=tmp_path_factory.mktemp("auth-mongo"))
    server.start()
    try:
        create_mongo_user(server.uri, DATABASE, USER, PASSWORD, roles=["readWrite"])
        server.stop()
        server.auth = True
        server.start()
        yield server
    finally:
        server.stop()


def uri_for(server: MongoServer, password: str) -> str:
    return (f"mongodb://{USER}:{quote_plus(password)}@{server.host}:{server.port}/"
            f"?authSource={DATABASE}")


def admin_client(server: MongoServer) -> pymongo.MongoClient:
    return pymongo.MongoClient(uri_for(server, PASSWORD), tz_aware=True)


def test_readwrite_user_stores_items(auth_mongo, tmp_path):
    pipeline, stats = make_pipeline(uri_for(auth_mongo, PASSWORD), DATABASE, tmp_path,
                                    MONGO_COLLECTION="auth_items")
    asyncio.run(store(pipeline, [product(i) for i in range(30)]))
    assert stats.get_value("mongo/upserted") == 30
    client = admin_client(auth_mongo)
    try:
        assert client[DATABASE]["auth_items"].count_documents({}) == 30
        client[DATABASE]["auth_items"].drop()
    finally:
        client.close()


def test_wrong_password_is_a_clear_error_without_the_password(auth_mongo, tmp_path, caplog):
    pipeline, _ = make_pipeline(uri_for(auth_mongo, WRONG), DATABASE, tmp_path)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(MongoPipelineError) as raised:
        asyncio.run(pipeline.open_spider())
    asyncio.run(pipeline.close_spider())
    message = str(raised.value)
    assert "refused the credentials of user 'crawler'" in message
    assert "authSource 'crawl'" in message
    assert f"mongodb://{USER}:***@" in message
    for secret in (WRONG, quote_plus(WRONG)):
        assert secret not in message
        assert secret not in caplog.text
    assert "refused the credentials" in caplog.text


def test_no_credentials_on_an_auth_server_says_so(auth_mongo, tmp_path):
    pipeline, _ = make_pipeline(auth_mongo.uri, DATABASE, tmp_path)
    with pytest.raises(MongoPipelineError, match="requires authentication"):
        asyncio.run(pipeline.open_spider())
    asyncio.run(pipeline.close_spider())


@pytest.mark.slow
def test_wrong_password_node_fails_and_loses_nothing(auth_mongo, redis, redis_url, tmp_path):
    products = 20
    with DemoSite(products=products) as site:
        redis.lpush(start_urls_key("products"), site.url)
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "MONGO_SPOOL_DIR": tmp_path / "spool"}
        bad = Node("bad-password", tmp_path,
                   node_env(redis_url, uri_for(auth_mongo, WRONG), DATABASE), settings=settings)
        code = bad.wait(120)
        stderr = bad.proc.stderr.read().decode(errors="replace")
        log = bad.text()
        assert code != 0
        assert "refused the credentials of user 'crawler'" in log
        for secret in (WRONG, quote_plus(WRONG)):
            assert secret not in log and secret not in stderr
        # Nothing was consumed: the seed is still there...
        assert redis.lrange(start_urls_key("products"), 0, -1) == [site.url.encode()]
        # ...and a node with the right password crawls everything.
        good = Node("good-password", tmp_path,
                    node_env(redis_url, uri_for(auth_mongo, PASSWORD), DATABASE),
                    settings=settings)
        try:
            assert good.wait(180) == 0, good.tail()
        finally:
            good.stop()
        for secret in (PASSWORD, quote_plus(PASSWORD)):
            assert secret not in good.text()
    client = admin_client(auth_mongo)
    try:
        assert_matches_catalog(stored_products(client[DATABASE]["products"]),
                               expected_items(site.url, products))
        client[DATABASE]["products"].drop()
    finally:
        client.close()


# ----------------------------------------------------------------------------- TLS


class TlsMongo(MongoServer):
    """A MongoDB-wire server that only speaks TLS, with a certificate from a test CA."""

    def __init__(self, certs, **kwargs):
        self.certs = certs
        super().__init__(**kwargs)

    def command(self) -> list[str]:
        return super().command() + ["--tls-cert-file", str(self.certs / "server.pem"),
                                    "--tls-key-file", str(self.certs / "server.key")]

    def ping_options(self) -> dict:
        return {"tls": True, "tlsCAFile": str(self.certs / "ca.pem")}


def make_certs(folder):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make test certificates")
    run = lambda *args: subprocess.run([openssl, *args], cwd=folder, check=True,  # noqa: E731
                                       capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=crawlproject test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return folder


def test_tls_and_auth_options_come_from_mongo_uri(tmp_path):
    certs = make_certs(tmp_path)
    server = TlsMongo(certs, storage_path=tmp_path / "data")
    server.start()
    try:
        tls = f"tls=true&tlsCAFile={certs / 'ca.pem'}"
        create_mongo_user(f"{server.uri}?{tls}", DATABASE, USER, PASSWORD, roles=["readWrite"])
        server.stop()
        server.auth = True
        server.start()
        good = f"{uri_for(server, PASSWORD)}&{tls}"
        pipeline, stats = make_pipeline(good, DATABASE, tmp_path / "spool")
        asyncio.run(store(pipeline, [product(i) for i in range(10)]))
        assert stats.get_value("mongo/upserted") == 10
        client = pymongo.MongoClient(good)
        try:
            assert client[DATABASE]["shop"].count_documents({}) == 10
        finally:
            client.close()
        # Without the CA the certificate is refused: a clear error at open.
        untrusted, _ = make_pipeline(uri_for(server, PASSWORD) + "&tls=true", DATABASE,
                                     tmp_path / "spool",
                                     MONGO_CLIENT_OPTIONS='{"serverSelectionTimeoutMS": 1000}')
        with pytest.raises(MongoPipelineError, match="not usable") as raised:
            asyncio.run(untrusted.open_spider())
        asyncio.run(untrusted.close_spider())
        assert "certificate" in str(raised.value).lower()
        assert PASSWORD not in str(raised.value) and quote_plus(PASSWORD) not in str(raised.value)
    finally:
        server.stop()
