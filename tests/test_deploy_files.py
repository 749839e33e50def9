"""deploy/ checked against the code: Dockerfile, docker-compose, Kubernetes and KEDA
manifests, the systemd unit and node script, Prometheus configurations.

Docker and Kubernetes do not run on this machine, so these files are parsed:
every environment variable they set is one the code (or the program started)
reads, ports agree with the settings and configurations they point at,
commands name a spider of the project and settings that exist, referenced
files exist."""

from __future__ import annotations

import configparser
import re
import subprocess
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
                r'environ\[\s*"([A-Z_][A-Z0-9_]+)"\]', r'env_default\(\s*"([A-Z_][A-Z0-9_]+)"']
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
    node_cmd = next(line for line in stages["node"] if line.startswith("CMD "))
    check_command(yaml.safe_load(node_cmd[4:]))
    assert f"EXPOSE {defaults.METRICS_PORT}" in stages["node"]
    conf = configparser.ConfigParser()
    conf.read(DEPLOY / "scrapyd-container.conf")
    assert f"EXPOSE {conf['scrapyd']['http_port']}" in stages["scrapyd"]
    pinned = re.search(r"^scrapyd==(\S+)", (ROOT / "requirements-dev.txt").read_text(), re.M)
    assert f"scrapyd=={pinned.group(1)}" in " ".join(stages["scrapyd"])
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
    check_env([line.split("=")[0] for line in template.strip().splitlines()], "scrapyd.env")
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
