"""The ``fraudmesh`` command: run the mesh, score a transaction, train, manage features."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import grpc
import typer
from rich.console import Console
from rich.table import Table

from loadtest import cli as loadtest_cli
from services import client
from services.features import cli as features_cli
from services.scorer import cli as scorer_cli

app = typer.Typer(
    name="fraudmesh",
    help="Real-time fraud scoring mesh: Envoy, gateway, Feast features, ONNX scorer.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(features_cli.app, name="features", help="Simulate data, apply and materialize Feast.")
app.command("train", help="Train, evaluate, export to ONNX, check parity and publish a model.")(
    scorer_cli.train_command
)
app.command("loadtest", help="Load-test Score through Envoy with ghz; write a report and plot.")(
    loadtest_cli.loadtest_command
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
        typer.Option(help="Prometheus /metrics of the gateway; features and scorer use +1, +2."),
    ] = 9101,
    gateway_in_process: Annotated[
        bool,
        typer.Option(
            help="The gateway reads the online store and runs the model itself instead of "
            "calling the feature service and the scorer (both still run for other clients)."
        ),
    ] = False,
) -> None:
    """Start redis-server (if configured), the services and Envoy; stop them on Ctrl-C/SIGTERM."""
    from services import demo as demo_mod
    from services.mesh import Mesh, MeshConfig

    if store not in ("sqlite", "redis"):
        raise typer.BadParameter("store must be sqlite or redis", param_hint="--store")
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
            name: metrics_port + i for i, name in enumerate(("gateway", "features", "scorer"))
        },
    )
    mesh = Mesh(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def ready(name: str) -> None:
        console.print(f"[green]ready[/green] {name} (pid {mesh.processes[name].pid})")
        if name == "redis":
            features_cli.materialize_into(config.service_env(), console)

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
def chaos(
    var_dir: Annotated[Path, typer.Option(help="Prepared state folder (make data).")] = Path("var"),
    rows: Annotated[str, typer.Option(help="Comma-separated rows to run (default: all).")] = "",
    rps: Annotated[int, typer.Option(help="Steady load through Envoy, calls per second.")] = 200,
    duration_s: Annotated[float, typer.Option(help="Load duration per row.")] = 10.0,
    capacity_rps: Annotated[
        int, typer.Option(help="Edge rate limit in the overload row (3x is offered).")
    ] = 300,
    out: Annotated[Path, typer.Option(help="Markdown report path.")] = Path(
        "loadtest/results/chaos.md"
    ),
) -> None:
    """Run the fault matrix under load and print the measured table."""
    from loadtest.chaos import ROW_NAMES, Chaos, ChaosPlan, markdown

    selected = {r.strip() for r in rows.split(",") if r.strip()} or set(ROW_NAMES)
    unknown = selected - set(ROW_NAMES)
    if unknown:
        raise typer.BadParameter(f"unknown rows {sorted(unknown)}; choose from {ROW_NAMES}")
    plan = ChaosPlan(rps=rps, duration_s=duration_s, overload_capacity_rps=capacity_rps)
    with console.status("running the fault matrix …"):
        result = Chaos(var_dir, var_dir / "logs" / "chaos", plan).run(selected)
    report = markdown(result, plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    console.print(report, highlight=False)
    if not all(row.passed() for row in result):
        raise typer.Exit(1)


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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
