"""The Kubernetes manifests and the Dockerfile fit the CLI, the config and each other.

Nothing here needs a cluster or a Docker engine: the manifests are read as YAML, their command lines parsed
with the real CLI parser, the ConfigMap's config loaded with the real loader under the pods' environment,
and the Dockerfile read instruction by instruction.
"""

from __future__ import annotations

import itertools
import json
import posixpath
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from monitor.config.cron import build_trigger, next_fire_times
from monitor.config.loader import load_config
from tests.conftest import ROOT
from tests.support.commands import parse_cli, shutdown_grace_default

K8S = ROOT / "kubernetes"
# Prometheus Operator custom resources: not in the Kubernetes schema, checked field by field below.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
MANIFESTS = sorted(p.name for p in K8S.glob("*.yaml"))
CONFIG_PATH = "/etc/ttft-monitor/config.yaml"
# Shaped like a real API key (OpenAI/Anthropic style): must never appear in an example.
KEY_SHAPED = re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")


def load(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((K8S / name).read_text())
    assert isinstance(document, dict)
    return document


@dataclass(frozen=True)
class Container:
    workload: str  # Deployment / CronJob
    pod: dict[str, Any]  # the pod spec
    spec: dict[str, Any]
    init: bool

    @property
    def id(self) -> str:
        return f"{self.workload}/{'init:' if self.init else ''}{self.spec['name']}"

    def volume(self, name: str) -> dict[str, Any]:
        return next(v for v in self.pod["volumes"] if v["name"] == name)

    def mounts(self) -> list[dict[str, Any]]:
        return list(self.spec.get("volumeMounts", []))


def pod_specs() -> dict[str, dict[str, Any]]:
    return {
        "Deployment": load("deployment.yaml")["spec"]["template"]["spec"],
        "CronJob": load("cronjob.yaml")["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        "Housekeeping": load("housekeeping-cronjob.yaml")["spec"]["jobTemplate"]["spec"]["template"]["spec"],
    }


def containers() -> list[Container]:
    found = []
    for workload, pod in pod_specs().items():
        found += [Container(workload, pod, c, init=True) for c in pod.get("initContainers", [])]
        found += [Container(workload, pod, c, init=False) for c in pod["containers"]]
    return found


CONTAINERS = containers()
CONTAINER_IDS = [c.id for c in CONTAINERS]


def configmap_config() -> str:
    return load("configmap.yaml")["data"]["config.yaml"]


def secret_values() -> dict[str, str]:
    return dict(load("secret.example.yaml")["stringData"])


def pod_environment(container: Container, secret_dir: Path) -> dict[str, str]:
    """The container's environment as the kubelet would set it, with the example Secret's values.

    Secret files are written to `secret_dir` and *_FILE variables pointed there, since /run/secrets
    does not exist on this machine.
    """
    secrets = secret_values()
    files: dict[str, Path] = {}
    for mount in container.mounts():
        volume = container.volume(mount["name"])
        if "secret" in volume:
            for item in volume["secret"]["items"]:
                local = secret_dir / item["path"]
                local.write_text(secrets[item["key"]])
                files[posixpath.join(mount["mountPath"], item["path"])] = local
    env: dict[str, str] = {}
    for var in container.spec.get("env", []):
        if "value" in var:
            value = var["value"]
            env[var["name"]] = str(files.get(value, value)) if var["name"].endswith("_FILE") else value
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["key"]]
    return env


# ---------------------------------------------------------------- the files themselves


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_manifest_is_one_yaml_document_with_a_kind_and_name(name: str) -> None:
    document = load(name)
    assert document["apiVersion"]
    assert document["kind"]
    if document["kind"] != "Kustomization":
        assert document["metadata"]["name"].startswith("ttft-monitor")


def test_the_kustomization_lists_existing_files_and_only_one_variant() -> None:
    resources = load("kustomization.yaml")["resources"]
    assert all((K8S / name).is_file() for name in resources)
    assert {"configmap.yaml", "deployment.yaml"} <= set(resources)
    # Both variants at once would probe every target twice per tick.
    assert not {"deployment.yaml", "cronjob.yaml"} <= set(resources)
    # Applying placeholders would overwrite the real Secret.
    assert "secret.example.yaml" not in resources
    assert "cronjob.yaml" in (K8S / "kustomization.yaml").read_text(), "say how to switch to the CronJob"
    assert "housekeeping-cronjob.yaml" in (K8S / "kustomization.yaml").read_text(), "and how it keeps house"


def test_the_manifests_match_the_kubernetes_schema() -> None:
    validate = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate is not installed: add it to the test extra to check the manifests "
        "against the Kubernetes schema",
    )
    for name in MANIFESTS:
        document = load(name)
        if document["kind"] != "Kustomization" and document["kind"] not in OPERATOR_KINDS:
            validate.validate(document, "1.30.0", strict=True)


