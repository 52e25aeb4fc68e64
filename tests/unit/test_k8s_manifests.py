"""The Kubernetes manifests agree with the code they run: settings, ports, Envoy's arguments.

The manifests are read as plain YAML (no kustomize here; ``make k8s-check`` builds and
validates the overlays). A setting renamed in a settings class, or a port moved, fails here
with the manifest line to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from services.common import edge_security, envoy
from services.common.settings import env_name, from_mapping
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings
from services.features.settings import FeaturesSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.settings import GatewaySettings
from services.monitor.settings import MonitorSettings
from services.pipelines.simulate import SimulatorSettings
from services.scorer.settings import ScorerSettings
from services.updater.settings import UpdaterSettings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
BASE = K8S / "base"
KUSTOMIZATIONS = sorted(K8S.glob("**/kustomization.yaml"))
SETTINGS: tuple[type[BaseSettings], ...] = (
    GatewaySettings,
    FeaturesSettings,
    FeatureStoreSettings,
    ScorerSettings,
    SimulatorSettings,
    EventLogSettings,
    UpdaterSettings,
    DecisionLogSettings,
    MonitorSettings,
)
"""Every settings class a container reads from its environment."""
KNOWN = {env_name(cls, field): cls for cls in SETTINGS for field in cls.model_fields}
"""Environment variable → the settings class it sets."""


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


WORKLOADS = ("Deployment", "StatefulSet", "Job", "CronJob")


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"]["spec"])


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _object(kind: str, name: str) -> dict[str, Any]:
    for path in sorted(BASE.glob("*.yaml")):
        for doc in _documents(path):
            if doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in {BASE}")


def _literals(kustomization: Path) -> dict[str, dict[str, str]]:
    """Each generated ConfigMap's literals, by ConfigMap name (merged in file order)."""
    found: dict[str, dict[str, str]] = {}
    for generator in yaml.safe_load(kustomization.read_text()).get("configMapGenerator", []):
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            found.setdefault(generator["name"], {})[key] = value
    return found


def _base_settings() -> dict[str, str]:
    merged: dict[str, str] = {}
    for literals in _literals(BASE / "kustomization.yaml").values():
        merged |= literals
    return merged


def test_the_layout_has_a_base_and_the_two_overlays() -> None:
    names = {path.parent.relative_to(K8S).as_posix() for path in KUSTOMIZATIONS}
    assert {"base", "overlays/dev", "overlays/production"} <= names


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: p.parent.name)
def test_every_setting_names_a_field_of_its_service(kustomization: Path) -> None:
    for configmap, literals in _literals(kustomization).items():
        for key, value in literals.items():
            assert key in KNOWN, (
                f"{kustomization}: {configmap}: {key} is not a setting of any of "
                f"{[c.__name__ for c in SETTINGS]} (services/*/settings.py)"
            )
            assert value == value.strip(), f"{key} has surrounding blanks"


@pytest.mark.parametrize("path", sorted(K8S.glob("**/*.yaml")), ids=lambda p: p.name)
def test_every_container_variable_names_a_setting(path: Path) -> None:
    for doc in _documents(path):
        if doc.get("kind") not in WORKLOADS:
            continue
        for container in _containers(_pod(doc)):
            for variable in container.get("env", []):
                name = variable["name"]
                if name.startswith("FRAUD_"):
                    assert name in KNOWN, (
                        f"{path.name}: {doc['metadata']['name']}/{container['name']}: {name} is "
                        "not a setting (services/*/settings.py)"
                    )


def test_the_base_settings_build_valid_settings() -> None:
    env = _base_settings()
    for settings_class in SETTINGS:
        from_mapping(settings_class, env)


