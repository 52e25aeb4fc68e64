"""The topology of one mesh: which processes run, in what order they start and stop."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from services.common import edge_security, envoy
from services.common.settings import ServerSettings, to_env
from services.features.settings import FeaturesSettings
from services.gateway.settings import GatewaySettings
from services.mesh.config import MeshConfig
from services.mesh.process import Process, grpc_serving, http_ok, tcp_open
from services.scorer.settings import ScorerSettings
from services.updater.settings import UpdaterSettings


def _made(path: Path) -> Path:
    """``path``, created as a folder if missing."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def _serving_probe(target: str) -> Callable[[], bool]:
    """A readiness probe: ``target`` answers its health check with SERVING."""
    return lambda: grpc_serving(target)


def _redis(c: MeshConfig) -> Process:
    """The mesh's redis-server: the online store, and the event log on Redis Streams."""
    return Process(
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
        log_path=c.logs_path / "redis.log",
    )


class Mesh:
    """The processes of one mesh, started in dependency order and stopped in reverse."""

    def __init__(self, config: MeshConfig) -> None:
        self.config = config
        self.processes: dict[str, Process] = {}
        c = config
        logs = c.logs_path
        env = c.service_env()
        if c.store == "redis":
            self.processes["redis"] = _redis(c)
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
        if c.live_loop and c.monitor:
            self.processes["monitor"] = Process(
                "monitor",
                [sys.executable, "-m", "services.monitor"],
                ready=_serving_probe(f"{c.host}:{c.monitor_port}"),
                env=c.monitor_env(),
                log_path=logs / "monitor.log",
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
        if c.observability:
            self._add_console()
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._stopping = False

    def _add_console(self) -> None:
        """Adds the web console, started last: it reads the decision log and reports verdicts
        through Envoy."""
        c = self.config
        url = f"http://{c.host}:{c.console_port}/healthz"
        tls = c.edge_settings().tls
        self.processes["console"] = Process(
            "console",
            [sys.executable, "-m", "services.console"],
            # Over TLS the mesh holds no client trust of its own: an open port will do.
            ready=(lambda: tcp_open(c.host, c.console_port)) if tls else (lambda: http_ok(url)),
            env=c.console_env(),
            log_path=c.logs_path / "console.log",
            niceness=c.background_niceness,
        )

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
                ("features", "scorer", "decisionlog", "updater", "monitor"),
                gateways,
                ("envoy",),
                ("console",),
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
