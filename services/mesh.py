"""Starts, watches and stops the mesh's processes: redis-server, the services and Envoy.

Used by ``fraudmesh up`` and by the integration tests, so both run the mesh the same way.
Every child gets its own process group and dies with its parent (PR_SET_PDEATHSIG), so
nothing is left behind even if the parent is killed. The death signal and the start-up
niceness are set by exec'ing through util-linux ``setpriv`` and coreutils ``nice`` rather
than a ``preexec_fn``: Python code between fork and exec can deadlock in a process that
runs threads (gRPC's), and then ``Popen`` never returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import envoy
from services.common.settings import ServerSettings, to_env
from services.eventlog import EventLogSettings
from services.features.settings import FeaturesSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.settings import GatewaySettings
from services.scorer.settings import ScorerSettings
from services.updater.settings import UpdaterSettings

STARTUP_NICENESS = 10
"""Children start at this niceness and get normal priority once ready: the seconds of CPU
a Python service spends importing and warming up must not starve the replicas that are
serving meanwhile (a rolling restart on a small machine)."""


def _launch_prefix() -> list[str]:
    """The argv prefix every child is exec'd through: SIGTERM when the parent dies, start
    at ``STARTUP_NICENESS``. Each tool execs the next, so the child keeps its PID."""
    setpriv, nice = shutil.which("setpriv"), shutil.which("nice")
    if setpriv is None or nice is None:
        raise RuntimeError("starting the mesh needs setpriv (util-linux) and nice (coreutils)")
    return [setpriv, "--pdeathsig", "TERM", "--", nice, "-n", str(STARTUP_NICENESS), "--"]


def renice_threads(pid: int, niceness: int) -> None:
    """Sets every thread of ``pid`` to ``niceness``. Niceness is per thread on Linux: the
    threads a process has started by now (gRPC pollers, timers, Envoy's workers) need it,
    not only the main one. Threads that end meanwhile, and a lack of permission to lower
    niceness (root or CAP_SYS_NICE), are skipped."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def grpc_serving(target: str, timeout_s: float = 0.5, service: str = "") -> bool:
    """True when ``target`` answers grpc.health.v1 Check with SERVING."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def http_ok(url: str, timeout_s: float = 0.5) -> bool:
    """True when ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def tcp_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _made(path: Path) -> Path:
    """``path``, created as a folder if missing."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def _serving_probe(target: str) -> Callable[[], bool]:
    """A readiness probe: ``target`` answers its health check with SERVING."""
    return lambda: grpc_serving(target)


@dataclass
class Process:
    """One child process of the mesh, with its readiness probe and log file."""

    name: str
    argv: list[str]
    ready: Callable[[], bool]
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The PID while running."""
        return self.popen.pid if self.popen is not None else None

    def start(self) -> None:
        """Starts the process with its environment, logging to ``log_path``."""
        # Importing feast in this process switches prometheus_client to multiprocess mode
        # through the environment; the children keep plain in-memory metrics.
        env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
        env.update(self.env)
        out: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.popen = subprocess.Popen(
                [*_launch_prefix(), *self.argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        """Blocks until the readiness probe passes; raises with the log tail if it never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.returncode()}\n{self.log_tail()}"
                )
            if self.ready():
                self._normal_priority()
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s\n{self.log_tail()}")

    def _normal_priority(self) -> None:
        """Back to the parent's niceness once serving (lowering niceness needs root or
        CAP_SYS_NICE; without it the process keeps its start-up niceness)."""
        assert self.popen is not None
        renice_threads(self.popen.pid, os.getpriority(os.PRIO_PROCESS, 0))

    def returncode(self) -> int | None:
        """Exit status once ended."""
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the process if it runs."""
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if it will not go; returns the exit status."""
        if self.popen is None:
            return None
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the process log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class MeshConfig:
    """Ports, store and state folder of one mesh."""

    var_dir: Path = Path("var")
    store: str = "sqlite"
    host: str = "127.0.0.1"
    envoy_port: int = 8080
    admin_port: int = 9901
    gateway_port: int = 50051
    features_port: int = 50052
    scorer_port: int = 50053
    redis_port: int = 6379
    extra_gateway_ports: tuple[int, ...] = ()
    gateway_in_process: bool = False
    """Gateways read the online store and run the model themselves (FRAUD_GATEWAY_IN_PROCESS)."""
    rate_limit_rps: int = 1000
    metrics_ports: Mapping[str, int] = field(default_factory=dict)
    """Prometheus /metrics port per service process name (e.g. "gateway"); unset: none."""
    live_loop: bool = True
    """Gateways emit decision events and the feature updater applies them to the store."""
    eventlog: str | None = None
    """Event log backend: file, redis or kafka; None: redis with the Redis store, else file."""
    kafka_bootstrap: str | None = None
    """Bootstrap servers of the Kafka event log (a broker the mesh does not run)."""
    updater_port: int = 50054
    log_dir: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def on_free_ports(cls, gateway_replicas: int = 1, **overrides: object) -> MeshConfig:
        """A config whose every port is free now (for tests and side-by-side runs)."""
        ports: dict[str, object] = {
            name: free_port()
            for name in (
                "envoy_port",
                "admin_port",
                "gateway_port",
                "features_port",
                "scorer_port",
                "redis_port",
                "updater_port",
            )
        }
        ports["extra_gateway_ports"] = tuple(free_port() for _ in range(gateway_replicas - 1))
        return cls(**{**ports, **overrides})  # type: ignore[arg-type]

    @property
    def logs_path(self) -> Path:
        """Folder of the processes' logs."""
        return self.log_dir or self.var_dir / "logs"

    @property
    def envoy_target(self) -> str:
        """host:port clients call."""
        return f"{self.host}:{self.envoy_port}"

    @property
    def eventlog_backend(self) -> str:
        """The event log's backend (see ``eventlog``)."""
        return self.eventlog or ("redis" if self.store == "redis" else "file")

    def service_env(self) -> dict[str, str]:
        """Environment that points every service at this mesh's ports and state."""
        host, var = self.host, self.var_dir
        backend = self.eventlog_backend
        env = {
            **to_env(
                GatewaySettings,
                port=self.gateway_port,
                var_dir=var,
                features_target=f"{host}:{self.features_port}",
                scorer_target=f"{host}:{self.scorer_port}",
                in_process=True if self.gateway_in_process else None,
                emit_events=None if self.live_loop else False,
            ),
            **to_env(
                EventLogSettings,
                var_dir=var,
                backend=backend,
                redis_url=f"redis://{host}:{self.redis_port}/0" if backend == "redis" else None,
                kafka_bootstrap=self.kafka_bootstrap,
            ),
            **to_env(UpdaterSettings, port=self.updater_port, var_dir=var),
            **to_env(FeaturesSettings, port=self.features_port, var_dir=var),
            **to_env(
                FeatureStoreSettings,
                var_dir=var,
                store=self.store,
                redis_connection=f"{host}:{self.redis_port}",
            ),
            **to_env(ScorerSettings, port=self.scorer_port, var_dir=var),
        }
        return {**env, **self.extra_env}


class Mesh:
    """The processes of one mesh, started in dependency order and stopped in reverse."""

    def __init__(self, config: MeshConfig) -> None:
        self.config = config
        self.processes: dict[str, Process] = {}
        c = config
        logs = c.logs_path
        env = c.service_env()
        if c.store == "redis":
            self.processes["redis"] = Process(
                "redis",
                [
                    "redis-server",
                    "--port",
                    str(c.redis_port),
                    "--bind",
                    c.host,
                    "--save",
                    "",
                    # The event log on Redis Streams must survive a restart of redis-server.
                    *(
                        ["--appendonly", "yes", "--dir", str(_made(c.var_dir / "redis"))]
                        if c.eventlog_backend == "redis"
                        else ["--appendonly", "no"]
                    ),
                    "--protected-mode",
                    "yes",
                ],
                ready=lambda: tcp_open(c.host, c.redis_port),
                log_path=logs / "redis.log",
            )
        services: list[tuple[str, str, type[ServerSettings], int]] = [
            ("features", "features", FeaturesSettings, c.features_port),
            ("scorer", "scorer", ScorerSettings, c.scorer_port),
            ("gateway", "gateway", GatewaySettings, c.gateway_port),
        ]
        services += [
            (f"gateway-{i}", "gateway", GatewaySettings, port)
            for i, port in enumerate(c.extra_gateway_ports, 2)
        ]
        if c.live_loop:
            services.append(("updater", "updater", UpdaterSettings, c.updater_port))
        for name, module, settings_class, port in services:
            self.processes[name] = Process(
                name,
                [sys.executable, "-m", f"services.{module}"],
                ready=_serving_probe(f"{c.host}:{port}"),
                env={
                    **env,
                    **to_env(settings_class, port=port, metrics_port=c.metrics_ports.get(name)),
                },
                log_path=logs / f"{name}.log",
            )
        envoy_config = c.logs_path / f"envoy-{c.envoy_port}.yaml"
        self.processes["envoy"] = Process(
            "envoy",
            envoy.envoy_command(envoy_config),
            ready=lambda: grpc_serving(c.envoy_target),
            log_path=logs / "envoy.log",
        )
        self._envoy_config = envoy_config

    def start(self, timeout_s: float = 60.0, on_ready: Callable[[str], None] | None = None) -> None:
        """Starts everything in order and waits for each to be ready; stops all on failure."""
        c = self.config
        self._envoy_config.parent.mkdir(parents=True, exist_ok=True)
        self._envoy_config.write_text(
            envoy.render_config(
                listen_port=c.envoy_port,
                admin_port=c.admin_port,
                gateway_port=c.gateway_port,
                extra_gateway_ports=c.extra_gateway_ports,
                rate_limit_rps=c.rate_limit_rps,
                access_log_path=str(c.logs_path / "envoy-access.log"),
            )
        )
        try:
            gateways = tuple(n for n in self.processes if n.startswith("gateway"))
            for group in (("redis",), ("features", "scorer", "updater"), gateways, ("envoy",)):
                started = [self.processes[n] for n in group if n in self.processes]
                for process in started:
                    process.start()
                for process in started:
                    process.wait_ready(timeout_s)
                    if on_ready is not None:
                        on_ready(process.name)
        except BaseException:
            self.stop()
            raise

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Stops (if running) and starts one process, waiting until it is ready and, for a
        gateway, until Envoy routes to it again (as an orchestrator's readiness gate would)."""
        process = self.processes[name]
        process.stop()
        process.start()
        process.wait_ready(timeout_s)
        if name.startswith("gateway"):
            self.wait_edge_healthy(timeout_s)

    def wait_edge_healthy(self, timeout_s: float = 30.0) -> None:
        """Blocks until Envoy's admin API reports every gateway host healthy."""
        url = f"http://{self.config.host}:{self.config.admin_port}/clusters"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1) as reply:
                    text = reply.read().decode()
            except OSError:
                text = ""
            flags = [line for line in text.splitlines() if "::health_flags::" in line]
            if flags and all(line.endswith("::health_flags::healthy") for line in flags):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Envoy did not report every gateway healthy within {timeout_s} s")

    def stop(self) -> None:
        """Stops every process, front to back: Envoy first, redis-server last."""
        order = ["envoy", *(n for n in self.processes if n.startswith("gateway"))]
        order += ["features", "scorer", "updater", "redis"]
        for name in order:
            if name in self.processes:
                self.processes[name].stop()

    def dead(self) -> list[Process]:
        """Processes that were started and have exited."""
        return [p for p in self.processes.values() if p.popen is not None and not p.alive()]
