"""What the Kubernetes deployment relies on, checked with real processes on this machine.

- The Envoy template ships inside the package: a normal (non-editable) install renders it.
- The rendering for cluster DNS passes ``envoy --mode validate``.
- Channels spread calls over every address of a name (round robin), as the gateway needs
  behind a headless Service.
- Every overlay, built with kustomize: each container's environment, resolved from its
  ConfigMaps as the kubelet would, names only real settings and builds each settings class
  its process reads; the gateways, the feature updater and the decision sink read one and
  the same event log, on a backend pods can share and reach (persistent Redis Streams, or
  Kafka brokers in an allowed address range); the NetworkPolicy labels follow what each
  pod's processes use; state the live loop keeps lives on volumes that outlive its pods;
  shutdowns fit in their grace periods.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from unittest import mock
from urllib.parse import urlsplit

import grpc
import pytest
import yaml
from pydantic_settings import BaseSettings

from services.common import channels, envoy
from services.common.settings import env_name
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings
from services.features.settings import FeaturesSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.settings import GatewaySettings
from services.mesh import Process, free_port, http_ok
from services.monitor.settings import MonitorSettings
from services.pipelines.simulate import SimulatorSettings
from services.scorer.settings import ScorerSettings
from services.updater.partitions import group_id
from services.updater.settings import UpdaterSettings

S = TypeVar("S", bound=BaseSettings)

REPO = Path(__file__).resolve().parents[2]


def test_a_normal_install_finds_the_envoy_template(tmp_path: Path) -> None:
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("fraudmesh-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300
    )
    script = (
        "from services.common import envoy\n"
        "print(envoy.TEMPLATE)\n"
        "text = envoy.render_config(listen_port=8080, admin_port=9901, gateway_port=50051)\n"
        "assert 'port_value: 50051' in text\n"
    )
    # The installed copy comes first on the path, and the working directory is elsewhere:
    # nothing can be found through the checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == site / "services" / "common" / "envoy.yaml.tmpl"


def test_the_cluster_rendering_validates(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(
        envoy.render_config(
            listen_port=8080,
            admin_port=9901,
            gateway_port=50051,
            listen_address="0.0.0.0",
            gateway_dns="gateway.fraudmesh.svc.cluster.local",
        )
    )
    checked = subprocess.run(
        [str(envoy.envoy_binary()), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = config.read_text()
    assert "envoy.cluster.dns" in text and "type: STATIC" not in text
    assert "address: 0.0.0.0, port_value: 8080" in text
    assert "address: gateway.fraudmesh.svc.cluster.local, port_value: 50051" in text


def test_the_cluster_rendering_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="DNS name"):
        envoy.render_config(
            listen_port=8080, admin_port=9901, gateway_port=50051, gateway_dns="Gate_way"
        )
    with pytest.raises(ValueError, match="no extra ports"):
        envoy.render_config(
            listen_port=8080,
            admin_port=9901,
            gateway_port=50051,
            gateway_dns="gateway",
            extra_gateway_ports=(50061,),
        )
    with pytest.raises(ValueError, match="IP address"):
        envoy.render_config(
            listen_port=8080, admin_port=9901, gateway_port=50051, listen_address="localhost"
        )
    # The gateway runs elsewhere: its port may equal Envoy's own.
    envoy.render_config(listen_port=8080, admin_port=9901, gateway_port=8080, gateway_dns="gw")


def test_envoy_command_is_the_binary_and_envoy_args(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    assert envoy.envoy_command(config) == [str(envoy.envoy_binary()), *envoy.envoy_args(config)]


async def test_channels_spread_calls_over_every_address() -> None:
    method = "/fraudmesh.test.Echo/Who"
    servers, ports = [], []
    for index in range(2):

        def who(request: bytes, context: grpc.aio.ServicerContext, index: int = index) -> bytes:
            return bytes([index])

        handler = grpc.method_handlers_generic_handler(
            "fraudmesh.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(who)}
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    try:
        # One target, two addresses: what a headless Service with two ready pods resolves to.
        target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
        async with channels.insecure_channel(target) as channel:
            call = channel.unary_unary(method)
            await asyncio.wait_for(channel.channel_ready(), 30)
            answers = [await call(b"", timeout=10) for _ in range(40)]
    finally:
        for server in servers:
            await server.stop(0)
    assert {answer[0] for answer in answers} == {0, 1}


# --- The built overlays: every process gets settings it can use, and they agree --------------

OVERLAYS_DIR = REPO / "deploy" / "k8s" / "overlays"
OVERLAYS = sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").is_file())
SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
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
KNOWN_VARIABLES = {env_name(c, f) for c in SETTINGS_CLASSES for f in c.model_fields}
"""Every environment variable some settings class reads."""
OPERATOR_SHELL = "kubectl exec"
"""A container that idles for operators to run ``fraudmesh model|decisions`` in."""
READS: dict[str, tuple[type[BaseSettings], ...]] = {
    "services.gateway": (GatewaySettings, EventLogSettings),
    "services.features": (FeaturesSettings, FeatureStoreSettings),
    "services.scorer": (ScorerSettings,),
    "services.updater": (UpdaterSettings, FeatureStoreSettings, EventLogSettings),
    "services.decisionlog": (DecisionLogSettings, EventLogSettings),
    "services.monitor": (MonitorSettings, EventLogSettings),
    "fraudmesh features": (FeatureStoreSettings, SimulatorSettings),
    "fraudmesh train": (FeatureStoreSettings,),
    "fraudmesh autopilot": (FeatureStoreSettings,),
    "fraudmesh decisions": (DecisionLogSettings,),
    "python -c": (FeatureStoreSettings,),
    OPERATOR_SHELL: (FeatureStoreSettings, DecisionLogSettings),
}
"""The settings classes each process builds from its environment (its ``__main__``)."""
STORE_WRITERS = ("services.features", "services.updater", "fraudmesh features materialize")
"""Processes that open the online store (Redis in the cluster)."""
FOREIGN_BINARIES = ("envoy", "redis-server")
"""Containers from other images, which read no fraudmesh settings."""


@dataclass(frozen=True)
class Container:
    """One container of a built overlay, with its environment resolved as the kubelet would."""

    workload: dict[str, Any]
    pod: dict[str, Any]
    spec: dict[str, Any]
    env: dict[str, str]

    @property
    def where(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}/{self.spec['name']}"

    @property
    def labels(self) -> dict[str, str]:
        template = self.workload["spec"]
        if self.workload["kind"] == "CronJob":
            template = template["jobTemplate"]["spec"]
        return dict(template["template"]["metadata"].get("labels", {}))

    @property
    def process(self) -> str | None:
        """``services.<name>``, ``fraudmesh <command> [<subcommand>]``, ``python -c``, or None."""
        argv = [*self.spec.get("command", []), *self.spec.get("args", [])]
        if argv[0] in FOREIGN_BINARIES:
            return None
        if argv[0] == "sleep":
            return OPERATOR_SHELL
        if argv[:2] == ["python", "-m"]:
            return argv[2]
        if argv[:2] == ["python", "-c"]:
            return "python -c"
        assert argv[0] == "fraudmesh", f"{self.where}: unknown entry point {argv}"
        return " ".join(argv[:3]) if argv[1] == "features" else " ".join(argv[:2])

    def reads(self) -> tuple[type[BaseSettings], ...]:
        process = self.process
        if process is None:
            return ()
        key = "fraudmesh features" if process.startswith("fraudmesh features") else process
        assert key in READS, f"{self.where}: which settings does {process!r} read?"
        return READS[key]

    def settings(self, settings_class: type[S]) -> S:
        """The settings this container's process builds (pydantic-settings parses the env)."""
        with mock.patch.dict(os.environ, self.env, clear=True):
            return settings_class()

    def mount_of(self, path: Path) -> Mount:
        """Where ``path`` lies: the deepest volume mounted above it."""
        mounts = [
            m
            for m in self.spec.get("volumeMounts", [])
            if Path(m["mountPath"]) in (path, *path.parents)
        ]
        assert mounts, f"{self.where}: {path} is on no volume (the root filesystem is read-only)"
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        for template in self.workload["spec"].get("volumeClaimTemplates", []):
            volumes[template["metadata"]["name"]] = {"claimTemplate": template}
        volume = volumes[mount["name"]]
        if "claimTemplate" in volume:
            claim = f"{mount['name']}-{self.workload['metadata']['name']}-0"
        else:
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        read_only = mount.get("readOnly", False) or volume.get("persistentVolumeClaim", {}).get(
            "readOnly", False
        )
        inside = PurePosixPath(mount.get("subPath", "")) / path.relative_to(mount["mountPath"])
        return Mount(volume, claim, inside, not read_only)


