"""``fraudmesh up``: start the mesh, show where each part listens, restart children until stopped.

The mesh (``services.mesh``) and the demo are imported when the command runs, so that mounting
it costs the other ``fraudmesh`` commands nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from services import client
from services.cli import certs as certs_cli
from services.cli import features as features_cli
from services.common.edge_security import DEV_FILES, EdgeSettings
from services.common.settings import from_mapping
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import sizing

if TYPE_CHECKING:
    from services.mesh import Mesh, MeshConfig, RestartPolicy

console = Console()

METRICS_PROCESSES = ("gateway", "features", "scorer", "updater", "decisionlog", "monitor")
"""Processes serving Prometheus /metrics, on ``--metrics-port`` and the ports after it, in
this order; replicas (``gateway-2``, …) follow them, and the trace collector's own metrics
take the port after theirs."""


def metrics_ports(first: int, replicas: Sequence[str] = ()) -> dict[str, int]:
    """The /metrics port of each of ``METRICS_PROCESSES`` and then of each replica, counting
    up from ``first``."""
    names = [*METRICS_PROCESSES, *(r for r in replicas if r not in METRICS_PROCESSES)]
    return {name: first + i for i, name in enumerate(names)}


def replica_ports(first: int, replicas: int, step: int) -> tuple[int, ...]:
    """Ports of the replicas after the first: ``first + step``, ``first + 2 × step``, …"""
    return tuple(first + step * i for i in range(1, replicas))


_METRICS_HELP = (
    f"Prometheus /metrics of the {METRICS_PROCESSES[0]}; "
    + ", ".join(METRICS_PROCESSES[1:])
    + " use "
    + ", ".join(f"+{i}" for i in range(1, len(METRICS_PROCESSES)))
    + "."
)

_Store = Annotated[str, typer.Option(help="Online store: sqlite (embedded) or redis.")]
_VarDir = Annotated[Path, typer.Option(help="State folder: data, Feast, models, logs.")]
_Demo = Annotated[bool, typer.Option(help="Send sample transactions once the mesh is up.")]
_DecisionLogPort = Annotated[int, typer.Option(help="Health port of the decision sink.")]
_MonitorPort = Annotated[int, typer.Option(help="Health port of the monitor.")]
_Monitor = Annotated[
    bool,
    typer.Option(
        help="With the live loop: the monitor judges the traffic against each version's "
        "reference (drift, decision rates, live precision and recall)."
    ),
]
_MetricsPort = Annotated[int, typer.Option(help=_METRICS_HELP)]
_SIZED = " Default: sized to the machine's cores (services/mesh/sizing.py)."
_GatewayInProcess = Annotated[
    bool | None,
    typer.Option(
        "--gateway-in-process/--no-gateway-in-process",
        help="The gateway reads the online store and runs the model itself instead of "
        "calling the feature service and the scorer (both still run for other clients)." + _SIZED,
    ),
]
_Tls = Annotated[
    bool | None, typer.Option("--tls", help="Serve the edge over TLS only (FRAUD_EDGE_TLS).")
]
_Mtls = Annotated[
    bool | None,
    typer.Option("--mtls", help="TLS and require client certificates (FRAUD_EDGE_MTLS)."),
]
_Auth = Annotated[
    str | None, typer.Option(help="none, or jwt: every call but health needs a bearer token.")
]
_HealthPort = Annotated[
    int | None,
    typer.Option(help="Plaintext health-only edge listener for probes that cannot do TLS."),
]
_MaxRestarts = Annotated[
    int, typer.Option(min=1, help="Crashes of one child within --restart-window that stop all.")
]
_RestartWindow = Annotated[
    float, typer.Option(min=1, help="Seconds over which crashes are counted.")
]
_LiveLoop = Annotated[
    bool,
    typer.Option(
        help="Decision events, the feature updater (velocity features move with "
        "every transaction) and the decision log; off: no events, and the store "
        "changes only by materialization."
    ),
]
_EventLog = Annotated[
    str | None,
    typer.Option(
        help="Event log backend: file, redis or kafka (default: redis with --store "
        "redis, else the file log under the state folder)."
    ),
]
_Observability = Annotated[
    bool,
    typer.Option(
        help="The processes that watch the mesh for people: the web console (review queue, "
        "decision lookup, models, overview), Prometheus (its rules loaded, every process "
        "scraped) and the trace collector (tail sampling; traces under the state folder), "
        "the last two when installed; off: only the mesh itself, which never depends on them."
    ),
]
_ConsolePort = Annotated[
    int, typer.Option(help="The console's HTTP port (loopback unless FRAUD_CONSOLE_HOST says).")
]
_PrometheusPort = Annotated[int, typer.Option(help="Prometheus's port (127.0.0.1).")]
_OtlpPort = Annotated[int, typer.Option(help="The trace collector's OTLP/gRPC port.")]
_KafkaBootstrap = Annotated[
    str | None, typer.Option(help="Kafka bootstrap servers, with --eventlog kafka.")
]

_GatewayReplicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=9,
        help="Gateway processes behind Envoy. With two or more, Envoy retries a call whose "
        "gateway died before answering on another, and a killed gateway costs no call." + _SIZED,
    ),
]
_EnvoyReplicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=9,
        help="Envoy processes sharing the edge port (SO_REUSEPORT): a killed one takes only "
        "its own connections, and clients reconnect to another." + _SIZED,
    ),
]
_FeaturesReplicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=9,
        help="Feature service processes; the gateways spread calls over them, so a killed one "
        "costs the calls in flight on it default features, not every call until it is back."
        + _SIZED,
    ),
]
_ScorerReplicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=9,
        help="Scorer processes; the gateways spread calls over them, so a killed one costs "
        "the calls in flight on it a rules answer, not every call until it is back." + _SIZED,
    ),
]
_DecisionLogReplicas = Annotated[
    int,
    typer.Option(
        min=1,
        max=9,
        help="Decision sinks in one consumer group, writing one decision log: on Kafka and "
        "Redis each writes its share of the log, and the others take over a dead one's; "
        'refused on the file log, whose group has one consumer (docs/decisionlog.md, "Several '
        'sinks").',
    ),
]
_UpdaterReplicas = Annotated[
    int,
    typer.Option(
        min=1,
        max=9,
        help="Feature updaters: with more than one, a partitioned group on the Kafka event "
        "log, each owning its share of the card windows and of the merchant and terminal "
        'windows (refused on the other logs; docs/liveloop.md, "Several updaters").',
    ),
]
_EdgeMaxInFlight = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Calls Envoy lets in to the gateways at once; beyond it a call is refused at once "
        "with RESOURCE_EXHAUSTED and grpc-retry-pushback-ms (FRAUD_EDGE_MAX_IN_FLIGHT)." + _SIZED,
    ),
]
_ReplicaPortStep = Annotated[
    int,
    typer.Option(
        min=1,
        help="Replica N of a part listens on its port + (N-1) × this (an Envoy: its admin "
        "port); their metrics follow the other /metrics ports.",
    ),
]


def up(
    store: _Store = "sqlite",
    var_dir: _VarDir = Path("var"),
    demo: _Demo = False,
    envoy_port: int = 8080,
    admin_port: int = 9901,
    gateway_port: int = 50051,
    features_port: int = 50052,
    scorer_port: int = 50053,
    redis_port: int = 6379,
    decisionlog_port: _DecisionLogPort = 50055,
    metrics_port: _MetricsPort = 9101,
    gateway_in_process: _GatewayInProcess = None,
    tls: _Tls = None,
    mtls: _Mtls = None,
    auth: _Auth = None,
    health_port: _HealthPort = None,
    max_restarts: _MaxRestarts = 5,
    restart_window: _RestartWindow = 60.0,
    live_loop: _LiveLoop = True,
    eventlog: _EventLog = None,
    kafka_bootstrap: _KafkaBootstrap = None,
    updater_port: int = 50054,
    observability: _Observability = True,
    console_port: _ConsolePort = 8090,
    gateway_replicas: _GatewayReplicas = None,
    envoy_replicas: _EnvoyReplicas = None,
    features_replicas: _FeaturesReplicas = None,
    scorer_replicas: _ScorerReplicas = None,
    decisionlog_replicas: _DecisionLogReplicas = 1,
    updater_replicas: _UpdaterReplicas = 1,
    edge_max_in_flight: _EdgeMaxInFlight = None,
    replica_port_step: _ReplicaPortStep = 100,
    prometheus_port: _PrometheusPort = 9090,
    otlp_port: _OtlpPort = 4317,
    monitor_port: _MonitorPort = 50056,
    monitor: _Monitor = True,
) -> None:
    """Start redis-server (if configured), the services and Envoy; restart a child that dies;
    stop them all on Ctrl-C/SIGTERM, or when one child keeps crashing."""
    from services.mesh import MeshConfig, RestartPolicy

    _check_choices(store, auth, eventlog, kafka_bootstrap)
    sized = _sizing()
    flags = {"tls": tls, "mtls": mtls, "auth": auth, "health_port": health_port}
    edge = _edge(var_dir, sized, envoy_replicas or sized.envoy, edge_max_in_flight, flags)
    ports = _replicas(
        replica_port_step,
        metrics_port,
        gateway=(gateway_port, gateway_replicas or sized.gateway),
        admin=(admin_port, envoy_replicas or sized.envoy),
        features=(features_port, features_replicas or sized.features),
        scorer=(scorer_port, scorer_replicas or sized.scorer),
        decisionlog=(decisionlog_port, decisionlog_replicas if live_loop else 1),
        updater=(updater_port, updater_replicas if live_loop else 1),
    )
    config = MeshConfig(
        var_dir=var_dir,
        store=store,
        envoy_port=envoy_port,
        redis_port=redis_port,
        gateway_in_process=_or(gateway_in_process, sized.gateway_in_process),
        edge=edge,
        live_loop=live_loop,
        eventlog=eventlog,
        kafka_bootstrap=kafka_bootstrap,
        observability=observability,
        console_port=console_port,
        prometheus_port=prometheus_port,
        otlp_port=otlp_port,
        **ports,
        monitor_port=monitor_port,
        monitor=monitor,
    )
    _run(config, edge, RestartPolicy(max_crashes=max_restarts, window_s=restart_window), demo)


def _or(flag: bool | None, sized: bool) -> bool:
    """A flag given on the command line wins over the machine's sizing."""
    return sized if flag is None else flag