def test_services_and_containers_use_the_configured_ports() -> None:
    env = _base_settings()
    for name, prefix in (
        ("gateway", "FRAUD_GATEWAY_"),
        ("features", "FRAUD_FEATURES_"),
        ("scorer", "FRAUD_SCORER_"),
    ):
        port = int(env[f"{prefix}PORT"])
        service = _object("Service", name)
        assert service["spec"]["clusterIP"] == "None", f"{name}: clients balance per call"
        assert [p["port"] for p in service["spec"]["ports"]] == [port]
        container = _object("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"grpc": port, "metrics": int(env[f"{prefix}METRICS_PORT"])}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port, f"{name} {probe}"
    assert env["FRAUD_GATEWAY_FEATURES_TARGET"] == f"features:{env['FRAUD_FEATURES_PORT']}"
    assert env["FRAUD_GATEWAY_SCORER_TARGET"] == f"scorer:{env['FRAUD_SCORER_PORT']}"
    # Both follow the lifecycle, or both are pinned to one version.
    assert env.get("FRAUD_GATEWAY_MODEL_VERSION") == env.get("FRAUD_SCORER_MODEL_VERSION")


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("updater", "FRAUD_UPDATER_"),
        ("decision-sink", "FRAUD_DECISIONLOG_"),
        ("monitor", "FRAUD_MONITOR_"),
    ],
)
def test_the_live_loop_consumers_are_one_pod_each_with_their_ports(name: str, prefix: str) -> None:
    env = _base_settings()
    port = int(env[f"{prefix}PORT"])
    workload = _object("StatefulSet", name)
    # One consumer of its group: see the manifests for why (merchant windows need every
    # partition; the decision log has one writer).
    assert workload["spec"]["replicas"] == 1
    assert workload["spec"]["serviceName"] == name
    service = _object("Service", name)
    assert service["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    container = workload["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": port, "metrics": int(env[f"{prefix}METRICS_PORT"])}
    # Ready while caught up with the log; alive while the process answers (a backlog or a
    # log that is down must not restart it).
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": ""}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": port}, f"{name} {probe}"
    consumer = {v["name"]: v for v in container["env"]}["FRAUD_EVENTLOG_CONSUMER_NAME"]
    assert consumer["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    autoscaled = [
        doc["spec"]["scaleTargetRef"]["name"]
        for path in sorted(K8S.glob("**/*.yaml"))
        for doc in _documents(path)
        if doc.get("kind") == "HorizontalPodAutoscaler"
    ]
    assert name not in autoscaled


def test_the_consumer_groups_are_declared_on_the_log() -> None:
    env = _base_settings()
    groups = from_mapping(EventLogSettings, env).groups
    assert from_mapping(UpdaterSettings, env).group in groups
    assert from_mapping(DecisionLogSettings, env).group in groups
    assert from_mapping(MonitorSettings, env).group in groups


def test_envoy_runs_with_the_arguments_the_local_mesh_uses() -> None:
    container = _object("Deployment", "envoy")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["envoy"]
    assert container["args"] == envoy.envoy_args("/etc/envoy/envoy.yaml")
    image = container["image"]
    assert image.startswith("docker.io/envoyproxy/envoy:v") and "@sha256:" in image
    assert len(image.split("@sha256:")[1]) == 64


def test_the_envoy_bootstrap_is_the_template_rendered_for_cluster_dns() -> None:
    committed = (BASE / "envoy-bootstrap.yaml").read_text()
    rendered = envoy.render_config(
        listen_port=8080,
        admin_port=9901,
        gateway_port=int(_base_settings()["FRAUD_GATEWAY_PORT"]),
        listen_address="0.0.0.0",
        gateway_dns="gateway",
        # The stats listener the pod's scrape annotation names.
        stats_port=int(
            _object("Deployment", "envoy")["spec"]["template"]["metadata"]["annotations"][
                "prometheus.io/port"
            ]
        ),
    )
    rendered = edge_security.apply(rendered, edge_security.EdgeSettings())
    assert committed == rendered, "stale: run `make k8s-envoy`"
    bootstrap = yaml.safe_load(committed)
    listener = bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"]
    service_port = _object("Service", "envoy")["spec"]["ports"][0]["port"]
    assert (listener["address"], listener["port_value"]) == ("0.0.0.0", service_port)
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_every_pod_is_locked_down() -> None:
    for path in sorted(K8S.glob("**/*.yaml")):
        for doc in _documents(path):
            if doc.get("kind") not in WORKLOADS:
                continue
            pod = _pod(doc)
            where = f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["runAsUser"] > 10000, where
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert pod["automountServiceAccountToken"] is False, where
            for container in _containers(pod):
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, where
                assert context["allowPrivilegeEscalation"] is False, where
                assert context["capabilities"] == {"drop": ["ALL"]}, where
                assert {"requests", "limits"} <= container["resources"].keys(), where
