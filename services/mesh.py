"""Starts, watches and stops the mesh's processes: redis-server, the services and Envoy.

Used by ``fraudmesh up`` and by the integration tests, so both run the mesh the same way.
``Supervisor`` restarts a child that dies (``fraudmesh up`` runs one); explicit restarts
(``Mesh.restart``, the fault matrix) and deliberate stops are never fought over.
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
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import edge_security, envoy
from services.common.edge_security import EdgeSettings
from services.common.settings import ServerSettings, from_mapping, to_env
from services.decisionlog.settings import DecisionLogSettings
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
    expected: bool = False
    """True from start() to stop(): an exit in between is a crash."""
    niceness: int = 0
    """Niceness once serving, above the parent's (0: the parent's)."""

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
        self.expected = True
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
                self.normal_priority()
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s\n{self.log_tail()}")

    def normal_priority(self) -> None:
        """Back to the parent's niceness once serving (lowering niceness needs root or
        CAP_SYS_NICE; without it the process keeps its start-up niceness)."""
        assert self.popen is not None
        renice_threads(self.popen.pid, os.getpriority(os.PRIO_PROCESS, 0) + self.niceness)

    def returncode(self) -> int | None:
        """Exit status once ended."""
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the process if it runs."""
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap, without marking the exit as intended (a hung child)."""
        if self.popen is not None and self.alive():
            self.popen.kill()
            self.popen.wait(5)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if it will not go; returns the exit status."""
        self.expected = False
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
    decisionlog_port: int = 50055
    """Health port of the decision sink (it serves no other API)."""
    extra_gateway_ports: tuple[int, ...] = ()
    gateway_in_process: bool = False
    """Gateways read the online store and run the model themselves (FRAUD_GATEWAY_IN_PROCESS)."""
    rate_limit_rps: int = 1000
    metrics_ports: Mapping[str, int] = field(default_factory=dict)
    """Prometheus /metrics port per service process name (e.g. "gateway"); unset: none."""
    live_loop: bool = True
    """Gateways emit decision events; the feature updater applies them to the store and the
    decision sink writes them to the decision log. Off: no events, no updater, no sink."""
    eventlog: str | None = None
    """Event log backend: file, redis or kafka; None: redis with the Redis store, else file."""
    kafka_bootstrap: str | None = None
    """Bootstrap servers of the Kafka event log (a broker the mesh does not run)."""
    updater_port: int = 50054
    background_niceness: int = 10
    """Niceness of the loop's consumers (feature updater, decision sink) once they serve,
    above the mesh's own: their work is off the request path, and on a small machine a
    burst of it must not take a core from a Score in flight (Kubernetes gets the same by
    their lower CPU requests). 0 runs them like the serving processes."""
    log_dir: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    edge: EdgeSettings | None = None
    """TLS, authentication and limits at Envoy; unset: plaintext, no tokens, default limits."""

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
                "decisionlog_port",
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

    def edge_settings(self) -> EdgeSettings:
        """The edge's security settings, with the request bound matched to the gateway's."""
        edge = self.edge or EdgeSettings(var_dir=self.var_dir)
        if "max_request_bytes" in edge.model_fields_set:
            return edge
        gateway = from_mapping(GatewaySettings, self.service_env())
        # The body Envoy sees is the message plus gRPC's 5-byte frame header.
        return edge.model_copy(update={"max_request_bytes": gateway.max_request_bytes + 5})

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

    def decisionlog_env(self) -> dict[str, str]:
        """Environment of the decision sink: the event log it reads (this mesh's state folder
        unless the services' environment says otherwise) and where it writes."""
        return {
            **to_env(EventLogSettings, var_dir=self.var_dir),
            **self.service_env(),
            **to_env(
                DecisionLogSettings,
                port=self.decisionlog_port,
                var_dir=self.var_dir,
                metrics_port=self.metrics_ports.get("decisionlog"),
            ),
            **self.extra_env,
        }


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
                niceness=c.background_niceness if name == "updater" else 0,
            )
        if c.live_loop:
            self.processes["decisionlog"] = Process(
                "decisionlog",
                [sys.executable, "-m", "services.decisionlog"],
                ready=_serving_probe(f"{c.host}:{c.decisionlog_port}"),
                env=c.decisionlog_env(),
                log_path=logs / "decisionlog.log",
                niceness=c.background_niceness,
            )
        envoy_config = c.logs_path / f"envoy-{c.envoy_port}.yaml"
        self.edge = c.edge_settings()
        self.processes["envoy"] = Process(
            "envoy",
            envoy.envoy_command(envoy_config),
            ready=self._envoy_ready,
            log_path=logs / "envoy.log",
        )
        self._envoy_config = envoy_config
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._stopping = False

    def _envoy_ready(self) -> bool:
        """Plaintext: the edge answers health with SERVING. With TLS the mesh holds no client
        credentials of its own, so it asks Envoy's admin API instead: Envoy is ready and
        every gateway host passes its health checks."""
        c = self.config
        if not self.edge.tls:
            return grpc_serving(c.envoy_target)
        admin = f"http://{c.host}:{c.admin_port}"
        return http_ok(f"{admin}/ready") and self._gateways_healthy()

    def _gateways_healthy(self) -> bool:
        url = f"http://{self.config.host}:{self.config.admin_port}/clusters"
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                text = reply.read().decode()
        except OSError:
            return False
        flags = [line for line in text.splitlines() if "::health_flags::" in line]
        return bool(flags) and all(line.endswith("::health_flags::healthy") for line in flags)

    @contextlib.contextmanager
    def held(self, name: str) -> Iterator[None]:
        """Keeps the supervisor's hands off ``name`` while the caller stops or starts it."""
        with self._lock:
            self._held.add(name)
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(name)

    def start(self, timeout_s: float = 60.0, on_ready: Callable[[str], None] | None = None) -> None:
        """Starts everything in order and waits for each to be ready; stops all on failure."""
        c = self.config
        with self._lock:
            self._stopping = False
        self.edge.check_files()
        self._envoy_config.parent.mkdir(parents=True, exist_ok=True)
        rendered = envoy.render_config(
            listen_port=c.envoy_port,
            admin_port=c.admin_port,
            gateway_port=c.gateway_port,
            extra_gateway_ports=c.extra_gateway_ports,
            rate_limit_rps=c.rate_limit_rps,
            access_log_path=str(c.logs_path / "envoy-access.log"),
        )
        # Written once: a restarted Envoy reads the same file, so its ports never change.
        self._envoy_config.write_text(edge_security.apply(rendered, self.edge))
        try:
            gateways = tuple(n for n in self.processes if n.startswith("gateway"))
            groups = (
                ("redis",),
                ("features", "scorer", "decisionlog", "updater"),
                gateways,
                ("envoy",),
            )
            for group in groups:
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
        with self.held(name):
            process.stop()
            process.start()
            process.wait_ready(timeout_s)
        if name.startswith("gateway"):
            self.wait_edge_healthy(timeout_s)

    def wait_edge_healthy(self, timeout_s: float = 30.0) -> None:
        """Blocks until Envoy's admin API reports every gateway host healthy."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._gateways_healthy():
                return
            time.sleep(0.1)
        raise RuntimeError(f"Envoy did not report every gateway healthy within {timeout_s} s")

    def stop(self) -> None:
        """Stops every process, front to back: Envoy first, redis-server last."""
        with self._lock:
            self._stopping = True
        order = ["envoy", *(n for n in self.processes if n.startswith("gateway"))]
        backends = ["features", "scorer", "redis"]
        # Any other child (added by a later component) stops before the backends it may use.
        order += [n for n in self.processes if n not in order and n not in backends]
        order += backends
        for name in order:
            if name in self.processes:
                self.processes[name].stop()

    def dead(self) -> list[Process]:
        """Processes that were started and have exited."""
        return [p for p in self.processes.values() if p.popen is not None and not p.alive()]


@dataclass(frozen=True)
class RestartPolicy:
    """How a supervisor restarts children, and when it gives up."""

    backoff_initial_s: float = 0.5
    """Wait before the first restart after a crash."""
    backoff_max_s: float = 15.0
    """Longest wait between restarts; the wait doubles with each crash in the window."""
    max_crashes: int = 5
    """Crashes of one child within ``window_s`` that make the supervisor give up."""
    window_s: float = 60.0
    """Crashes older than this are forgotten (and the backoff starts over)."""
    ready_timeout_s: float = 120.0
    """A restarted child not ready within this long is killed and counted as a crash."""

    def __post_init__(self) -> None:
        if self.max_crashes < 1 or self.window_s <= 0 or self.backoff_initial_s < 0:
            raise ValueError(f"invalid restart policy {self}")


class CrashHistory:
    """One child's recent crashes: the backoff before the next restart, or the verdict that
    it crashes too often (``max_crashes`` within ``window_s``)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._policy = policy
        self._times: deque[float] = deque()

    def record(self, now: float) -> float | None:
        """Adds a crash at ``now``; returns seconds to wait before restarting, or None to give up."""
        p = self._policy
        self._times.append(now)
        while self._times and self._times[0] <= now - p.window_s:
            self._times.popleft()
        crashes = len(self._times)
        if crashes >= p.max_crashes:
            return None
        return float(min(p.backoff_max_s, p.backoff_initial_s * 2 ** (crashes - 1)))

    def recent(self, now: float) -> int:
        """Crashes within the window before ``now``."""
        return sum(1 for t in self._times if t > now - self._policy.window_s)


