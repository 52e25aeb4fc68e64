"""The ``fraudmesh loadtest`` command: run the load-test schedule and write its report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def loadtest_command(
    store: Annotated[
        str, typer.Option(help="Online store of the mesh started for the run: sqlite or redis.")
    ] = "sqlite",
    var_dir: Annotated[
        Path, typer.Option(help="State folder with data and a model (`make data`).")
    ] = Path("var"),
    rates: Annotated[
        str, typer.Option(help="Comma-separated offered rates (requests/s), ascending.")
    ] = "100,200,300,400,500,600,700,800,900,1000,1200",
    step_seconds: Annotated[float, typer.Option(help="Length of each rate step.")] = 10.0,
    deadline_ms: Annotated[float, typer.Option(help="Deadline of each call.")] = 42.0,
    target: Annotated[
        str | None,
        typer.Option(help="host:port of a running Envoy; default starts a mesh on free ports."),
    ] = None,
    edge_rate_limit: Annotated[
        int, typer.Option(help="Envoy's local rate limit (rps) of a started mesh.")
    ] = 1000,
    out_dir: Annotated[
        Path | None, typer.Option(help="Report folder; default loadtest/results.")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Report base name; default loadtest-<store>.")
    ] = None,
    saturated_steps: Annotated[
        int, typer.Option(help="Stop after this many consecutive saturated steps.")
    ] = 2,
    gateway_replicas: Annotated[
        int, typer.Option(min=1, help="Gateway processes behind Envoy in a started mesh.")
    ] = 1,
    gateway_in_process: Annotated[
        bool,
        typer.Option(
            help="Gateways of a started mesh read the store and run the model in process."
        ),
    ] = False,
) -> None:
    """Drive Score through Envoy open loop (ghz) up to saturation; write a Markdown + PNG report."""
    from loadtest import runner
    from loadtest.ghz import GhzNotFoundError, find_ghz

    console = Console()
    if store not in ("sqlite", "redis"):
        raise typer.BadParameter("store must be sqlite or redis", param_hint="--store")
    try:
        schedule = [int(r) for r in rates.split(",") if r.strip()]
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--rates") from error
    if not schedule or schedule != sorted(schedule) or schedule[0] < 1:
        raise typer.BadParameter("give ascending positive rates", param_hint="--rates")
    try:
        find_ghz()
    except GhzNotFoundError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from error
    cfg = runner.LoadtestConfig(
        var_dir=var_dir,
        store=store,
        rates=schedule,
        step_s=step_seconds,
        deadline_ms=deadline_ms,
        target=target,
        edge_rate_limit=edge_rate_limit,
        out_dir=out_dir or runner.RESULTS_DIR,
        name=name,
        saturated_steps=saturated_steps,
        gateway_replicas=gateway_replicas,
        gateway_in_process=gateway_in_process,
    )
    try:
        result = runner.run(cfg, log=console.print)
    except (FileNotFoundError, RuntimeError) as error:
        console.print(f"[red]load test failed:[/red] {error}")
        raise typer.Exit(1) from error
    console.print(result.markdown.read_text())
    console.print(f"report: {result.markdown}  plot: {result.plot}")
