"""The configuration of one mesh: its ports, store and state, and each service's environment."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.common.edge_security import EdgeSettings
from services.common.settings import ServerSettings, from_mapping, to_env
from services.common.telemetry import OtelEnvironment, TracePlan, plan
from services.console.settings import ConsoleSettings
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings
from services.features.settings import FeaturesSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.settings import GatewaySettings
from services.mesh.process import free_port
from services.monitor.settings import MonitorSettings
from services.scorer.settings import ScorerSettings
from services.updater.settings import UpdaterSettings

_GROUPS_WITHOUT_MONITOR = [
    g
    for g in EventLogSettings.model_fields["groups"].default
    if g != MonitorSettings.model_fields["group"].default
]
"""The event log's declared consumer groups of a mesh without the monitor."""


MONITOR_POLL_INTERVAL_MS = 50.0
"""How often the monitor looks for new events on an idle file log where it cannot watch the
head (no inotify; docs/eventlog.md; docs/performance.md, "Defaults sized to the machine")."""


def replicas_target(host: str, ports: Sequence[int]) -> str:
    """The gRPC target of a service's replicas: ``host:port`` for one, else an ``ipv4:`` list
    of every address, which the gateway's round-robin channel spreads calls over (and a
    call finds the replicas still up when one dies)."""
    if len(ports) == 1:
        return f"{host}:{ports[0]}"
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"replicas need an IPv4 host, got {host!r}") from None
    return "ipv4:" + ",".join(f"{host}:{port}" for port in ports)


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
    monitor_port: int = 50056
    """Health port of the monitor (it serves no other API)."""
    monitor: bool = True
    """With the live loop: the monitor judges the traffic (drift, live quality)."""
    extra_gateway_ports: tuple[int, ...] = ()
    """Ports of further gateway replicas behind Envoy (``gateway-2``, ``gateway-3``, …)."""
    extra_admin_ports: tuple[int, ...] = ()
    """Admin ports of further Envoy processes (``envoy-2``, …): each shares the listening
    port with the first through SO_REUSEPORT, so a killed one takes only its own
    connections with it."""
    extra_features_ports: tuple[int, ...] = ()
    """Ports of further feature service replicas; the gateways spread calls over all."""
    extra_scorer_ports: tuple[int, ...] = ()
    """Ports of further scorer replicas; the gateways spread calls over all."""
    extra_decisionlog_ports: tuple[int, ...] = ()
    """Health ports of further decision sinks (``decisionlog-2``, …): members of the first's
    consumer group, each writing its share into the same decision log under its own name
    (Kafka or Redis Streams only: on the file log a group has one consumer at a time)."""
    extra_updater_ports: tuple[int, ...] = ()
    """Health ports of further feature updaters (``updater-2``, …). With any, every updater
    is a member of one partitioned group on Kafka (``services/updater/partitioned.py``)."""
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
    observability: bool = False
    """The processes that watch the mesh for people: the web console, and Prometheus and the
    trace collector each when installed (``fraudmesh up`` turns them on unless
    ``--no-observability``; the tests' meshes leave them off); the mesh never depends on them."""
    console_port: int = 8090
    """The console's HTTP port (on ``host``: loopback unless configured)."""
    prometheus_port: int = 9090
    otlp_port: int = 4317
    """The trace collector's OTLP/gRPC port."""
    collector_metrics_port: int = 8888
    """The trace collector's own /metrics."""
    trace_keep_percent: float = 10.0
    """Share of ordinary traces (no error, on time, approved) the collector keeps."""
    observability_dir: Path | None = None
    """Configs, Prometheus's data and the kept traces; unset: <var_dir>/observability."""

    @classmethod
    def on_free_ports(cls, gateway_replicas: int = 1, **overrides: object) -> MeshConfig:
        """A config whose every port is free now (for tests and side-by-side runs).
        ``envoy_replicas``, ``features_replicas``, ``scorer_replicas``,
        ``decisionlog_replicas`` and ``updater_replicas`` (like ``gateway_replicas``; default
        1) give the number of processes of each part."""
        counts = {"gateway": gateway_replicas}
        for part in ("envoy", "features", "scorer", "decisionlog", "updater"):
            count = overrides.pop(f"{part}_replicas", 1)
            if not isinstance(count, int) or count < 1:
                raise ValueError(f"{part}_replicas must be a positive int, got {count!r}")
            counts[part] = count
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
                "console_port",
                "prometheus_port",
                "otlp_port",
                "collector_metrics_port",
                "monitor_port",
            )
        }
        for name, part in (
            ("extra_gateway_ports", "gateway"),
            ("extra_admin_ports", "envoy"),
            ("extra_features_ports", "features"),
            ("extra_scorer_ports", "scorer"),
            ("extra_decisionlog_ports", "decisionlog"),
            ("extra_updater_ports", "updater"),
        ):
            ports[name] = tuple(free_port() for _ in range(counts[part] - 1))
        return cls(**{**ports, **overrides})  # type: ignore[arg-type]

    def replica_ports(self, part: str) -> dict[str, int]:
        """Process name → port of every replica of ``part`` (gateway, features, scorer,
        decisionlog or updater; envoy: its admin ports), the first under the part's own
        name."""
        first, extra = {
            "gateway": (self.gateway_port, self.extra_gateway_ports),
            "features": (self.features_port, self.extra_features_ports),
            "scorer": (self.scorer_port, self.extra_scorer_ports),
            "decisionlog": (self.decisionlog_port, self.extra_decisionlog_ports),
            "updater": (self.updater_port, self.extra_updater_ports),
            "envoy": (self.admin_port, self.extra_admin_ports),
        }[part]
        return {part: first} | {f"{part}-{i}": port for i, port in enumerate(extra, 2)}

    @property
    def logs_path(self) -> Path:
        """Folder of the processes' logs."""
        return self.log_dir or self.var_dir / "logs"

    @property
    def observability_path(self) -> Path:
        """Folder of the observability processes' configs and data."""
        return self.observability_dir or self.var_dir / "observability"

    @property
    def traces_path(self) -> Path:
        """The file the mesh's collector appends kept traces to (OTLP JSON lines)."""
        return self.observability_path / "traces" / "traces.jsonl"

    @property
    def envoy_target(self) -> str:
        """host:port clients call."""
        return f"{self.host}:{self.envoy_port}"

    def edge_settings(self) -> EdgeSettings:
        """The edge's security settings, with the request bound matched to the gateway's."""
        # FRAUD_EDGE_* in extra_env shape the edge as they shape a service (a side-by-side
        # run's variants set the edge's admission limit this way).
        edge = self.edge or from_mapping(
            EdgeSettings, {**self.extra_env, "FRAUD_EDGE_VAR_DIR": str(self.var_dir)}
        )
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
                features_target=replicas_target(
                    host, (self.features_port, *self.extra_features_ports)
                ),
                scorer_target=replicas_target(host, (self.scorer_port, *self.extra_scorer_ports)),
                in_process=True if self.gateway_in_process else None,
                emit_events=None if self.live_loop else False,
            ),
            **to_env(
                EventLogSettings,
                var_dir=var,
                backend=backend,
                redis_url=f"redis://{host}:{self.redis_port}/0" if backend == "redis" else None,
                kafka_bootstrap=self.kafka_bootstrap,
                # Without the monitor its group is not declared, so that retention and
                # trimming do not wait for a consumer that never comes.
                groups=None if self.monitor else json.dumps(_GROUPS_WITHOUT_MONITOR),
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

    @property
    def console_url(self) -> str:
        """Where a browser opens the console."""
        scheme = "https" if self.edge_settings().tls else "http"
        return f"{scheme}://{self.host}:{self.console_port}"

    def console_env(self) -> dict[str, str]:
        """Environment of the console: this mesh's decision log, models and edge (verdicts go
        through Envoy like any client's outcome), and the edge's TLS and token settings,
        which the console applies to itself."""
        edge = self.edge_settings()
        decisions = from_mapping(DecisionLogSettings, self.decisionlog_env()).root_path
        # The Models page reads the monitor's own metrics page, where this mesh runs one.
        monitor_metrics = (
            self.metrics_ports.get("monitor") if self.live_loop and self.monitor else None
        )
        return {
            **self.service_env(),
            **to_env(
                EdgeSettings,
                var_dir=edge.var_dir,
                tls=edge.tls,
                mtls=edge.mtls,
                auth=edge.auth,
                cert_path=edge.cert_path,
                key_path=edge.key_path,
                jwks_path=edge.jwks_path,
                jwt_issuer=edge.jwt_issuer,
                jwt_audience=edge.jwt_audience,
            ),
            **to_env(
                ConsoleSettings,
                host=self.host,
                port=self.console_port,
                var_dir=self.var_dir,
                decisions_root=decisions,
                outcome_target=self.envoy_target,
                # The Rules page shows and changes the policy the gateways follow.
                policy_dir=from_mapping(GatewaySettings, self.service_env()).policy_dir,
                prometheus_url=f"http://{self.host}:{self.prometheus_port}",
                monitor_url=f"http://{self.host}:{monitor_metrics}/metrics"
                if monitor_metrics
                else None,
            ),
            **self.extra_env,
        }

    def otel_environment(self) -> OtelEnvironment:
        """The standard OTEL_* variables the mesh's processes see (this process's environment
        under the mesh's ``extra_env``)."""
        given = {k.lower(): v for k, v in self.extra_env.items() if k.upper().startswith("OTEL_")}
        return OtelEnvironment.model_validate(
            {**OtelEnvironment().model_dump(exclude_none=True), **given}
        )

    def trace_plan(self, collector: bool) -> TracePlan:
        """How the mesh traces: the standard variables where set; else, with the mesh's own
        collector running, the services' default share of new traces to it; else off."""
        ratio = ServerSettings.model_fields["trace_sample_ratio"].default
        return plan("mesh", "otlp" if collector else "off", ratio, self.otel_environment())

    def monitor_env(self) -> dict[str, str]:
        """Environment of the monitor: the event log and the model repository of the
        services, and its own state under this mesh's state folder."""
        return {
            **self.service_env(),
            **to_env(
                MonitorSettings,
                port=self.monitor_port,
                var_dir=self.var_dir,
                metrics_port=self.metrics_ports.get("monitor"),
            ),
            # The monitor judges drift over minutes: without a head watch it looks for new
            # events every 50 ms, not every 5 as the feature updater must (a tenth of its
            # idle CPU).
            **to_env(EventLogSettings, file_poll_interval_ms=MONITOR_POLL_INTERVAL_MS),
            **self.extra_env,
        }

    def updater_env(self, name: str = "updater") -> dict[str, str]:
        """What the feature updater ``name`` adds to the services' environment: with several
        updaters, membership of the partitioned group under its own consumer name."""
        if not self.extra_updater_ports:
            return {}
        return {
            **to_env(UpdaterSettings, partitioned=True),
            **to_env(EventLogSettings, consumer_name=name),
        }

    def decisionlog_env(self, name: str = "decisionlog") -> dict[str, str]:
        """Environment of the decision sink ``name`` (``decisionlog``, ``decisionlog-2``, …):
        the event log it reads (this mesh's state folder unless the services' environment
        says otherwise) and where it writes. A replica reads under its own consumer name,
        which its files in the decision log carry; the first keeps the default."""
        replica = {} if name == "decisionlog" else {"consumer_name": name}
        return {
            **to_env(EventLogSettings, var_dir=self.var_dir),
            **self.service_env(),
            **to_env(
                DecisionLogSettings,
                port=self.replica_ports("decisionlog")[name],
                var_dir=self.var_dir,
                metrics_port=self.metrics_ports.get(name),
            ),
            **to_env(EventLogSettings, **replica),
            **self.extra_env,
        }