class CrashLoop(RuntimeError):
    """A child crashed too often; carries its name and its last log lines."""

    def __init__(self, process: Process, crashes: int, window_s: float) -> None:
        super().__init__(
            f"{process.name} crashed {crashes} times within {window_s:.0f} s "
            f"(last exit status {process.returncode()})"
        )
        self.process = process
        self.log_tail = process.log_tail()


@dataclass
class _Child:
    """What the supervisor knows of one child between ticks."""

    history: CrashHistory
    restart_at: float | None = None
    starting_since: float | None = None


class Supervisor:
    """Restarts children of a started mesh that exit while they should run.

    ``tick`` does one round and returns at once: a crashed child is restarted after its
    backoff, a restarting one is probed until ready (then gets normal priority and
    ``on_ready`` runs, e.g. to refill a fresh redis-server), and a child that crashes
    ``max_crashes`` times within ``window_s`` raises ``CrashLoop``. Children stopped on
    purpose, or held by ``Mesh.restart``, are left alone. Envoy's bootstrap is written once
    at start, so a restarted Envoy keeps its ports.
    """

    def __init__(
        self,
        mesh: Mesh,
        policy: RestartPolicy | None = None,
        on_ready: Callable[[str], None] | None = None,
        report: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mesh = mesh
        self.policy = policy or RestartPolicy()
        self._on_ready = on_ready
        self._report = report or (lambda _message: None)
        self._clock = clock
        self._children = {name: _Child(CrashHistory(self.policy)) for name in mesh.processes}
        self.restarts: dict[str, int] = dict.fromkeys(mesh.processes, 0)

    def tick(self) -> None:
        """One round over every child; raises CrashLoop when one crashes too often."""
        for name, process in self.mesh.processes.items():
            with self.mesh._lock:
                if self.mesh._stopping:
                    return
                child = self._children[name]
                if name in self.mesh._held:
                    # Someone else is restarting it; whatever we were doing is moot.
                    child.restart_at = child.starting_since = None
                    continue
                self._step(name, process, child)

    def _step(self, name: str, process: Process, child: _Child) -> None:
        now = self._clock()
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restart_at = None
                child.starting_since = now
                self.restarts[name] += 1
                process.start()
                self._report(f"{name} restarted (pid {process.pid})")
            return
        if child.starting_since is not None:
            if not process.alive():
                child.starting_since = None
                self._crashed(name, process, child, now)
            elif process.ready():
                process.normal_priority()
                took = now - child.starting_since
                child.starting_since = None
                self._report(f"{name} ready again ({took:.1f} s after its restart)")
                if self._on_ready is not None:
                    self._on_ready(name)
            elif now - child.starting_since > self.policy.ready_timeout_s:
                self._report(f"{name} not ready {self.policy.ready_timeout_s:.0f} s after restart")
                child.starting_since = None
                process.kill()
                self._crashed(name, process, child, now)
            return
        if process.expected and process.popen is not None and not process.alive():
            self._crashed(name, process, child, now)

    def _crashed(self, name: str, process: Process, child: _Child, now: float) -> None:
        delay = child.history.record(now)
        if delay is None:
            raise CrashLoop(process, child.history.recent(now), self.policy.window_s)
        child.restart_at = now + delay
        self._report(
            f"{name} exited ({process.returncode()}); restarting in {delay:.1f} s "
            f"({child.history.recent(now)} crash(es) in {self.policy.window_s:.0f} s)"
        )

    def run(self, stop: threading.Event, interval_s: float = 0.2) -> None:
        """Ticks until ``stop`` is set; raises CrashLoop."""
        while not stop.wait(interval_s):
            self.tick()