def _sizing() -> sizing.Sizing:
    """The sizing of this machine, said in one line."""
    sized = sizing.for_cores(sizing.usable_cores())
    console.print(sized.reason)
    return sized


def _edge(
    var_dir: Path,
    sized: sizing.Sizing,
    envoys: int,
    max_in_flight: int | None,
    flags: dict[str, Any],
) -> EdgeSettings:
    """The edge's settings: flags given on the command line (``max_in_flight`` among them)
    win, then FRAUD_EDGE_* (production paths); an admission limit given by neither is the
    machine's, shared out among the ``envoys`` (each Envoy counts only its own calls)."""
    flags = {**flags, "max_in_flight": max_in_flight}
    edge = EdgeSettings(var_dir=var_dir, **{k: v for k, v in flags.items() if v is not None})
    if edge.max_in_flight is None:
        share = -(-sized.edge_max_in_flight // envoys)
        edge = edge.model_copy(update={"max_in_flight": share})
    return edge


def _run(config: MeshConfig, edge: EdgeSettings, policy: RestartPolicy, demo: bool) -> None:
    """Starts the mesh and supervises it until Ctrl-C/SIGTERM."""
    from services.mesh import Mesh
    from services.mesh.topology import SINKS_ON_FILE_LOG, UPDATERS_NEED_KAFKA

    if len(config.replica_ports("decisionlog")) > 1 and config.eventlog_backend == "file":
        raise typer.BadParameter(SINKS_ON_FILE_LOG, param_hint="--decisionlog-replicas")
    if len(config.replica_ports("updater")) > 1 and config.eventlog_backend != "kafka":
        raise typer.BadParameter(UPDATERS_NEED_KAFKA, param_hint="--updater-replicas")
    _check_edge_files(edge)
    mesh = Mesh(config)
    if config.observability:
        _warn_missing_observability(mesh)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ready = _on_ready(mesh)
    _start(mesh, ready)
    console.print(_endpoints_table(mesh, edge))
    _supervise(mesh, edge, policy, ready, stop, demo)


def _start(mesh: Mesh, ready: Callable[[str], None]) -> None:
    """Starts the mesh; exits 1 saying why when it does not start."""
    with console.status("starting the mesh …"):
        try:
            mesh.start(on_ready=ready)
        except RuntimeError as error:
            console.print(f"[red]start failed:[/red] {error}")
            raise typer.Exit(1) from error


def _check_edge_files(edge: EdgeSettings) -> None:
    """Exits 1 naming every file the edge needs (TLS, JWT) that does not exist."""
    try:
        edge.check_files()
    except FileNotFoundError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from error


MISSING_OBSERVABILITY = {
    "prometheus": "no metrics kept: Prometheus is not installed ('make system-run' installs it)",
    "collector": "no traces kept: the trace collector is not built "
    "('make collector' builds it in a few minutes, once)",
}
"""What ``up`` says, in one line each, when an observability process is not installed."""


def _warn_missing_observability(mesh: Mesh) -> None:
    """Says in one line per missing observability process what is lost and how to get it:
    the mesh runs without it."""
    for name, line in MISSING_OBSERVABILITY.items():
        if name not in mesh.processes:
            console.print(f"[yellow]{line}[/yellow]")


def _check_choices(
    store: str, auth: str | None, eventlog: str | None, kafka_bootstrap: str | None
) -> None:
    """Refuses a store, an authentication or an event log the mesh does not know or the
    other flags cannot serve."""
    if store not in ("sqlite", "redis"):
        raise typer.BadParameter("store must be sqlite or redis", param_hint="--store")
    if auth not in (None, "none", "jwt"):
        raise typer.BadParameter("auth must be none or jwt", param_hint="--auth")
    _check_eventlog(store, eventlog, kafka_bootstrap)


def _replicas(step: int, first_metrics_port: int, **parts: tuple[int, int]) -> dict[str, Any]:
    """The ``MeshConfig`` fields of the ports that follow from the replicas: per replicated
    part (``part=(port, count)``) its first port and the ports of its replicas beyond the
    first (checked), the
    /metrics port of every service process (the replicas beyond the first after the others;
    an Envoy's part is its admin port, and it has no service name), and the trace
    collector's own /metrics port after those."""
    extra = {
        f"extra_{part}_ports": replica_ports(port, count, step)
        for part, (port, count) in parts.items()
    }
    _check_ports(extra)
    names = [
        f"{part}-{i}"
        for part, (_, count) in parts.items()
        if part != "admin"
        for i in range(2, count + 1)
    ]
    scraped = metrics_ports(first_metrics_port, names)
    return {
        **{f"{part}_port": port for part, (port, _) in parts.items()},
        **extra,
        "metrics_ports": scraped,
        "collector_metrics_port": first_metrics_port + len(scraped),
    }


def _check_ports(extra: dict[str, tuple[int, ...]]) -> None:
    """Refuses replica ports past 65535 (a large --replica-port-step)."""
    for name, ports in extra.items():
        if any(port > 65535 for port in ports):
            raise typer.BadParameter(
                f"{name.removeprefix('extra_').replace('_', ' ')} would pass 65535: {ports}",
                param_hint="--replica-port-step",
            )


def _check_eventlog(store: str, eventlog: str | None, kafka_bootstrap: str | None) -> None:
    """Refuses an event log backend the other flags cannot serve."""
    if eventlog not in (None, "file", "redis", "kafka"):
        raise typer.BadParameter("eventlog must be file, redis or kafka", param_hint="--eventlog")
    if eventlog == "redis" and store != "redis":
        raise typer.BadParameter("the Redis event log needs --store redis", param_hint="--eventlog")
    if eventlog == "kafka" and not kafka_bootstrap:
        raise typer.BadParameter("--eventlog kafka needs --kafka-bootstrap")


def _on_ready(mesh: Mesh) -> Callable[[str], None]:
    """What runs when a child is ready, at start and after a restart: a line, and a fresh
    redis-server gets the online store's rows again."""
    config = mesh.config

    def ready(name: str) -> None:
        console.print(f"[green]ready[/green] {name} (pid {mesh.processes[name].pid})")
        if name == "redis":
            store = from_mapping(FeatureStoreSettings, config.service_env())
            features_cli.materialize_into(store, console)

    return ready


def _endpoints_table(mesh: Mesh, edge: EdgeSettings) -> Table:
    """Each process with where it listens and its PID."""
    table = Table(title="fraudmesh is up", show_header=True)
    table.add_column("component")
    table.add_column("endpoint")
    table.add_column("pid")
    endpoints = _endpoints(mesh.config, edge)
    for name, process in mesh.processes.items():
        table.add_row(name, endpoints.get(name, ""), str(process.pid))
    return table


def _endpoints(config: MeshConfig, edge: EdgeSettings) -> dict[str, str]:
    """What each process serves, where, and its /metrics port."""
    host, store, metrics = config.host, config.store, config.metrics_ports
    scheme = "grpcs" if edge.tls else "grpc"
    security = " ".join(
        part
        for part in (
            "mutual TLS" if edge.mtls else "TLS" if edge.tls else "",
            "JWT" if edge.auth == "jwt" else "",
            f"health on :{edge.health_port}" if edge.health_port else "",
        )
        if part
    )
    rows = {
        "envoy": f"{scheme}://{config.envoy_target}  (admin http://{host}:{config.admin_port})"
        + (f"  {security}" if security else ""),
        "gateway": f"grpc://{host}:{config.gateway_port}  fraud.v1.FraudScoring"
        f"  (metrics http://{host}:{metrics['gateway']}/metrics)",
        "features": f"grpc://{host}:{config.features_port}  fraud.v1.FeatureService ({store})"
        f"  (metrics :{metrics['features']})",
        "scorer": f"grpc://{host}:{config.scorer_port}  inference.GRPCInferenceService"
        f"  (metrics :{metrics['scorer']})",
        "redis": f"redis://{host}:{config.redis_port}",
        "decisionlog": f"{config.var_dir / 'decisions'}  (health grpc://{host}:"
        f"{config.decisionlog_port}, metrics :{metrics['decisionlog']})",
        "updater": f"grpc://{host}:{config.updater_port}  health only; event log "
        f"{config.eventlog_backend} → online store ({store})  (metrics :{metrics['updater']})",
        "console": f"{config.console_url}  review queue, decision lookup, models, overview",
        "prometheus": f"http://{host}:{config.prometheus_port}  (rules, alerts, every process "
        "scraped)",
        "collector": f"otlp://{host}:{config.otlp_port}  traces kept → {config.traces_path}",
        "monitor": f"grpc://{host}:{config.monitor_port}  health only; drift and live quality "
        f"(metrics http://{host}:{metrics['monitor']}/metrics; fraudmesh monitor report)",
    }
    for part in ("gateway", "features", "scorer"):
        for name, port in list(config.replica_ports(part).items())[1:]:
            rows[name] = f"grpc://{host}:{port}  replica  (metrics :{metrics.get(name, '-')})"
    for name, port in list(config.replica_ports("decisionlog").items())[1:]:
        rows[name] = (
            f"{config.var_dir / 'decisions'}  sink {name} (health grpc://{host}:{port}, "
            f"metrics :{metrics.get(name, '-')})"
        )
    for name, port in list(config.replica_ports("updater").items())[1:]:
        rows[name] = (
            f"grpc://{host}:{port}  health only; member of the partitioned updater group  "
            f"(metrics :{metrics.get(name, '-')})"
        )
    for name, admin in list(config.replica_ports("envoy").items())[1:]:
        rows[name] = f"{scheme}://{config.envoy_target}  (admin http://{host}:{admin})"
    return rows


def _supervise(
    mesh: Mesh,
    edge: EdgeSettings,
    policy: RestartPolicy,
    ready: Callable[[str], None],
    stop: threading.Event,
    demo: bool,
) -> None:
    """Runs the demo if asked, then restarts dying children until ``stop``; stops the mesh
    on the way out, and exits 1 when a child keeps crashing."""
    from services.cli import demo as demo_mod
    from services.mesh import CrashLoop, Supervisor

    supervisor = Supervisor(
        mesh, policy, on_ready=ready, report=lambda line: console.print(f"[yellow]{line}[/yellow]")
    )
    try:
        if demo:
            demo_mod.run(mesh.config, console, _demo_credentials(edge))
        console.print("serving; a child that dies is restarted; Ctrl-C stops everything")
        supervisor.run(stop)
    except CrashLoop as error:
        console.print(f"[red]{error}; stopping everything[/red]")
        # The child's own lines, unwrapped and uninterpreted (they are JSON, not markup).
        console.print(error.log_tail, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from error
    finally:
        with console.status("stopping …"):
            mesh.stop()
        console.print("stopped")


def _demo_credentials(edge: EdgeSettings) -> client.Credentials:
    """What the demo needs to call this edge: the development CA, client certificate and a
    short-lived token from <var>/tls/ (``fraudmesh certs``)."""
    if not edge.tls and edge.auth != "jwt":
        return client.PLAINTEXT
    tls_dir = edge.var_dir / "tls"
    token = None
    if edge.auth == "jwt":
        token = certs_cli.mint_token(
            tls_dir / DEV_FILES["jwt_key"],
            "demo",
            ttl_s=600,
            issuer=edge.jwt_issuer,
            audience=edge.jwt_audience,
        )
    return client.Credentials(
        tls=edge.tls,
        ca_path=tls_dir / DEV_FILES["ca"] if edge.tls else None,
        cert_path=tls_dir / DEV_FILES["client_cert"] if edge.mtls else None,
        key_path=tls_dir / DEV_FILES["client_key"] if edge.mtls else None,
        token=token,
    )
