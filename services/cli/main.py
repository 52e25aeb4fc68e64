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
from typing import Annotated

import grpc
import typer
from rich.console import Console
from rich.table import Table

from services import client
from services.cli import features as features_cli
from services.cli import train as train_cli
from services.common.settings import from_mapping
from services.featurestore.settings import FeatureStoreSettings

app = typer.Typer(
    name="fraudmesh",
    help="Real-time fraud scoring mesh: Envoy, gateway, Feast features, ONNX scorer.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(features_cli.app, name="features", help="Simulate data, apply and materialize Feast.")
app.command("train", help="Train, evaluate, export to ONNX, check parity and publish a model.")(
    train_cli.train_command
)
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
    metrics_port: Annotated[
        int,
        typer.Option(
            help="Prometheus /metrics of the gateway; features, scorer and updater use +1, +2, +3."
        ),
    ] = 9101,
    gateway_in_process: Annotated[
        bool,
        typer.Option(
            help="The gateway reads the online store and runs the model itself instead of "
            "calling the feature service and the scorer (both still run for other clients)."
        ),
    ] = False,
    live_loop: Annotated[
        bool,
        typer.Option(
            help="Decision events and the feature updater (velocity features move with "
            "every transaction); off: the store changes only by materialization."
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
    """Start redis-server (if configured), the services and Envoy; stop them on Ctrl-C/SIGTERM."""
    from services.cli import demo as demo_mod
    from services.mesh import Mesh, MeshConfig

    if store not in ("sqlite", "redis"):
        raise typer.BadParameter("store must be sqlite or redis", param_hint="--store")
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
        gateway_in_process=gateway_in_process,
        metrics_ports={
            name: metrics_port + i
            for i, name in enumerate(("gateway", "features", "scorer", "updater"))
        },
        live_loop=live_loop,
        eventlog=eventlog,
        kafka_bootstrap=kafka_bootstrap,
        updater_port=updater_port,
    )
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
    endpoints = {
        "envoy": f"grpc://{config.envoy_target}  (admin http://{config.host}:{admin_port})",
        "gateway": f"grpc://{config.host}:{gateway_port}  fraud.v1.FraudScoring"
        f"  (metrics http://{config.host}:{metrics_port}/metrics)",
        "features": f"grpc://{config.host}:{features_port}  fraud.v1.FeatureService ({store})"
        f"  (metrics :{metrics_port + 1})",
        "scorer": f"grpc://{config.host}:{scorer_port}  inference.GRPCInferenceService"
        f"  (metrics :{metrics_port + 2})",
        "redis": f"redis://{config.host}:{redis_port}",
        "updater": f"grpc://{config.host}:{updater_port}  health only; event log "
        f"{config.eventlog_backend} → online store ({store})  (metrics :{metrics_port + 3})",
    }
    for name, process in mesh.processes.items():
        table.add_row(name, endpoints.get(name, ""), str(process.pid))
    console.print(table)
    try:
        if demo:
            demo_mod.run(config, console)
        console.print("serving; Ctrl-C stops everything")
        while not stop.wait(0.5):
            dead = mesh.dead()
            if dead:
                for process in dead:
                    console.print(
                        f"[red]{process.name} exited ({process.returncode()})[/red]\n"
                        f"{process.log_tail()}"
                    )
                raise typer.Exit(1)
    finally:
        with console.status("stopping …"):
            mesh.stop()
        console.print("stopped")


@app.command()
def score(
    card_id: Annotated[str, typer.Option(help="Card to charge.")],
    merchant_id: Annotated[str, typer.Option(help="Merchant paid.")],
    amount_minor: Annotated[int, typer.Option(help="Amount in minor units (cents).")],
    currency: Annotated[str, typer.Option(help="ISO 4217 code.")] = "EUR",
    card_not_present: Annotated[bool, typer.Option(help="E-commerce / card not present.")] = False,
    target: Annotated[str, typer.Option(help="Envoy (or gateway) host:port.")] = "127.0.0.1:8080",
    timeout_ms: Annotated[float, typer.Option(help="Client deadline in ms.")] = 42.0,
) -> None:
    """Score one transaction and print the answer."""
    sample = client.Sample(
        "cli", card_id, merchant_id, amount_minor, currency, card_not_present=card_not_present
    )
    try:
        response = client.score(target, sample.request(), timeout_ms / 1000)
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
