"""Runs the project's containers as their pods declare them, without a cluster.

A rendered overlay (``kubectl kustomize``) names, for each Deployment, StatefulSet, Job and
CronJob, the containers of the project's image: their command and args, the env of their
ConfigMaps and literals, their volume mounts and whether the root file system is read-only.
``PodRunner`` starts each such container under bubblewrap with the image's working directory
and environment, the host's root bound read-only (the pod's ``readOnlyRootFilesystem``),
and writable storage only at the container's declared mounts, each backed by a host folder
standing for its volume (an emptyDir per pod, a claim shared by the pods that name it).

What a cluster provides and a single machine does not is translated, and nothing else: each
container listens on loopback ports chosen here instead of its pod's own address (every pod
would otherwise want the same 9090), Service names become those ports, and the stores that
live outside the cluster (Redis, Kafka) are the real brokers the tests start. The process
runs as root here: the read-only binds refuse root's writes too, so a write outside the
mounts still fails as it would in the pod, with ``[Errno 30] Read-only file system``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.mesh import free_port

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "images" / "Containerfile"
WORKLOADS = ("Deployment", "StatefulSet", "Job", "CronJob")
_READ_ONLY = re.compile(r"Read-only file system(?:: '([^']*)')?")
_LISTEN = re.compile(r"^FRAUD_[A-Z]+_HOST$")
_PORT = re.compile(r"^FRAUD_[A-Z]+_(?:METRICS_)?PORT$")


class PodFailure(AssertionError):
    """A container did not start or answer as its pod declares; the message says why."""


def render(overlay: Path) -> list[dict[str, Any]]:
    """The objects of an overlay, as ``kubectl kustomize`` renders them."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@dataclass(frozen=True)
class Image:
    """What the project's image sets for every container: working directory and env."""

    workdir: str
    env: dict[str, str]
    dirs: tuple[str, ...]
    """Folders the image creates (``install -d``): mount points and the working directory."""

    @classmethod
    def from_containerfile(cls, path: Path = CONTAINERFILE) -> Image:
        """The last stage's WORKDIR, ENV and created folders, read from the Containerfile."""
        text = path.read_text().replace("\\\n", " ")
        last = text[text.rindex("\nFROM ") :]
        workdir = re.findall(r"^WORKDIR\s+(\S+)", last, re.M)[-1]
        env: dict[str, str] = {}
        for line in re.findall(r"^ENV\s+(.*)$", last, re.M):
            env.update(dict(pair.split("=", 1) for pair in line.split()))
        dirs = [d for part in re.findall(r"install -d ([^&\n]*)", last) for d in part.split()]
        return cls(workdir, env, tuple(d for d in dirs if d.startswith("/")))


@dataclass(frozen=True)
class Mount:
    """One volume mount: the host folder standing for the volume, where, and how."""

    source: Path
    path: str
    read_only: bool


@dataclass
class Container:
    """One container of the project's image, as its pod declares it."""

    workload: str
    kind: str
    pod: str
    name: str
    argv: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    read_only_root: bool
    probe: dict[str, Any] | None
    ports: dict[int, int] = field(default_factory=dict)
    """Declared container port → the loopback port it listens on here."""

    @property
    def label(self) -> str:
        """``Kind/workload/container``, as failures name it."""
        return f"{self.kind}/{self.workload}/{self.name}"


@dataclass
class Pod:
    """The containers of one pod of a workload, init containers first."""

    kind: str
    workload: str
    name: str
    init: list[Container]
    main: list[Container]


def is_project_image(image: str) -> bool:
    """Whether ``image`` is the project's own (``…/fraudmesh:tag``), not Envoy's or Redis's."""
    repository = image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image else image
    return repository.rsplit("/", 1)[-1] == "fraudmesh"