# ---------------------------------------------------------------- Prometheus Operator resources

SERVICE_MONITOR_KEYS = {"selector", "endpoints", "namespaceSelector", "jobLabel"}
ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme"}
DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")


def check_operator_metadata(document: dict[str, Any]) -> None:
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    metadata = document["metadata"]
    assert set(metadata) <= {"name", "labels", "namespace", "annotations"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", metadata["name"])
    # kube-prometheus-stack selects operator resources by the Helm release label.
    assert "release" in metadata["labels"]
    assert all(isinstance(v, str) for v in metadata["labels"].values())


@pytest.mark.parametrize("name", ["servicemonitor.yaml", "pushgateway-servicemonitor.yaml"])
def test_the_service_monitors_have_the_operators_shape(name: str) -> None:
    document = load(name)
    assert document["kind"] == "ServiceMonitor"
    check_operator_metadata(document)
    spec = document["spec"]
    assert set(spec) <= SERVICE_MONITOR_KEYS
    assert spec["selector"]["matchLabels"] and all(isinstance(v, str) for v in spec["selector"]["matchLabels"].values())
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= ENDPOINT_KEYS, set(endpoint) - ENDPOINT_KEYS
        assert isinstance(endpoint["port"], str), "endpoints name the Service's port"
        assert endpoint["path"] == "/metrics"
        for key in ("interval", "scrapeTimeout"):
            if key in endpoint:
                assert DURATION.match(endpoint[key]), endpoint[key]


def test_the_service_monitor_finds_the_daemon_through_its_service() -> None:
    service = load("service.yaml")
    monitor = load("servicemonitor.yaml")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert endpoint["port"] in ports
    # The Service reaches the daemon's pods and its named container port.
    template = load("deployment.yaml")["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    assert ports[endpoint["port"]]["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_pushgateway_is_scraped_with_the_pushed_labels_kept() -> None:
    (endpoint,) = load("pushgateway-servicemonitor.yaml")["spec"]["endpoints"]
    # Without honorLabels the gateway's own `job` and `instance` would replace the pushed ones.
    assert endpoint["honorLabels"] is True


def test_the_cronjob_variant_pushes_to_the_pushgateway(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    config = load_config(path, environ={"PGPASSWORD": "x", "OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "x"})
    assert config.metrics.pushgateway
    (container,) = load("cronjob.yaml")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "once" and "--job" in container["args"]


def test_the_prometheus_rule_carries_the_rules_file_unchanged() -> None:
    rule = load("prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule"
    check_operator_metadata(rule)
    assert set(rule["spec"]) == {"groups"}
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules["groups"]
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for entry in group["rules"]:
            assert ("record" in entry) != ("alert" in entry)
            assert set(entry) <= {"record", "alert", "expr", "for", "labels", "annotations"}
            assert isinstance(entry["expr"], str)


def test_the_prometheus_rule_file_is_what_the_generator_writes() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "prometheus" / "kubernetes.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- command lines


EXPECTED_COMMANDS = {
    ("Deployment", False): "run",
    ("CronJob", False): "once",
    ("Deployment", True): "db",
    ("CronJob", True): "db",
    ("Housekeeping", False): "db",
}


@pytest.mark.parametrize("container", CONTAINERS, ids=CONTAINER_IDS)
def test_container_args_are_a_valid_command_line(container: Container) -> None:
    args = container.spec["args"]
    assert "command" not in container.spec, "keep the image's ENTRYPOINT (ttft-monitor); pass args only"
    assert args[0] == EXPECTED_COMMANDS[(container.workload, container.init)]
    if container.init:
        assert args[:2] == ["db", "upgrade"]
    if container.workload == "Housekeeping":
        assert args[:2] == ["db", "housekeep"]
    parsed = parse_cli(args)
    assert parsed.config == CONFIG_PATH


@pytest.mark.parametrize("container", CONTAINERS, ids=CONTAINER_IDS)
def test_the_config_is_mounted_where_the_command_reads_it(container: Container) -> None:
    config_path = PurePosixPath(container.spec["args"][container.spec["args"].index("--config") + 1])
    configmap = load("configmap.yaml")
    sources = []
    for mount in container.mounts():
        volume = container.volume(mount["name"])
        if volume.get("configMap", {}).get("name") != configmap["metadata"]["name"]:
            continue
        items = {item["path"]: item["key"] for item in volume["configMap"].get("items", [])}
        if "subPath" in mount:
            if PurePosixPath(mount["mountPath"]) == config_path:
                sources.append(items.get(mount["subPath"], mount["subPath"]))
        elif PurePosixPath(mount["mountPath"]) == config_path.parent:
            sources.append(items.get(config_path.name, config_path.name) if items else config_path.name)
    assert len(sources) == 1, f"{config_path} should come from exactly one ConfigMap mount, found {sources}"
    assert sources[0] in configmap["data"]


def test_the_init_containers_see_what_the_main_containers_see() -> None:
    """`db upgrade` loads the same config, so it needs the same variables, secrets and mounts."""
    for workload, pod in pod_specs().items():
        if workload == "Housekeeping":  # the probing CronJob's init container migrates for it
            assert "initContainers" not in pod
            continue
        (init,) = pod["initContainers"]
        (main,) = pod["containers"]
        assert init["image"] == main["image"], workload
        assert init["env"] == main["env"], workload
        assert init["volumeMounts"] == main["volumeMounts"], workload
        assert init["securityContext"] == main["securityContext"], workload


# ---------------------------------------------------------------- the config the pods load


@pytest.mark.parametrize("container", CONTAINERS, ids=CONTAINER_IDS)
def test_the_configmap_loads_with_the_pods_environment(container: Container, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    env = pod_environment(container, secret_dir)
    config = load_config(path, environ=env)
    assert config.database.url.startswith("postgresql+asyncpg://")
    assert secret_values()["PGPASSWORD"] in config.database.url
    assert config.metrics.listen == "0.0.0.0:9464"
    assert config.metrics.pushgateway
    for provider in config.providers.values():
        if provider.api_key_env:
            # The key came from the mounted Secret file, named by the *_FILE variable the pod sets.
            assert f"{provider.api_key_env}_FILE" in env


def test_every_secret_key_the_pods_use_is_in_the_example() -> None:
    used: set[str] = set()
    for container in CONTAINERS:
        for var in container.spec.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == "ttft-monitor-secrets"
                used.add(ref["key"])
    for pod in pod_specs().values():
        for volume in pod["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["secretName"] == "ttft-monitor-secrets"
                used |= {item["key"] for item in volume["secret"]["items"]}
    assert used
    assert used <= set(secret_values())


@pytest.mark.parametrize("container", CONTAINERS, ids=CONTAINER_IDS)
def test_file_variables_name_mounted_secret_files(container: Container) -> None:
    mounted = set()
    for mount in container.mounts():
        volume = container.volume(mount["name"])
        if "secret" in volume:
            mounted |= {posixpath.join(mount["mountPath"], item["path"]) for item in volume["secret"]["items"]}
    file_vars = {v["name"]: v["value"] for v in container.spec["env"] if v["name"].endswith("_FILE")}
    assert file_vars
    assert set(file_vars.values()) <= mounted


def test_the_secret_example_holds_placeholders_only() -> None:
    for name, value in secret_values().items():
        assert "REPLACE" in value, f"{name}: an example value should say it is a placeholder"
    for path in [*K8S.glob("*"), ROOT / "Dockerfile", *(ROOT / "systemd").glob("*"), ROOT / "docs" / "deploy.md"]:
        assert not KEY_SHAPED.search(path.read_text()), f"{path.name} contains something shaped like an API key"


def test_the_state_dir_is_a_writable_emptydir_in_every_container(tmp_path: Path) -> None:
    """The root file system is read-only: the spool must land on a volume."""
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    env = {"PGPASSWORD": "x", "OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "x"}
    database = load_config(path, environ=env).database
    for container in CONTAINERS:
        mounts = [m for m in container.mounts() if PurePosixPath(m["mountPath"]) == PurePosixPath(database.state_dir)]
        assert len(mounts) == 1, f"{container.id}: nothing mounted at state_dir {database.state_dir}"
        assert not mounts[0].get("readOnly", False)
        volume = container.volume(mounts[0]["name"])
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume
        if "emptyDir" in volume:
            # Going over an emptyDir's sizeLimit gets the pod evicted: the spool cap must hit first.
            assert quantity_mib(volume["emptyDir"]["sizeLimit"]) > database.spool_max_mb


def quantity_mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", quantity)
    assert match, f"not a Kubernetes quantity: {quantity}"
    number, unit = match.groups()
    return float(number) * units[unit] if unit else float(number) / 2**20


# ---------------------------------------------------------------- pod and container settings


@pytest.mark.parametrize("workload", ["Deployment", "CronJob"])
def test_pods_run_as_non_root_with_the_default_seccomp_profile(workload: str) -> None:
    pod = pod_specs()[workload]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == dockerfile_uid()
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("container", CONTAINERS, ids=CONTAINER_IDS)
def test_containers_are_locked_down_and_bounded(container: Container) -> None:
    security = container.spec["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    resources = container.spec["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert {"cpu", "memory"} <= set(resources["limits"])


@pytest.mark.parametrize("workload", ["Deployment", "CronJob"])
def test_pods_outlive_the_shutdown_grace(workload: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    configured = load_config(path, environ={"PGPASSWORD": "x", "OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "x"})
    grace = pod_specs()[workload]["terminationGracePeriodSeconds"]
    assert grace > configured.shutdown_grace_s
    assert grace > shutdown_grace_default()


def test_the_deployment_runs_one_daemon_with_health_probes() -> None:
    deployment = load("deployment.yaml")
    assert deployment["spec"]["replicas"] == 1
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9464}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    assert annotations["prometheus.io/path"] == "/metrics"
    labels = template["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_daemon_listens_on_the_port_the_pod_declares(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    listen = load_config(path, environ={"PGPASSWORD": "x", "OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "x"})
    (container,) = pod_specs()["Deployment"]["containers"]
    assert listen.metrics.listen == f"0.0.0.0:{container['ports'][0]['containerPort']}"


def test_the_cronjob_never_overlaps_or_retries() -> None:
    cronjob = load("cronjob.yaml")["spec"]
    job = cronjob["jobTemplate"]["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"
    assert cronjob["startingDeadlineSeconds"] > 0
    assert cronjob["successfulJobsHistoryLimit"] >= 1
    assert cronjob["failedJobsHistoryLimit"] >= 1
    assert job["backoffLimit"] <= 1
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    # A stuck run is ended, stop grace included, before the next is due.
    times = next_fire_times(build_trigger(cronjob["schedule"], cronjob["timeZone"]), datetime.now(UTC), 3)
    period = min((b - a).total_seconds() for a, b in itertools.pairwise(times))
    assert job["activeDeadlineSeconds"] + job["template"]["spec"]["terminationGracePeriodSeconds"] <= period
    assert cronjob["startingDeadlineSeconds"] < period


def test_the_cronjob_runs_its_job_on_the_jobs_own_schedule(tmp_path: Path) -> None:
    cronjob = load("cronjob.yaml")["spec"]
    (container,) = cronjob["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = parse_cli(container["args"])
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    config = load_config(path, environ={"PGPASSWORD": "x", "OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "x"})
    names = args.job if isinstance(args.job, list) else [args.job]
    assert names, "name the job, so a second job added to the ConfigMap does not silently run every 5 minutes"
    for name in names:
        job = config.job(name)
        assert job.schedule == cronjob["schedule"]
        assert job.timezone == cronjob["timeZone"]


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += " " + line.removesuffix("\\").strip()
        if line.endswith("\\"):
            continue
        word, _, rest = pending.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
        pending = ""
    return instructions


def stages() -> Iterator[list[tuple[str, str]]]:
    stage: list[tuple[str, str]] = []
    for instruction in dockerfile():
        if instruction[0] == "FROM" and stage:
            yield stage
            stage = []
        stage.append(instruction)
    yield stage


def final_stage() -> list[tuple[str, str]]:
    return list(stages())[-1]


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"use the exec form: {text}"
    return value


def dockerfile_uid() -> int:
    users = [args for word, args in final_stage() if word == "USER"]
    assert users, "the image must not run as root"
    return int(users[-1].split(":")[0])


def test_the_image_builds_in_stages_from_python_311_slim() -> None:
    bases = [args.split()[0] for word, args in dockerfile() if word == "FROM"]
    assert len(bases) >= 2, "build in one stage, run from a clean one"
    assert all(base == "python:3.11-slim" for base in bases)


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    assert dockerfile_uid() == 10001


def test_the_image_installs_the_package_from_the_source_tree() -> None:
    build = next(stages())
    runs = " ".join(args for word, args in build if word == "RUN")
    assert re.search(r"pip install \.(\s|$)", runs)
    assert ("COPY", ". .") in build


def test_the_image_ships_the_migrations_where_the_code_looks_for_them() -> None:
    # `pip install .` puts migrations/ inside the package (monitor._migrations, see pyproject.toml and
    # tests/unit/test_packaging.py), where monitor.store.migrate looks when there is no source checkout.
    runs = " ".join(args for word, args in dockerfile() if word == "RUN")
    assert "cp -r migrations" not in runs, "the migrations are in the package: no copy step"


def test_the_entrypoint_and_cmd_run_the_daemon_on_the_manifests_config_path() -> None:
    stage = final_stage()
    (entrypoint,) = [exec_form(args) for word, args in stage if word == "ENTRYPOINT"]
    (cmd,) = [exec_form(args) for word, args in stage if word == "CMD"]
    assert entrypoint == ["ttft-monitor"]
    parsed = parse_cli(cmd)
    assert parsed.command == "run"
    assert parsed.config == CONFIG_PATH


def test_the_image_logs_unbuffered_and_bakes_in_no_secrets() -> None:
    env_text = " ".join(args for word, args in final_stage() if word == "ENV")
    assert "PYTHONUNBUFFERED=1" in shlex.split(env_text)
    for word, args in dockerfile():
        if word in {"ENV", "ARG"}:
            assert not re.search(r"(KEY|TOKEN|PASSWORD|SECRET)\w*=", args, flags=re.I), f"{word} {args}"
    assert not [args for word, args in dockerfile() if word == "ADD"], "COPY only: ADD can fetch URLs"


@pytest.mark.parametrize(
    "pattern", [".git", ".venv", "state", "**/*.db", "**/.env", "**/*.key", "**/*.pem", "**/__pycache__"]
)
def test_dockerignore_keeps_local_state_and_secrets_out_of_the_build(pattern: str) -> None:
    lines = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert pattern in lines


def test_dockerignore_keeps_what_pip_install_needs() -> None:
    lines = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not {"monitor", "pyproject.toml", "README.md", "migrations"} & lines


# ---------------------------------------------------------------- the status pages are never open beyond loopback


def test_the_daemon_protects_its_pages_with_the_token_from_the_secret(tmp_path: Path) -> None:
    from monitor.config.check import unprotected_listen
    from monitor.web.serve import guard_from_config

    (daemon,) = [c for c in CONTAINERS if c.workload == "Deployment" and not c.init]
    path = tmp_path / "config.yaml"
    path.write_text(configmap_config())
    env = pod_environment(daemon, tmp_path)
    config = load_config(path, environ=env)
    assert unprotected_listen(config) is None
    assert guard_from_config(config, env).token == secret_values()["web-token"]


def image_environment() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in final_stage():
        if word == "ENV":
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def test_the_images_example_config_needs_a_token_and_a_laptops_does_not(tmp_path: Path) -> None:
    from monitor.config.check import unprotected_listen
    from monitor.web.serve import WebConfigError, guard_from_config

    in_image = load_config(ROOT / "config.yaml", environ=image_environment())
    assert in_image.metrics.listen == "0.0.0.0:9464" and in_image.web.token_env == "TTFT_WEB_TOKEN"
    assert unprotected_listen(in_image) is None
    with pytest.raises(WebConfigError, match="TTFT_WEB_TOKEN, which is not set"):
        guard_from_config(in_image, image_environment())
    (tmp_path / "web-token").write_text("0123abcd\n")
    token_file = {**image_environment(), "TTFT_WEB_TOKEN_FILE": str(tmp_path / "web-token")}
    assert guard_from_config(in_image, token_file).token == "0123abcd"
    on_a_laptop = load_config(ROOT / "config.yaml", environ={})
    assert on_a_laptop.metrics.listen == "127.0.0.1:9464" and on_a_laptop.web.token_env is None
    assert unprotected_listen(on_a_laptop) is None
