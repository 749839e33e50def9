"""Connection settings: environment variables, defaults, redaction."""

import json
import os
import subprocess
import sys

from crawlproject.connection import is_cluster_url, redact_url


def _settings_in_subprocess(env_overrides):
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "MONGO_URI", "MONGO_DATABASE", "REDIS_CLUSTER")}
    env.update(env_overrides)
    code = ("import json; from scrapy.utils.project import get_project_settings as g; s = g();"
            "print(json.dumps({k: s.get(k) for k in ('REDIS_URL', 'MONGO_URI', 'MONGO_DATABASE',"
            " 'REDIS_CLUSTER')}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settings_have_local_defaults():
    s = _settings_in_subprocess({})
    assert s["REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert s["MONGO_URI"] == "mongodb://127.0.0.1:27017/"
    assert s["MONGO_DATABASE"] == "crawlproject"
    assert s["REDIS_CLUSTER"] is False


def test_settings_read_environment():
    s = _settings_in_subprocess({
        "REDIS_URL": "rediss://:pw@10.0.0.5:6380/2",
        "MONGO_URI": "mongodb://u:p@db:27017/?authSource=admin",
        "MONGO_DATABASE": "shop", "REDIS_CLUSTER": "true",
    })
    assert s == {"REDIS_URL": "rediss://:pw@10.0.0.5:6380/2",
                 "MONGO_URI": "mongodb://u:p@db:27017/?authSource=admin",
                 "MONGO_DATABASE": "shop", "REDIS_CLUSTER": True}


def test_redact_url_hides_passwords():
    assert redact_url("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url("rediss://:s3cret@host:6380") == "rediss://***@host:6380"
    assert redact_url("mongodb://u:p%40ss@a:1,b:2/db?authSource=admin") == \
        "mongodb://u:***@a:1,b:2/db?authSource=admin"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert "s3cret" not in redact_url("http://user:s3cret@proxy:8080")


def test_cluster_url_flag():
    assert is_cluster_url("redis://h:7000/0?cluster=true")
    assert not is_cluster_url("redis://h:7000/0")
    assert is_cluster_url("redis://h:7000/0", cluster_setting=True)