def pod_template(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template of a workload (a CronJob's is inside its Job template)."""
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template: dict[str, Any] = spec["template"]
    return template


@dataclass
class Cluster:
    """A rendered overlay turned into pods on this machine: volumes, env and ports."""

    docs: list[dict[str, Any]]
    root: Path
    outside: dict[str, str]
    """Env keys of what lives outside the cluster (Redis, Kafka) → the test's brokers."""
    claims: dict[str, Path] = field(default_factory=dict)
    """PersistentVolumeClaim name → its host folder (shared by the pods that mount it)."""
    service_ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def objects(self, kind: str) -> Iterator[dict[str, Any]]:
        """The rendered objects of one kind."""
        return (d for d in self.docs if d["kind"] == kind)

    def config_map(self, name: str) -> dict[str, str]:
        """A rendered ConfigMap's data, by its (hashed) name."""
        for doc in self.objects("ConfigMap"):
            if doc["metadata"]["name"] == name:
                return dict(doc.get("data") or {})
        raise PodFailure(f"ConfigMap {name} is not in the overlay")

    def pods(self, workload: str | None = None) -> list[Pod]:
        """One pod of each workload running the project's image (or of ``workload``)."""
        found = []
        for doc in self.docs:
            if doc["kind"] not in WORKLOADS:
                continue
            name = doc["metadata"]["name"]
            if workload is not None and name != workload:
                continue
            spec = pod_template(doc)["spec"]
            if not any(is_project_image(c["image"]) for c in spec["containers"]):
                continue
            found.append(self._pod(doc, spec))
        return found

    def _pod(self, doc: dict[str, Any], spec: dict[str, Any]) -> Pod:
        kind, workload = doc["kind"], doc["metadata"]["name"]
        pod_name = f"{workload}-0" if kind == "StatefulSet" else f"{workload}-pod"
        volumes = self._volumes(doc, spec, pod_name)
        made = [
            [self._container(kind, workload, pod_name, c, volumes) for c in spec.get(key) or []]
            for key in ("initContainers", "containers")
        ]
        return Pod(kind, workload, pod_name, made[0], made[1])

    def _volumes(self, doc: dict[str, Any], spec: dict[str, Any], pod: str) -> dict[str, Path]:
        """Volume name → the host folder that stands for it in this pod."""
        folders: dict[str, Path] = {}
        for volume in spec.get("volumes") or []:
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                folders[name] = self.claims.setdefault(claim, self._folder("claims", claim))
            elif "emptyDir" in volume:
                folders[name] = self._folder(pod, name)
            else:
                raise PodFailure(f"{pod}: volume {name} has a kind this runner does not know")
        for template in doc["spec"].get("volumeClaimTemplates") or []:
            name = template["metadata"]["name"]
            folders[name] = self._folder("claims", f"{name}-{pod}")
        return folders

    def _folder(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _container(
        self, kind: str, workload: str, pod: str, spec: dict[str, Any], volumes: dict[str, Path]
    ) -> Container:
        mounts = []
        for m in spec.get("volumeMounts") or []:
            source = volumes[m["name"]] / m.get("subPath", "")
            source.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(source, m["mountPath"], bool(m.get("readOnly"))))
        env = self._env(spec, pod)
        ports = {p["containerPort"]: free_port() for p in spec.get("ports") or []}
        probe = spec.get("readinessProbe") or spec.get("startupProbe")
        return Container(
            workload=workload,
            kind=kind,
            pod=pod,
            name=spec["name"],
            argv=[*spec.get("command", []), *spec.get("args", [])],
            env=env,
            mounts=mounts,
            read_only_root=bool((spec.get("securityContext") or {}).get("readOnlyRootFilesystem")),
            probe=probe,
            ports=ports,
        )

    def _env(self, spec: dict[str, Any], pod: str) -> dict[str, str]:
        """The container's env in the order Kubernetes applies it: envFrom, then env."""
        env: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            if "configMapRef" in source:
                env.update(self.config_map(source["configMapRef"]["name"]))
            elif not source["secretRef"].get("optional"):
                raise PodFailure(f"{pod}: needs Secret {source['secretRef']['name']}")
        for var in spec.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
            elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[var["name"]] = pod
            else:
                raise PodFailure(f"{pod}: env {var['name']} has a source this runner lacks")
        return env

    def assign_ports(self, pods: list[Pod]) -> None:
        """Maps each Service's name:port to the loopback port of the container behind it."""
        for service in self.objects("Service"):
            selector = service["spec"].get("selector") or {}
            target = selector.get("app.kubernetes.io/name")
            for port in service["spec"].get("ports") or []:
                for pod in pods:
                    for c in pod.main:
                        if c.workload == target and port["port"] in c.ports:
                            key = (service["metadata"]["name"], port["port"])
                            self.service_ports[key] = c.ports[port["port"]]

    def network_env(self, c: Container) -> dict[str, str]:
        """The container's env with this machine's addresses in place of the cluster's."""
        env = dict(c.env)
        for key, value in c.env.items():
            if _LISTEN.match(key) and value == "0.0.0.0":
                env[key] = "127.0.0.1"
            elif _PORT.match(key) and value.isdigit() and int(value) in c.ports:
                env[key] = str(c.ports[int(value)])
            elif re.fullmatch(r"[a-z0-9-]+:\d+", value):
                host, port = value.split(":")
                if (host, int(port)) in self.service_ports:
                    env[key] = f"127.0.0.1:{self.service_ports[(host, int(port))]}"
        for key, value in self.outside.items():
            if key in env:
                env[key] = value
        return env


@dataclass
class Running:
    """A container started under bubblewrap: its process, log and own pid."""

    container: Container
    process: subprocess.Popen[bytes]
    log_path: Path
    child_pid: int

    def log(self) -> str:
        """Everything it has written to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def read_only_write(self) -> str | None:
        """The first write its log shows refused by the read-only root (the path, if named)."""
        match = _READ_ONLY.search(self.log())
        if match is None:
            return None
        return match.group(1) or match.group(0)

    def fail(self, why: str) -> PodFailure:
        """A failure naming the container, the refused path if any, and its log's tail."""
        refused = self.read_only_write()
        where = f"; it wrote outside its mounts: {refused}" if refused else ""
        tail = "\n".join(self.log().splitlines()[-25:])
        return PodFailure(f"{self.container.label}: {why}{where}\n--- log tail ---\n{tail}")

    def signal(self, signum: int) -> None:
        """Sends ``signum`` to the container's process (not to bubblewrap)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child_pid, signum)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, as the kubelet sends it, then SIGKILL past ``timeout_s``; the exit code."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.process.wait(timeout_s)


def sandbox_argv(c: Container, image: Image, env: Mapping[str, str], info_fd: int) -> list[str]:
    """The bubblewrap command that runs ``c`` as its pod would (root, mounts, workdir, env)."""
    needed = [image.workdir, *image.dirs, *(m.path for m in c.mounts)]
    # A mount point must exist in the root, which is read-only: a tmpfs over the nearest
    # folder the host has, holding the image's folders and the mount points, is made
    # read-only again once they exist, so only the binds below stay writable.
    covers = sorted({_nearest_existing(Path(p)) for p in needed if not Path(p).exists()})
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for cover in covers:
        argv += ["--tmpfs", str(cover)]
    for path in needed:
        argv += ["--dir", path]
    for m in c.mounts:
        argv += ["--ro-bind" if m.read_only else "--bind", str(m.source), m.path]
    for cover in covers:
        argv += ["--remount-ro", str(cover)]
    if not c.read_only_root:
        raise PodFailure(f"{c.label}: a writable root is not what this project's pods declare")
    argv += ["--chdir", image.workdir, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    program = shutil.which(c.argv[0], path=env["PATH"])
    if program is None:
        raise PodFailure(f"{c.label}: {c.argv[0]} is not in the image's PATH")
    return [*argv, "--info-fd", str(info_fd), program, *c.argv[1:]]


def _nearest_existing(path: Path) -> Path:
    """The nearest parent of a missing ``path`` that exists on the host."""
    while not path.parent.exists():
        path = path.parent
    return path.parent


def image_env(image: Image, env: Mapping[str, str]) -> dict[str, str]:
    """The image's env under the container's, with this checkout's Python first on PATH."""
    merged = {**image.env, **env}
    # The image's /opt/fraudmesh is this checkout's virtual environment here.
    merged["PATH"] = f"{Path(sys.executable).parent}:{image.env.get('PATH', os.defpath)}"
    return merged


def start(c: Container, image: Image, env: Mapping[str, str], log_path: Path) -> Running:
    """Starts ``c`` in its sandbox; returns once bubblewrap has told its process's pid."""
    read_fd, write_fd = os.pipe()
    argv = sandbox_argv(c, image, image_env(image, env), write_fd)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
        )
    os.close(write_fd)
    with os.fdopen(read_fd) as info:
        text = info.read()
    if not text:
        process.wait(30)
        raise PodFailure(f"{c.label}: bubblewrap did not start: {log_path.read_text()[-2000:]}")
    return Running(c, process, log_path, json.loads(text)["child-pid"])


def grpc_serving(port: int, service: str, timeout_s: float = 2.0) -> bool:
    """Whether the gRPC health service on the loopback ``port`` says SERVING."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def wait_ready(running: Running, timeout_s: float) -> None:
    """Waits for the container's declared probe to pass; fails if it ends or writes outside
    its mounts first, or the probe does not pass within ``timeout_s``."""
    c = running.container
    if c.probe is None:
        raise PodFailure(f"{c.label}: declares no readiness or startup probe")
    if "grpc" not in c.probe:
        raise PodFailure(f"{c.label}: probe {sorted(c.probe)} is not one this runner sends")
    port = c.ports.get(c.probe["grpc"]["port"])
    if port is None:
        raise PodFailure(f"{c.label}: probes port {c.probe['grpc']['port']}, not declared")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running.read_only_write() is not None:
            raise running.fail("a write was refused")
        if running.process.poll() is not None:
            raise running.fail(f"ended with {running.process.returncode} before it was ready")
        if grpc_serving(port, c.probe["grpc"].get("service", "")):
            return
        time.sleep(0.5)
    raise running.fail(f"not ready within {timeout_s:.0f} s")


def run_to_end(
    c: Container, image: Image, env: Mapping[str, str], log: Path, timeout_s: float
) -> None:
    """Runs a Job's or init container to its end; fails unless it exits 0 with no refused write."""
    running = start(c, image, env, log)
    try:
        code = running.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        running.stop(10)
        raise running.fail(f"did not finish within {timeout_s:.0f} s") from None
    if code != 0:
        raise running.fail(f"exited {code}")
    if running.read_only_write() is not None:
        raise running.fail("a write was refused")
