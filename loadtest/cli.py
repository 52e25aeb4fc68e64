"""The load-test suite's ``fraudmesh`` commands: ``loadtest`` (rate steps to saturation, with
a report; or variants of the mesh side by side), ``chaos`` (the fault matrix under load) and
``crash`` (the crash matrix: SIGKILL of each process under load).

They join the product's command through the ``fraudmesh.commands`` entry point
(``register``), so the product never imports this package.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from loadtest import provenance

if TYPE_CHECKING:
    from loadtest.compare import Variant
    from loadtest.runner import LoadtestConfig


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
    live_loop: Annotated[
        bool,
        typer.Option(
            help="A started mesh emits decision events and runs the feature updater "
            "(--no-live-loop: neither, to measure what the loop costs)."
        ),
    ] = True,
    observability: Annotated[
        bool,
        typer.Option(
            help="A started mesh also runs Prometheus and the trace collector, as `fraudmesh "
            "up` does (to measure what tracing and the histograms cost, with --compare)."
        ),
    ] = False,
    compare: Annotated[
        list[str] | None,
        typer.Option(
            "--compare",
            metavar="NAME:KEY=VALUE[,KEY=VALUE…]",
            help="A variant of the mesh for a side-by-side run: a name, then environment "
            "settings for its service processes (e.g. stream:FRAUD_GATEWAY_TRANSPORT=stream; "
            "a name alone: the mesh as configured) and the processes it runs of each part "
            "(gateway_replicas, envoy_replicas, features_replicas, scorer_replicas, e.g. "
            "two:gateway_replicas=2,envoy_replicas=2). Give it two or more times: every round "
            "starts a fresh mesh per variant, in an order that rotates each round, on the same "
            "store, rates and requests; the first variant is the baseline of the ratios. "
            "Report: compare-<store>-<a>-vs-<b>.md/.json/.png.",
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option(min=1, help="Rounds of a --compare run (each runs every variant).")
    ] = 3,
) -> None:
    """Drive Score through Envoy open loop (ghz) up to saturation; write a Markdown + PNG report.

    With --compare (two or more times), run those variants of the mesh side by side instead,
    alternating in one session, and report each round and the medians over the rounds.
    """
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
    variants = _variants(compare or [])
    if variants and target is not None:
        raise typer.BadParameter("a comparison starts its own meshes", param_hint="--target")
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
        live_loop=live_loop,
        observability=observability,
    )
    if variants:
        _compare(cfg, variants, rounds, console)
        return
    try:
        result = runner.run(cfg, log=console.print)
    except (FileNotFoundError, RuntimeError) as error:
        console.print(f"[red]load test failed:[/red] {error}")
        raise typer.Exit(1) from error
    console.print(result.markdown.read_text(), markup=False, highlight=False)
    console.print(f"report: {result.markdown}  plot: {result.plot}")


def _variants(texts: list[str]) -> list[Variant]:
    """The --compare variants, checked (none: no comparison)."""
    from loadtest.compare import Variant, check_variants

    if not texts:
        return []
    try:
        variants = [Variant.parse(text) for text in texts]
        check_variants(variants)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--compare") from error
    return variants


def _compare(cfg: LoadtestConfig, variants: list[Variant], rounds: int, console: Console) -> None:
    """Runs the side-by-side session and prints its report."""
    from loadtest import compare

    session = compare.CompareConfig(
        cfg, variants, rounds, " ".join(["fraudmesh", *map(shlex.quote, sys.argv[1:])])
    )
    try:
        result = compare.run(session, log=console.print)
    except (FileNotFoundError, RuntimeError) as error:
        console.print(f"[red]comparison failed:[/red] {error}")
        raise typer.Exit(1) from error
    console.print(result.markdown.read_text(), markup=False, highlight=False)
    console.print(f"report: {result.markdown}  plot: {result.plot}  data: {result.json}")


def chaos_command(
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
    console = Console()
    from loadtest.chaos import ROW_NAMES, Chaos, ChaosPlan, markdown

    selected = {r.strip() for r in rows.split(",") if r.strip()} or set(ROW_NAMES)
    unknown = selected - set(ROW_NAMES)
    if unknown:
        raise typer.BadParameter(
            f"unknown rows {sorted(unknown)}; choose from {ROW_NAMES}", param_hint="--rows"
        )
    plan = ChaosPlan(rps=rps, duration_s=duration_s, overload_capacity_rps=capacity_rps)
    with console.status("running the fault matrix …"):
        result = Chaos(var_dir, var_dir / "logs" / "chaos", plan).run(selected)
    report = markdown(result, plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance.record(" ".join(["fraudmesh", *sys.argv[1:]]))
    out.write_text(provenance.markdown(report, prov))
    console.print(report, highlight=False)
    if not all(row.passed() for row in result):
        raise typer.Exit(1)


def crash_command(
    var_dir: Annotated[Path, typer.Option(help="Prepared state folder (make data).")] = Path("var"),
    store: Annotated[
        str, typer.Option(help="Online store: sqlite, or redis (its row too).")
    ] = "sqlite",
    processes: Annotated[
        str, typer.Option(help="Comma-separated processes to kill (default: every one).")
    ] = "",
    rps: Annotated[int, typer.Option(min=1, help="Steady load through Envoy, calls/s.")] = 100,
    before_s: Annotated[float, typer.Option(min=1, help="Load before each kill.")] = 3.0,
    after_s: Annotated[float, typer.Option(min=1, help="Load after each kill.")] = 12.0,
    gateway_replicas: Annotated[int, typer.Option(min=1, max=9)] = 2,
    envoy_replicas: Annotated[int, typer.Option(min=1, max=9)] = 2,
    features_replicas: Annotated[int, typer.Option(min=1, max=9)] = 2,
    scorer_replicas: Annotated[int, typer.Option(min=1, max=9)] = 2,
    gateway_in_process: Annotated[
        bool, typer.Option(help="The gateways read the store and run the model themselves.")
    ] = False,
    edge_max_in_flight: Annotated[
        int | None, typer.Option(min=1, help="The edge's admission limit (default: none).")
    ] = None,
    journal: Annotated[
        str, typer.Option(help="The gateways' FRAUD_GATEWAY_JOURNAL: write, fsync or off.")
    ] = "write",
    out: Annotated[
        Path | None,
        typer.Option(help="Markdown report; default loadtest/results/crash-<store>.md."),
    ] = None,
) -> None:
    """Run the crash matrix: SIGKILL each process in turn under load; print the table and
    write it with its figures (``--out``, and the same name with ``.json``)."""
    from loadtest.crash import Crash, CrashPlan, markdown, summary

    console = Console()
    if store not in ("sqlite", "redis"):
        raise typer.BadParameter("store must be sqlite or redis", param_hint="--store")
    if journal not in ("write", "fsync", "off"):
        raise typer.BadParameter("journal must be write, fsync or off", param_hint="--journal")
    plan = CrashPlan(
        rps=rps,
        before_s=before_s,
        after_s=after_s,
        store=store,
        gateway_replicas=gateway_replicas,
        envoy_replicas=envoy_replicas,
        features_replicas=features_replicas,
        scorer_replicas=scorer_replicas,
        gateway_in_process=gateway_in_process,
        edge_max_in_flight=edge_max_in_flight,
        journal=journal,
    )
    names = [n.strip() for n in processes.split(",") if n.strip()] or None
    crash = Crash(var_dir, var_dir / "crash", plan)
    try:
        rows = crash.run(names, log=console.print)
    except (ValueError, FileNotFoundError) as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    except RuntimeError as error:
        console.print(f"[red]crash matrix failed:[/red] {error}")
        raise typer.Exit(1) from error
    report = markdown(rows, plan)
    target = out or Path("loadtest/results") / f"crash-{store}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    machine = f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()[0]:.1f} at the end."
    command = " ".join(["fraudmesh", *sys.argv[1:]])
    prov = provenance.record(command)
    target.write_text(provenance.markdown(f"{report}\n{machine}\n", prov))
    figures = summary(rows, plan) | {"command": command, "machine": machine}
    target.with_suffix(".json").write_text(
        json.dumps(provenance.attach(figures, prov), indent=2) + "\n"
    )
    console.print(report, markup=False, highlight=False)
    if not all(row.passed() for row in rows):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Adds ``loadtest`` and ``chaos`` to the ``fraudmesh`` command."""
    app.command(
        "loadtest",
        help="Load-test Score through Envoy with ghz; write a report and plot. With --compare "
        "two or more times, run those variants of the mesh side by side, alternating in one "
        "session (e.g. --store redis --rates 200,400,700 --rounds 3 "
        "--compare unary:FRAUD_GATEWAY_TRANSPORT=unary "
        "--compare stream:FRAUD_GATEWAY_TRANSPORT=stream).",
    )(loadtest_command)
    app.command("chaos", help="Run the fault matrix under load and print the measured table.")(
        chaos_command
    )
    app.command(
        "crash",
        help="Run the crash matrix: SIGKILL each process of the mesh in turn under steady load "
        "(calls failed and late against the row's baseline, answered decisions missing from "
        "the log, time until ready and full quality again).",
    )(crash_command)
