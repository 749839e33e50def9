"""deploy/ checked against the code: Dockerfile, docker-compose, Kubernetes and KEDA
manifests, the systemd unit and node script, Prometheus configurations.

Docker and Kubernetes do not run on this machine, so these files are parsed:
every environment variable they set is one the code (or the program started)
reads, ports agree with the settings and configurations they point at,
commands name a spider of the project and settings that exist, referenced
files exist. The healthchecks compose runs are run here against real servers
(scrapyd, Redis, an HTTP endpoint), as the image would run them."""

from __future__ import annotations

import configparser
import fnmatch
import http.server
import re
import shutil
import subprocess
import sys
import threading
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
          "SCRAPYD_USERNAME": "scrapyd", "SCRAPYD_PASSWORD": "scrapyd"}


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


def test_dockerfile_runs_unprivileged_in_a_directory_it_owns():
    stages = dockerfile_stages()
    assert {"base", "node", "scrapyd"} <= set(stages)
    base = " ".join(stages["base"])
    uid = re.search(r"useradd --system --uid (\d+) --create-home --home-dir (\S+) crawl", base)
    assert uid and "WORKDIR " + uid.group(2) in base
    for name in ("node", "scrapyd"):
        users = [line for line in stages[name] if line.startswith("USER ")]
        assert users == ["USER crawl"], name
    for line in (line for stage in stages.values() for line in stage):
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    check_env([kv.split("=")[0] for line in stages["base"] if line.startswith("ENV ")
               for kv in line[4:].split()], "Dockerfile")
    node_cmd = yaml.safe_load(next(line for line in stages["node"] if line.startswith("CMD "))[4:])
    check_command(node_cmd)
    # EXPOSE 9410 because the node's command turns metrics on, on every interface
    assert f"EXPOSE {defaults.METRICS_PORT}" in stages["node"]
    assert {"METRICS_ENABLED=True", "METRICS_HOST=0.0.0.0"} <= set(node_cmd[4::2]), node_cmd
    # the spool's home exists, owned by crawl: a volume mounted on it inherits that
    assert f"install -d -o crawl -g crawl {uid.group(2)}/.scrapy" in base
    conf = configparser.ConfigParser()
    conf.read(DEPLOY / "scrapyd-container.conf")
    assert f"EXPOSE {conf['scrapyd']['http_port']}" in stages["scrapyd"]
    # scrapyd from its hashed lock, as deploy/scrapyd-node.sh installs it
    assert re.search(r"^scrapyd==\S+ \\\n\s+--hash=", (ROOT / "requirements/scrapyd.txt").read_text(),
                     re.M)
    assert "-r /tmp/requirements/scrapyd.txt" in " ".join(stages["scrapyd"])
    for key in ("eggs_dir", "logs_dir", "dbs_dir"):
        assert conf["scrapyd"][key].startswith(uid.group(2) + "/")


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
        # an init as PID 1 forwards SIGTERM and reaps (Chromium's children too)
        assert service.get("init") is True, name
        # long enough for a node's close, and for scrapyd's wait on its jobs
        grace = seconds(service["stop_grace_period"])
        assert grace > defaults.MONGO_CLOSE_WAIT, name
        if name.startswith("scrapyd"):
            assert grace > float(scrapyd["jobs_stop_timeout"]), name
        assert set(service["depends_on"]) == {"redis", "mongo"}
        assert all(d["condition"] == "service_healthy" for d in service["depends_on"].values())
    for name in ("redis", "mongo", *nodes):
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
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


def test_the_crawler_and_redis_healthchecks_work(redis_url):
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    metrics = {f":{defaults.METRICS_PORT}/": f":{server.server_address[1]}/"}
    try:
        assert run_healthcheck(services["crawler"]["healthcheck"]["test"], metrics) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert run_healthcheck(services["crawler"]["healthcheck"]["test"], metrics) != 0
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
    copied = [source for stage in dockerfile_stages().values() for line in stage
              if line.startswith("COPY ") for source in line.split()[1:-1]]
    assert copied
    for source in copied:
        assert not dockerignored(source, patterns), source
        for path in (ROOT / source).rglob("*.py") if (ROOT / source).is_dir() else ():
            relative = str(path.relative_to(ROOT))
            if "__pycache__" not in relative and "vendor" not in relative:
                assert not dockerignored(relative, patterns), relative


def test_kubernetes_workers_and_the_keda_autoscaler():
    docs = [d for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d]
    by_kind = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    config = by_kind["ConfigMap"][0]
    check_env(config["data"], "ConfigMap")
    deployment = by_kind["Deployment"][0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    check_command(container["command"])
    # a ":latest" (or untagged) image is not pulled from a registry when it is here
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if ":" not in c["image"] or c["image"].endswith(":latest"):
                assert c.get("imagePullPolicy") in ("IfNotPresent", "Never"), c["name"]
    check_env([e["name"] for e in container.get("env", [])], "Deployment env")
    assert container["ports"][0]["containerPort"] == defaults.METRICS_PORT
    assert container["readinessProbe"]["httpGet"]["path"] == "/metrics"
    uid = re.search(r"--uid (\d+)", (DEPLOY / "Dockerfile").read_text()).group(1)
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["terminationGracePeriodSeconds"] > defaults.MONGO_CLOSE_WAIT
    assert container["volumeMounts"][0]["mountPath"] == "/crawl/.scrapy"   # the spool's home
    assert {r.get("configMapRef", {}).get("name") for r in container["envFrom"]} >= {
        config["metadata"]["name"]}
    scaled = by_kind["ScaledObject"][0]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    # the comment says how many nodes always run, and why: it matches the value
    minimum = scaled["spec"]["minReplicaCount"]
    keda = (DEPLOY / "k8s" / "keda-scaledobject.yaml").read_text()
    assert minimum >= 1 and f"(minReplicaCount: {minimum}, no scaling to zero)" in keda
    served = {f"{PREFIX}_{n}" for n in FRONTIER_GAUGES} | {f"{PREFIX}_{n}_total" for n in COUNTERS}
    triggers = {t["type"]: t["metadata"] for t in scaled["spec"]["triggers"]}
    queried = set(re.findall(r"\bcrawlproject_[a-z_]+", triggers["prometheus"]["query"]))
    assert queried and queried <= served
    assert triggers["redis"]["listName"] == start_urls_key(container["command"][2])
    auth = by_kind["TriggerAuthentication"][0]["spec"]["secretTargetRef"][0]
    assert auth["name"] in {r.get("secretRef", {}).get("name") for r in container["envFrom"]}


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
