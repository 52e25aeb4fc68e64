"""The topology of one mesh: which processes run, in what order they start and stop.

Prometheus and the trace collector are optional children: started when the config asks for
observability and they are installed, first (so the services' first spans and scrapes find
them) and stopped last (so the last spans are flushed to them). One that fails or keeps
crashing is left down; the mesh serves on without it."""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from services.common import edge_security, envoy
from services.common.settings import ServerSettings, to_env
from services.common.telemetry import TracePlan
from services.features.settings import FeaturesSettings
from services.gateway.settings import GatewaySettings
from services.mesh.config import MeshConfig
from services.mesh.process import Process, grpc_serving, http_ok, tcp_open
from services.observability import collector, prometheus
from services.scorer.settings import ScorerSettings
from services.updater.settings import UpdaterSettings

log = logging.getLogger(__name__)

OBSERVABILITY = ("collector", "prometheus")
"""The optional children, started first and stopped last."""

SINKS_ON_FILE_LOG = (
    "more than one decision sink needs an event log whose consumer group has several members "
    "(Kafka or Redis Streams): on the file log a group has one consumer at a time"
)
"""Why a mesh on the file log runs one decision sink."""
UPDATERS_NEED_KAFKA = (
    "more than one feature updater needs the Kafka event log (--eventlog kafka): the updaters "
    "share its partitions, and the file log and Redis Streams have none to own"
)
"""Why a mesh on another event log runs one feature updater."""

