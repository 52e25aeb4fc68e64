"""The ``fraudmesh`` command: run the mesh, score a transaction, train, manage features.

This package is the composition root: it may import every part of fraudmesh, and nothing
imports it. Commands that live outside the product (the load-test suite's ``loadtest``
and ``chaos``) join through the ``fraudmesh.commands`` entry-point group: each entry
point names a function that takes this Typer app and adds its commands, so the product
never imports the load-test package; it is loaded only when installed beside it.
"""

from __future__ import annotations

import signal
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.console import Console
from rich.table import Table

from services import client
from services.cli import certs as certs_cli
from services.cli import data as data_cli
from services.cli import decisions as decisions_cli
from services.cli import features as features_cli
from services.cli import model as model_cli
from services.cli import train as train_cli
from services.common.edge_security import DEV_FILES, EdgeSettings
from services.common.settings import from_mapping
from services.featurestore.settings import FeatureStoreSettings

app = typer.Typer(
    name="fraudmesh",
    help="Real-time fraud scoring mesh: Envoy, gateway, Feast features, ONNX scorer.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(features_cli.app, name="features", help="Simulate data, apply and materialize Feast.")
app.add_typer(
    decisions_cli.app, name="decisions", help="Export, follow and compact the decision log."
)
app.add_typer(data_cli.app, name="data", help="Import your own transaction history.")
app.add_typer(
    model_cli.app,
    name="model",
    help="List model versions; shadow, canary, promote, roll back or retire one.",
)
app.command("train", help="Train, evaluate, export to ONNX, check parity and publish a model.")(
    train_cli.train_command
)
app.command("certs")(certs_cli.certs_command)
app.command("token")(certs_cli.token_command)
console = Console()


@app.command()
def up(
    store: Annotated[
        str, typer.Option(help="Online store: sqlite (embedded) or redis.")
    ] = "sqlite",
    var_dir: Annotated[Path, typer.Option(help="State folder: data, Feast, models, logs.")] = Path(
        "var"
    ),
    demo: Annotated[
        bool, typer.Option(help="Send sample transactions once the mesh is up.")
    ] = False,
    envoy_port: int = 8080,
    admin_port: int = 9901,
    gateway_port: int = 50051,
    features_port: int = 50052,
    scorer_port: int = 50053,
    redis_port: int = 6379,
    decisionlog_port: Annotated[
        int, typer.Option(help="Health port of the decision sink.")
    ] = 50055,
    metrics_port: Annotated[
        int,
        typer.Option(
            help="Prometheus /metrics of the gateway; features, scorer, updater, decision sink "
            "use +1, +2, +3, +4."
        ),
    ] = 9101,
    gateway_in_process: Annotated[
        bool,
        typer.Option(
            help="The gateway reads the online store and runs the model itself instead of "
            "calling the feature service and the scorer (both still run for other clients)."
        ),
    ] = False,
    tls: Annotated[
        bool | None,
        typer.Option("--tls", help="Serve the edge over TLS only (FRAUD_EDGE_TLS)."),
    ] = None,
    mtls: Annotated[
        bool | None,
        typer.Option("--mtls", help="TLS and require client certificates (FRAUD_EDGE_MTLS)."),
    ] = None,
    auth: Annotated[
        str | None,
        typer.Option(help="none, or jwt: every call but health needs a bearer token."),
    ] = None,
    health_port: Annotated[
        int | None,
        typer.Option(help="Plaintext health-only edge listener for probes that cannot do TLS."),
    ] = None,
    max_restarts: Annotated[
        int,
        typer.Option(min=1, help="Crashes of one child within --restart-window that stop all."),
    ] = 5,
    restart_window: Annotated[
        float, typer.Option(min=1, help="Seconds over which crashes are counted.")
    ] = 60.0,
    live_loop: Annotated[
        bool,
        typer.Option(
            help="Decision events, the feature updater (velocity features move with "
            "every transaction) and the decision log; off: no events, and the store "
            "changes only by materialization."
        ),
    ] = True,
    eventlog: Annotated[
        str | None,
        typer.Option(
            help="Event log backend: file, redis or kafka (default: redis with --store "
            "redis, else the file log under the state folder)."
        ),
    ] = None,
    kafka_bootstrap: Annotated[
        str | None, typer.Option(help="Kafka bootstrap servers, with --eventlog kafka.")
    ] = None,
    updater_port: int = 50054,
) -> None:
    """Start redis-server (if configured), the services and Envoy; restart a child that dies;
    stop them all on Ctrl-C/SIGTERM, or when one child keeps crashing."""
    from services.cli import demo as demo_mod
    from services.mesh import CrashLoop, Mesh, MeshConfig, RestartPolicy, Supervisor

    if store not in ("sqlite", "redis"):
        raise typer.BadParameter("store must be sqlite or redis", param_hint="--store")
    if auth not in (None, "none", "jwt"):
        raise typer.BadParameter("auth must be none or jwt", param_hint="--auth")
    # Flags given on the command line win; the rest comes from FRAUD_EDGE_* (production paths).
    flags: dict[str, Any] = {"tls": tls, "mtls": mtls, "auth": auth, "health_port": health_port}
    edge = EdgeSettings(var_dir=var_dir, **{k: v for k, v in flags.items() if v is not None})
    if eventlog not in (None, "file", "redis", "kafka"):
        raise typer.BadParameter("eventlog must be file, redis or kafka", param_hint="--eventlog")
    if eventlog == "redis" and store != "redis":
        raise typer.BadParameter("the Redis event log needs --store redis", param_hint="--eventlog")
    if eventlog == "kafka" and not kafka_bootstrap:
        raise typer.BadParameter("--eventlog kafka needs --kafka-bootstrap")
    config = MeshConfig(
        var_dir=var_dir,
        store=store,
        envoy_port=envoy_port,
        admin_port=admin_port,
        gateway_port=gateway_port,
        features_port=features_port,
        scorer_port=scorer_port,
        redis_port=redis_port,
        decisionlog_port=decisionlog_port,
        gateway_in_process=gateway_in_process,
        metrics_ports={
            name: metrics_port + i
            for i, name in enumerate(("gateway", "features", "scorer", "updater", "decisionlog"))
        },
        edge=edge,
        live_loop=live_loop,
        eventlog=eventlog,
        kafka_bootstrap=kafka_bootstrap,
        updater_port=updater_port,
    )
    try:
        edge.check_files()
    except FileNotFoundError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from error
    mesh = Mesh(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def ready(name: str) -> None:
        console.print(f"[green]ready[/green] {name} (pid {mesh.processes[name].pid})")
        if name == "redis":
            store = from_mapping(FeatureStoreSettings, config.service_env())
            features_cli.materialize_into(store, console)

    with console.status("starting the mesh …"):
        try:
            mesh.start(on_ready=ready)
        except RuntimeError as error:
            console.print(f"[red]start failed:[/red] {error}")
            raise typer.Exit(1) from error
    table = Table(title="fraudmesh is up", show_header=True)
    table.add_column("component")
    table.add_column("endpoint")
    table.add_column("pid")
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
    endpoints = {
        "envoy": f"{scheme}://{config.envoy_target}  (admin http://{config.host}:{admin_port})"
        + (f"  {security}" if security else ""),
        "gateway": f"grpc://{config.host}:{gateway_port}  fraud.v1.FraudScoring"
        f"  (metrics http://{config.host}:{metrics_port}/metrics)",
        "features": f"grpc://{config.host}:{features_port}  fraud.v1.FeatureService ({store})"
        f"  (metrics :{metrics_port + 1})",
        "scorer": f"grpc://{config.host}:{scorer_port}  inference.GRPCInferenceService"
        f"  (metrics :{metrics_port + 2})",
        "redis": f"redis://{config.host}:{redis_port}",
        "decisionlog": f"{config.var_dir / 'decisions'}  (health grpc://{config.host}:"
        f"{config.decisionlog_port}, metrics :{metrics_port + 4})",
        "updater": f"grpc://{config.host}:{updater_port}  health only; event log "
        f"{config.eventlog_backend} → online store ({store})  (metrics :{metrics_port + 3})",
    }
    for name, process in mesh.processes.items():
        table.add_row(name, endpoints.get(name, ""), str(process.pid))
    console.print(table)
    policy = RestartPolicy(max_crashes=max_restarts, window_s=restart_window)
    supervisor = Supervisor(
        mesh, policy, on_ready=ready, report=lambda line: console.print(f"[yellow]{line}[/yellow]")
    )
    try:
        if demo:
            demo_mod.run(config, console, _demo_credentials(edge))
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


@app.command()
def score(
    card_id: Annotated[str, typer.Option(help="Card to charge.")],
    merchant_id: Annotated[str, typer.Option(help="Merchant paid.")],
    amount_minor: Annotated[
        int, typer.Option(min=0, help="Amount in minor units (cents); 0 verifies the card.")
    ],
    currency: Annotated[str, typer.Option(help="ISO 4217 code.")] = "EUR",
    card_not_present: Annotated[bool, typer.Option(help="E-commerce / card not present.")] = False,
    target: Annotated[str, typer.Option(help="Envoy (or gateway) host:port.")] = "127.0.0.1:8080",
    timeout_ms: Annotated[float, typer.Option(help="Client deadline in ms.")] = 42.0,
    tls: Annotated[bool, typer.Option("--tls", help="Connect over TLS.")] = False,
    ca: Annotated[
        Path | None, typer.Option(help="CA that signed the edge's certificate (implies --tls).")
    ] = None,
    cert: Annotated[
        Path | None, typer.Option(help="Client certificate for mutual TLS (implies --tls).")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="Private key of --cert.")] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="FRAUDMESH_TOKEN",
            show_default=False,
            help="Bearer token (prefer the FRAUDMESH_TOKEN variable or --token-file: "
            "a command-line argument is visible to other users of the machine).",
        ),
    ] = None,
    token_file: Annotated[Path | None, typer.Option(help="File holding the bearer token.")] = None,
) -> None:
    """Score one transaction and print the answer."""
    sample = client.Sample(
        "cli", card_id, merchant_id, amount_minor, currency, card_not_present=card_not_present
    )
    if token_file is not None:
        token = token_file.read_text().strip()
    try:
        credentials = client.Credentials(
            tls=tls or ca is not None or cert is not None,
            ca_path=ca,
            cert_path=cert,
            key_path=key,
            token=token,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    try:
        response = client.score(target, sample.request(), timeout_ms / 1000, credentials)
    except grpc.RpcError as error:
        console.print(f"[red]{error.code().name}[/red]: {error.details()}")
        raise typer.Exit(1) from error
    except grpc.FutureTimeoutError as error:
        console.print(f"[red]cannot reach {target}[/red]")
        raise typer.Exit(1) from error
    console.print(client.describe(response))


COMMANDS_GROUP = "fraudmesh.commands"
"""Entry-point group of the functions that add commands to ``app`` (see the module doc)."""


def _add_installed_commands() -> None:
    for entry in entry_points(group=COMMANDS_GROUP):
        entry.load()(app)


def main() -> None:
    """Console-script entry point."""
    _add_installed_commands()
    app()


if __name__ == "__main__":
    main()