@dataclass(frozen=True)
class Mount:
    """Where a path of one container lies."""

    volume: dict[str, Any]
    """The pod's volume, or ``{"claimTemplate": …}`` for a StatefulSet's claim template."""
    claim: str | None
    """The PersistentVolumeClaim (a claim template's as the StatefulSet names it), if any."""
    inside: PurePosixPath
    """The path inside the volume."""
    writable: bool

    @property
    def place(self) -> tuple[str | None, PurePosixPath]:
        """The claim and the path inside it: the same place for every pod that mounts it."""
        return self.claim, self.inside


@dataclass(frozen=True)
class Built:
    """The objects of one overlay, as `kustomize build` writes them."""

    name: str
    docs: tuple[dict[str, Any], ...]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.all(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    def containers(self) -> list[Container]:
        maps = {d["metadata"]["name"]: d.get("data", {}) for d in self.all("ConfigMap")}
        found = []
        for workload in self.docs:
            if workload["kind"] not in ("Deployment", "StatefulSet", "Job", "CronJob"):
                continue
            spec = workload["spec"]
            if workload["kind"] == "CronJob":
                spec = spec["jobTemplate"]["spec"]
            pod = spec["template"]["spec"]
            pod_name = workload["metadata"]["name"] + (
                "-0" if workload["kind"] == "StatefulSet" else "-pod"
            )
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                env: dict[str, str] = {}
                for source in container.get("envFrom", []):
                    if "configMapRef" in source:
                        name = source["configMapRef"]["name"]
                        assert name in maps, f"{self.name}: no ConfigMap {name} (a typo?)"
                        env |= maps[name]
                    else:
                        # Secrets are the operator's; they may only add to the ConfigMaps.
                        assert source["secretRef"].get("optional") is True, container["name"]
                for variable in container.get("env", []):
                    if "value" in variable:
                        env[variable["name"]] = variable["value"]
                    else:
                        field = variable["valueFrom"]["fieldRef"]["fieldPath"]
                        assert field == "metadata.name", field
                        env[variable["name"]] = pod_name
                found.append(Container(workload, pod, container, env))
        return found

    def processes(self, process: str) -> list[Container]:
        return [c for c in self.containers() if c.process == process]


def _kustomize() -> list[str]:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    gopath = subprocess.run(
        ["go", "env", "GOPATH"], capture_output=True, text=True, check=False, timeout=60
    ).stdout.strip()
    standalone = Path(gopath) / "bin" / "kustomize"
    if not standalone.is_file():
        pytest.fail("neither kubectl nor kustomize found: run `make tools`")
    return [str(standalone), "build"]


@pytest.fixture(scope="module", params=OVERLAYS)
def built(request: pytest.FixtureRequest) -> Built:
    name = str(request.param)
    out = subprocess.run(
        [*_kustomize(), str(OVERLAYS_DIR / name)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return Built(name, tuple(d for d in yaml.safe_load_all(out) if d))


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def test_every_container_builds_its_settings_from_known_variables(built: Built) -> None:
    for container in built.containers():
        for name in container.env:
            if name.startswith("FRAUD_"):
                assert name in KNOWN_VARIABLES, (
                    f"{built.name}: {container.where}: {name} is not a setting of any of "
                    f"{[c.__name__ for c in SETTINGS_CLASSES]}"
                )
        for settings_class in container.reads():
            container.settings(settings_class)


def test_the_live_loop_runs_in_every_overlay(built: Built) -> None:
    for name in ("updater", "decision-sink"):
        workload = built.get("StatefulSet", name)
        assert workload["spec"]["replicas"] == 1, f"{name}: one consumer of its group"
        service = built.get("Service", workload["spec"]["serviceName"])
        assert _selects(service["spec"]["selector"], _pod_labels(workload))
        budget = built.get("PodDisruptionBudget", name)
        assert _selects(budget["spec"]["selector"]["matchLabels"], _pod_labels(workload))
    assert {c.process for c in built.containers()} >= {
        "services.gateway",
        "services.updater",
        "services.decisionlog",
        "fraudmesh decisions",
    }
    for target in built.all("HorizontalPodAutoscaler"):
        assert target["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    (gateway,) = built.processes("services.gateway")
    assert gateway.settings(GatewaySettings).emit_events


def test_every_reader_and_writer_of_the_event_log_uses_the_same_log(built: Built) -> None:
    users = [c for c in built.containers() if EventLogSettings in c.reads()]
    assert {c.process for c in users} == {
        "services.gateway",
        "services.updater",
        "services.decisionlog",
        "services.monitor",
    }
    views = {
        c.where: c.settings(EventLogSettings).model_dump(exclude={"consumer_name"}) for c in users
    }
    first = next(iter(views.values()))
    for where, view in views.items():
        assert view == first, f"{built.name}: {where} reads another event log"
    log = users[0].settings(EventLogSettings)
    assert log.backend != "file", "pods cannot share the file log"
    for consumer, settings_class in (
        ("services.updater", UpdaterSettings),
        ("services.decisionlog", DecisionLogSettings),
        ("services.monitor", MonitorSettings),
    ):
        (container,) = built.processes(consumer)
        group = container.settings(settings_class).group  # type: ignore[attr-defined]
        assert group in log.groups, f"{consumer}: group {group} is not declared on the log"
        # A stable name per pod: its Redis consumer, its Kafka static member.
        assert container.settings(EventLogSettings).consumer_name.endswith("-0")


def test_the_event_log_backend_is_reachable_as_configured(built: Built) -> None:
    (gateway,) = built.processes("services.gateway")
    log = gateway.settings(EventLogSettings)
    egress = built.get("NetworkPolicy", "eventlog-clients")["spec"]["egress"]
    allowed_ports = {p["port"] for rule in egress for p in rule["ports"]}
    if log.backend == "redis":
        url = urlsplit(log.redis_url)
        assert url.hostname is not None and url.port is not None
        service = built.get("Service", url.hostname)
        assert url.port in [p["port"] for p in service["spec"]["ports"]]
        (server,) = [
            w
            for w in built.all("StatefulSet")
            if _selects(service["spec"]["selector"], _pod_labels(w))
        ]
        container = server["spec"]["template"]["spec"]["containers"][0]
        argv = container["command"]
        options = dict(zip(argv[1::2], argv[2::2], strict=True))
        # Streams hold the only copy of unconsumed events: persisted, never evicted.
        assert options["--appendonly"] == "yes"
        assert options["--maxmemory-policy"] == "noeviction"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        claims = {t["metadata"]["name"] for t in server["spec"]["volumeClaimTemplates"]}
        assert mounts[options["--dir"]] in claims
        assert url.port in allowed_ports
        for rule in egress:
            for peer in rule["to"]:
                assert _selects(peer["podSelector"]["matchLabels"], _pod_labels(server))
        ingress = built.get("NetworkPolicy", server["metadata"]["name"])["spec"]["ingress"]
        admitted = ingress[0]["from"][0]["podSelector"]["matchLabels"]
        assert admitted == {"fraudmesh.io/eventlog-client": "true"}
    else:
        assert log.backend == "kafka"
        default = EventLogSettings.model_fields["kafka_bootstrap"].default
        assert log.kafka_bootstrap != default, "the brokers' addresses are the overlay's"
        for server in log.kafka_bootstrap.split(","):
            assert int(server.rsplit(":", 1)[1]) in allowed_ports, server
        # The brokers are outside the cluster: only their address range.
        assert all("ipBlock" in peer for rule in egress for peer in rule["to"])


def test_pods_may_reach_exactly_what_their_processes_use(built: Built) -> None:
    pods: dict[str, list[Container]] = {}
    for container in built.containers():
        workload = container.workload
        pods.setdefault(f"{workload['kind']}/{workload['metadata']['name']}", []).append(container)
    for where, containers in pods.items():
        labels = containers[0].labels
        uses_log = any(EventLogSettings in c.reads() for c in containers)
        assert (labels.get("fraudmesh.io/eventlog-client") == "true") == uses_log, where
        writes_store = any(
            c.process is not None and c.process.startswith(STORE_WRITERS) for c in containers
        )
        if writes_store:
            assert labels.get("fraudmesh.io/store-client") == "true", where


def test_state_lives_where_it_survives(built: Built) -> None:
    (updater,) = built.processes("services.updater")
    states = updater.mount_of(updater.settings(UpdaterSettings).state_file)
    assert "claimTemplate" in states.volume and states.writable, "states outlive the pod"
    data = updater.mount_of(updater.settings(FeatureStoreSettings).data_path)
    assert data.place == ("fraudmesh-state", PurePosixPath("data"))
    # Its init container waits for the dataset where the updater will seed from it.
    (waiter,) = built.processes("python -c")
    assert waiter.workload is updater.workload
    assert waiter.mount_of(waiter.settings(FeatureStoreSettings).data_path).place == data.place
    for writer in (updater, *built.processes("services.features")):
        assert writer.mount_of(writer.settings(FeatureStoreSettings).registry_file).writable

    (gateway,) = built.processes("services.gateway")
    events = gateway.settings(EventLogSettings)
    spill = gateway.mount_of(events.spill_path)
    assert spill.writable and "emptyDir" in spill.volume
    # Two producers' spill files fit (a restarted container adopts its predecessor's),
    # and the pod's storage limit covers its folders: a full spill drops, never evicts.
    assert _bytes(spill.volume["emptyDir"]["sizeLimit"]) >= 2 * events.spill_max_bytes
    folders = sum(
        _bytes(v["emptyDir"]["sizeLimit"]) for v in gateway.pod["volumes"] if "emptyDir" in v
    )
    assert _bytes(gateway.spec["resources"]["limits"]["ephemeral-storage"]) > folders


def test_a_partitioned_updater_group_keeps_its_states_where_every_member_reaches_them(
    built: Built,
) -> None:
    (updater,) = built.processes("services.updater")
    settings = updater.settings(UpdaterSettings)
    scaled = [
        d for d in built.all("ScaledObject") if d["spec"]["scaleTargetRef"]["name"] == "updater"
    ]
    if not settings.partitioned:
        assert not scaled, f"{built.name}: a single updater must not be scaled"
        return
    # Every member mounts the group's folder from one ReadWriteMany claim (never a claim
    # template: a partition's state moves from pod to pod), writable.
    group = updater.mount_of(settings.partition_dir)
    assert group.writable and group.claim is not None, "the group's states on a shared claim"
    claim = built.get("PersistentVolumeClaim", group.claim)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # Each member is its own consumer (the pod's name), on the Kafka log the gateways write.
    assert updater.settings(EventLogSettings).backend == "kafka"
    consumer = {v["name"]: v for v in updater.spec["env"]}["FRAUD_EVENTLOG_CONSUMER_NAME"]
    assert consumer["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # KEDA scales it on the group's lag, at most to the partition count.
    (scaler,) = scaled
    assert scaler["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    events = updater.settings(EventLogSettings)
    (trigger,) = scaler["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == group_id(settings.group)
    assert trigger["metadata"]["bootstrapServers"] == events.kafka_bootstrap
    assert "topic" not in trigger["metadata"], "the lag over the three topics the group reads"
    assert scaler["spec"]["maxReplicaCount"] <= events.kafka_partitions
    auth = built.get("TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"]
    assert updater.workload["spec"]["podManagementPolicy"] == "Parallel"


def test_the_model_lifecycle_works_on_one_folder(built: Built) -> None:
    """Training publishes, operators and gateways (automatic rollback) write routing.json,
    scorers read it: all on the same folder of the state volume."""
    (gateway,) = built.processes("services.gateway")
    g = gateway.settings(GatewaySettings)
    assert g.model_version is None, "pinned: the lifecycle is off"
    models = gateway.mount_of(g.models_path)
    assert models.claim == "fraudmesh-state" and models.writable
    (scorer,) = built.processes("services.scorer")
    s = scorer.settings(ScorerSettings)
    assert s.model_version is None and s.model_name == g.model_name
    assert scorer.mount_of(s.models_path).place == models.place
    # `fraudmesh train|autopilot` and `fraudmesh model …` use <FRAUD_FEATURES_VAR_DIR>/models.
    writers = [
        *built.processes("fraudmesh train"),
        *built.processes("fraudmesh autopilot"),
        *built.processes(OPERATOR_SHELL),
    ]
    assert {c.workload["metadata"]["name"] for c in writers} == {"train", "retrain", "admin"}
    for writer in writers:
        found = writer.mount_of(writer.settings(FeatureStoreSettings).var_dir / "models")
        assert found.place == models.place and found.writable, writer.where


def test_the_decision_log_has_one_folder_on_the_sinks_volume(built: Built) -> None:
    (sink,) = built.processes("services.decisionlog")
    log = sink.mount_of(sink.settings(DecisionLogSettings).root_path)
    assert "claimTemplate" in log.volume and log.writable, "the decision log outlives the pod"
    # Compaction and the operators' exports open the same folder on the sink's claim, on
    # the sink's node (the claim is ReadWriteOnce).
    readers = [*built.processes("fraudmesh decisions"), *built.processes(OPERATOR_SHELL)]
    assert {c.workload["metadata"]["name"] for c in readers} == {"decisions-compact", "admin"}
    for reader in readers:
        found = reader.mount_of(reader.settings(DecisionLogSettings).root_path)
        assert found.place == log.place and found.writable, reader.where
        affinity = reader.pod["affinity"]["podAffinity"]
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        assert _selects(term["labelSelector"]["matchLabels"], _pod_labels(sink.workload))
        assert term["topologyKey"] == "kubernetes.io/hostname"


def _option(container: Container, name: str) -> str | None:
    argv = [*container.spec.get("command", []), *container.spec.get("args", [])]
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_autopilot_runs_on_a_schedule_on_the_monitors_advice(built: Built) -> None:
    """The retrain CronJob runs `fraudmesh autopilot` on the log the sink writes, the advice
    the monitor writes and the models the gateways serve, one run at a time."""
    (pilot,) = built.processes("fraudmesh autopilot")
    cron = pilot.workload
    assert cron["kind"] == "CronJob" and not cron["spec"].get("suspend", False)
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] > 0 and job["backoffLimit"] <= 2
    var_dir = pilot.settings(FeatureStoreSettings).var_dir
    # The decision log: the sink's folder, read on the sink's node.
    (sink,) = built.processes("services.decisionlog")
    log = sink.mount_of(sink.settings(DecisionLogSettings).root_path)
    decisions = Path(_option(pilot, "--decisions-root") or var_dir / "decisions")
    assert pilot.mount_of(decisions).place == log.place
    (term,) = pilot.pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert _selects(term["labelSelector"]["matchLabels"], _pod_labels(sink.workload))
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # The advice: the file the monitor appends to, on a volume both pods mount.
    (monitor,) = built.processes("services.monitor")
    written = monitor.mount_of(monitor.settings(MonitorSettings).advice_file)
    assert written.writable and written.claim == "fraudmesh-state"
    advice = Path(_option(pilot, "--advice-file") or var_dir / "monitor" / "advice.jsonl")
    assert pilot.mount_of(advice).place == written.place
    # The candidate and the rollout plan: beside the models the monitor's controller moves.
    models = pilot.mount_of(var_dir / "models")
    assert models.writable
    assert models.place == monitor.mount_of(monitor.settings(MonitorSettings).models_path).place
    # Its work folder is on the state volume too (a run takes minutes and many files).
    assert pilot.mount_of(var_dir / "training").writable


def test_shutdown_fits_in_the_grace_period(built: Built) -> None:
    (gateway,) = built.processes("services.gateway")
    g = gateway.settings(GatewaySettings)
    needed = g.drain_seconds + g.grace_seconds + gateway.settings(EventLogSettings).close_timeout_s
    assert gateway.pod["terminationGracePeriodSeconds"] > needed
    (sink,) = built.processes("services.decisionlog")
    d = sink.settings(DecisionLogSettings)
    assert (
        sink.pod["terminationGracePeriodSeconds"]
        > d.drain_seconds + d.grace_seconds + d.close_timeout_s
    )


def _page(url: str) -> tuple[int, str]:
    """Status and text of one GET (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _histograms(page: str) -> set[str]:
    return {line.split()[2] for line in page.splitlines() if line.endswith(" histogram")}


def test_envoys_stats_reach_a_scraper_in_the_cluster(built: Built, tmp_path: Path) -> None:
    # The pod's scrape annotations name the bootstrap's stats listener, which the pod
    # declares and the scrape policy admits.
    pod = built.get("Deployment", "envoy")["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    port = int(annotations["prometheus.io/port"])
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == envoy.STATS_PATH
    assert port in {p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]}
    bootstrap = next(
        d for d in built.all("ConfigMap") if d["metadata"]["name"].startswith("envoy-bootstrap")
    )
    listeners = yaml.safe_load(bootstrap["data"]["envoy-bootstrap.yaml"])["static_resources"]
    stats = next(x for x in listeners["listeners"] if x["name"] == "stats")
    assert stats["address"]["socket_address"]["port_value"] == port
    scrape = built.get("NetworkPolicy", "metrics-scrape")["spec"]
    assert "envoy" in scrape["podSelector"]["matchExpressions"][0]["values"]
    assert port in {p["port"] for rule in scrape["ingress"] for p in rule["ports"]}
    # A real Envoy on the same rendering serves on that listener the page `fraudmesh up`
    # scrapes from the admin port, with the same histograms, and no other admin path.
    ports = {name: free_port() for name in ("listen", "admin", "stats")}
    config = tmp_path / "envoy.yaml"
    config.write_text(
        envoy.render_config(
            listen_port=ports["listen"],
            admin_port=ports["admin"],
            gateway_port=50051,
            gateway_dns="gateway",
            stats_port=ports["stats"],
        )
    )
    admin = f"http://127.0.0.1:{ports['admin']}"
    scraped = f"http://127.0.0.1:{ports['stats']}"
    process = Process(
        "envoy",
        envoy.envoy_command(config),
        ready=lambda: http_ok(scraped + envoy.STATS_PATH),
        log_path=tmp_path / "envoy.log",
    )
    process.start()
    try:
        process.wait_ready(120)
        # One call through the edge (no gateway behind it) records the edge's histograms.
        edge = f"127.0.0.1:{ports['listen']}"
        with grpc.insecure_channel(edge) as channel, contextlib.suppress(grpc.RpcError):
            channel.unary_unary("/fraud.v1.FraudScoring/Score")(b"", timeout=5)
        from_admin = _page(admin + envoy.STATS_PATH)
        from_listener = _page(scraped + envoy.STATS_PATH)
        assert from_admin[0] == from_listener[0] == 200
        assert "envoy_http_downstream_rq_time_bucket" in from_listener[1]
        assert _histograms(from_listener[1]) == _histograms(from_admin[1])
        for path in ("/quitquitquit", "/config_dump", "/stats", "/clusters"):
            assert _page(scraped + path)[0] == 404, path
    finally:
        process.stop(10)


def test_every_project_container_runs_the_image_its_overlay_names(built: Built) -> None:
    # An overlay's `images:` entry must match the name the base already gave the image,
    # or kustomize ignores it without a word and every pod pulls the base's name.
    kustomization = yaml.safe_load((OVERLAYS_DIR / built.name / "kustomization.yaml").read_text())
    (wanted,) = kustomization["images"]
    image = f"{wanted['newName']}:{wanted['newTag']}"
    found = set()
    for kind in ("Deployment", "StatefulSet", "Job", "CronJob"):
        for workload in built.all(kind):
            spec = workload["spec"]
            template = (spec["jobTemplate"]["spec"] if kind == "CronJob" else spec)["template"]
            pod = template["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                if c["image"].split("@")[0].rsplit(":", 1)[0].endswith("fraudmesh"):
                    found.add(c["image"])
    assert found == {image}