TRACED: dict[str, type[ServerSettings]] = {
    "gateway": GatewaySettings,
    "features": FeaturesSettings,
    "scorer": ScorerSettings,
}
"""The services on a Score's path, whose spans the mesh's collector gets."""


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
        self._write_later: dict[Path, str] = {}
        c = config
        logs = c.logs_path
        env = c.service_env()
        self._add_observability()
        if c.store == "redis":
            self.processes["redis"] = _redis(c)
        services: list[tuple[str, str, type[ServerSettings], int]] = [
            (name, part, settings_class, port)
            for part, settings_class in (
                ("features", FeaturesSettings),
                ("scorer", ScorerSettings),
                ("gateway", GatewaySettings),
            )
            for name, port in c.replica_ports(part).items()
        ]
        if c.live_loop:
            updaters = c.replica_ports("updater")
            if len(updaters) > 1 and c.eventlog_backend != "kafka":
                raise ValueError(UPDATERS_NEED_KAFKA)
            services += [(n, "updater", UpdaterSettings, port) for n, port in updaters.items()]
        for name, module, settings_class, port in services:
            self.processes[name] = Process(
                name,
                [sys.executable, "-m", f"services.{module}"],
                ready=_serving_probe(f"{c.host}:{port}"),
                env={
                    **env,
                    **to_env(settings_class, port=port, metrics_port=c.metrics_ports.get(name)),
                    **(c.updater_env(name) if module == "updater" else {}),
                    **self._trace_env(name, module),
                },
                log_path=logs / f"{name}.log",
                niceness=c.background_niceness if module == "updater" else 0,
            )
        if c.live_loop:
            sinks = c.replica_ports("decisionlog")
            if len(sinks) > 1 and c.eventlog_backend == "file":
                raise ValueError(SINKS_ON_FILE_LOG)
            for name, port in sinks.items():
                self.processes[name] = Process(
                    name,
                    [sys.executable, "-m", "services.decisionlog"],
                    ready=_serving_probe(f"{c.host}:{port}"),
                    env=c.decisionlog_env(name),
                    log_path=logs / f"{name}.log",
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
        self.edge = c.edge_settings()
        self._envoy_configs: dict[str, tuple[Path, int]] = {}
        """Each Envoy's bootstrap file and admin port."""
        for name, admin_port in c.replica_ports("envoy").items():
            # Every Envoy binds the same listening port (SO_REUSEPORT): the kernel spreads
            # new connections over the live ones, and a killed one takes only its own.
            self._envoy_configs[name] = (logs / f"{name}-{c.envoy_port}.yaml", admin_port)
            self.processes[name] = Process(
                name,
                envoy.envoy_command(self._envoy_configs[name][0]),
                ready=functools.partial(self._envoy_ready, admin_port),
                log_path=logs / f"{name}.log",
                niceness=self.edge.niceness,
            )
        if c.observability:
            self._add_console()
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._stopping = False

    def _add_observability(self) -> None:
        """Adds Prometheus and the trace collector where asked for and installed, and settles
        how the mesh traces (``trace_plan``)."""
        c = self.config
        obs = c.observability_path
        collector_binary = collector.binary() if c.observability else None
        self.trace_plan: TracePlan = c.trace_plan(collector=collector_binary is not None)
        if collector_binary is not None:
            plan = self.trace_plan
            # The mesh's services send to this collector; where the environment names an
            # OTLP endpoint of its own, the collector forwards to it, over its protocol.
            downstream = plan.endpoint if plan.exporter == "otlp" else None
            given = c.otel_environment()
            if not (given.otel_exporter_otlp_endpoint or given.otel_exporter_otlp_traces_endpoint):
                downstream = None
            config = collector.CollectorConfig(
                otlp_port=c.otlp_port,
                metrics_port=c.collector_metrics_port,
                traces_path=c.traces_path,
                keep_percent=c.trace_keep_percent,
                downstream=downstream,
                downstream_protocol=plan.protocol,
                host=c.host,
            )
            self._write_later[obs / "collector.yaml"] = config.render()
            self.processes["collector"] = Process(
                "collector",
                collector.command(collector_binary, obs / "collector.yaml"),
                ready=lambda: http_ok(f"http://{c.host}:{c.collector_metrics_port}/metrics"),
                log_path=c.logs_path / "collector.log",
                optional=True,
            )
        prometheus_binary = prometheus.binary() if c.observability else None
        if prometheus_binary is not None:
            # One job per part, one instance per replica (gateway-2 joins the gateway job).
            targets: dict[str, list[str]] = {}
            for name, port in c.metrics_ports.items():
                targets.setdefault(name.split("-")[0], []).append(f"{c.host}:{port}")
            targets["envoy"] = [f"{c.host}:{port}" for port in c.replica_ports("envoy").values()]
            if collector_binary is not None:
                targets["collector"] = [f"{c.host}:{c.collector_metrics_port}"]
            prom = prometheus.PrometheusConfig(
                port=c.prometheus_port,
                data_dir=obs / "prometheus",
                targets=targets,
                paths={"envoy": "/stats/prometheus"},
                host=c.host,
            )
            self._write_later[obs / "prometheus.yml"] = prom.render()
            self.processes["prometheus"] = Process(
                "prometheus",
                prom.command(prometheus_binary, obs / "prometheus.yml"),
                ready=lambda: http_ok(f"http://{c.host}:{c.prometheus_port}/-/ready"),
                log_path=c.logs_path / "prometheus.log",
                optional=True,
            )

    def _trace_env(self, name: str, module: str) -> dict[str, str]:
        """What a service needs to trace as the mesh does: its service name and, with the
        mesh's collector, the collector as its endpoint (and, unless the standard variables
        choose, OTLP export at the services' default share)."""
        plan = self.trace_plan
        if not plan.enabled or module not in TRACED:
            return {}
        env = {"OTEL_SERVICE_NAME": f"fraudmesh-{name}"}
        if "collector" in self.processes:
            endpoint = f"http://{self.config.host}:{self.config.otlp_port}"
            env |= {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            }
            env |= to_env(TRACED[module], tracing="otlp")
        return env

    def envoy_tracing(self) -> envoy.EnvoyTracing | None:
        """Envoy's tracer: to the mesh's collector, else to the OTLP/gRPC endpoint the
        environment names; None when the mesh does not trace."""
        plan, c = self.trace_plan, self.config
        if plan.exporter != "otlp":
            return None
        percent = plan.root_share * 100
        if "collector" in self.processes:
            return envoy.EnvoyTracing(c.host, c.otlp_port, percent)
        if plan.protocol != "grpc":
            log.warning("Envoy exports spans over OTLP/gRPC only; the edge is not traced")
            return None
        target = plan.endpoint.split("://", 1)[-1].rstrip("/")
        host, _, port = target.rpartition(":")
        if not port.isdigit():
            return None
        return envoy.EnvoyTracing(host or "127.0.0.1", int(port), percent)

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

    def _envoy_ready(self, admin_port: int) -> bool:
        """An Envoy is ready once its admin API says so and it sees every gateway pass its
        health checks. Asked of each Envoy's own admin port: through the shared listening
        port a probe could reach another Envoy; and with TLS the mesh holds no client
        credentials of its own."""
        admin = f"http://{self.config.host}:{admin_port}"
        return http_ok(f"{admin}/ready") and self._gateways_healthy(admin_port)

    def _gateways_healthy(self, admin_port: int | None = None) -> bool:
        port = self.config.admin_port if admin_port is None else admin_port
        url = f"http://{self.config.host}:{port}/clusters"
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
        """Starts each part once what it calls is ready, and returns once every part is;
        stops all on failure."""
        c = self.config
        with self._lock:
            self._stopping = False
        self.edge.check_files()
        c.logs_path.mkdir(parents=True, exist_ok=True)
        for name, (path, admin_port) in self._envoy_configs.items():
            rendered = envoy.render_config(
                listen_port=c.envoy_port,
                admin_port=admin_port,
                gateway_port=c.gateway_port,
                extra_gateway_ports=c.extra_gateway_ports,
                rate_limit_rps=c.rate_limit_rps,
                access_log_path=str(c.logs_path / f"{name}-access.log"),
                tracing=self.envoy_tracing(),
            )
            # Written once: a restarted Envoy reads the same file, so its ports never change.
            path.write_text(edge_security.apply(rendered, self.edge))
        for path, text in self._write_later.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        backends = (*self._named("features", "scorer", "decisionlog", "updater"), "monitor")
        called = self._named("features", "scorer")
        # (started, then waited for) in turn: a gateway starts once what it calls serves, not
        # after the updater's seeding and the sinks; Envoy once the gateways serve. The
        # remaining backends are waited for last, so the mesh is whole when this returns.
        steps = (
            (("redis", *OBSERVABILITY), ("redis", *OBSERVABILITY)),
            (backends, called),
            (self._named("gateway"), self._named("gateway")),
            (self._named("envoy"), self._named("envoy")),
            ((), tuple(n for n in backends if n not in called)),
            (("console",), ("console",)),
        )
        try:
            for started, waited in steps:
                for name in started:
                    if name in self.processes:
                        self.processes[name].start()
                for name in waited:
                    if name in self.processes:
                        self._wait_ready(self.processes[name], timeout_s, on_ready)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _wait_ready(
        process: Process, timeout_s: float, on_ready: Callable[[str], None] | None
    ) -> None:
        try:
            process.wait_ready(timeout_s)
        except RuntimeError as error:
            if not process.optional:
                raise
            # Observability is never a reason not to serve.
            log.warning("%s did not start; the mesh runs without it: %s", process.name, error)
            process.stop()
            return
        if on_ready is not None:
            on_ready(process.name)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Stops (if running) and starts one process, waiting until it is ready and, for a
        gateway, until Envoy routes to it again (as an orchestrator's readiness gate would)."""
        process = self.processes[name]
        with self.held(name):
            process.stop()
            process.start()
            process.wait_ready(timeout_s)
        if name in self._named("gateway"):
            self.wait_edge_healthy(timeout_s)

    def _named(self, *parts: str) -> tuple[str, ...]:
        """The processes of ``parts`` (e.g. ``gateway``: gateway, gateway-2, …), in order."""
        return tuple(
            name for name in self.processes if name.rpartition("-")[0] in parts or name in parts
        )

    def wait_edge_healthy(self, timeout_s: float = 30.0) -> None:
        """Blocks until every Envoy's admin API reports every gateway host healthy."""
        admin_ports = [admin for _, admin in self._envoy_configs.values()]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._gateways_healthy(port) for port in admin_ports):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Envoy did not report every gateway healthy within {timeout_s} s")

    def stop(self) -> None:
        """Stops every process, front to back, tier by tier: the Envoys, the gateways, the
        loop's consumers (and any other child), the backends, redis-server, observability
        last. The processes of a tier stop together. Once the Envoys are gone nothing routes
        calls to the services behind them, so those stop without their drain (SIGINT; a
        gateway alone would report NOT_SERVING for 2.5 s, the backends for 1 s)."""
        with self._lock:
            self._stopping = True
        undrained = set(self._named("gateway", "features", "scorer"))
        front = [self._named("envoy"), self._named("gateway")]
        backends = [self._named("features", "scorer"), ("redis",)]
        tiers = [*front, (), *backends, OBSERVABILITY]
        placed = {name for tier in tiers for name in tier}
        # Any other child (added by a later component) stops before the backends it may use.
        tiers[len(front)] = tuple(n for n in self.processes if n not in placed)
        for tier in tiers:
            running = [self.processes[n] for n in tier if n in self.processes]
            threads = [
                threading.Thread(
                    target=p.stop,
                    kwargs={"sig": signal.SIGINT if p.name in undrained else signal.SIGTERM},
                    name=f"stop-{p.name}",
                    daemon=True,
                )
                for p in running
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def dead(self) -> list[Process]:
        """Processes that were started and have exited."""
        return [p for p in self.processes.values() if p.popen is not None and not p.alive()]
