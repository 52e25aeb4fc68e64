"""``fraudmesh features …``: simulate the data, apply the Feast repo, materialize it.

Feast is imported inside the commands that use it: importing it takes seconds (its
classes are instrumented by typeguard at import), which every other ``fraudmesh``
command would otherwise pay.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.common.errors import FailedPrecondition
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings, from_env
from services.pipelines import dataset
from services.pipelines import simulate as simulator

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()


class PresetName(enum.StrEnum):
    """Simulator sizes (see ``simulate.PRESETS``)."""

    default = "default"
    small = "small"


VarDirOption = Annotated[
    Path | None,
    typer.Option(help="State folder (data, Feast, models); default FRAUD_FEATURES_VAR_DIR or var."),
]


@app.command()
def simulate(
    seed: Annotated[
        int | None, typer.Option(help="Simulator seed (default: FRAUD_SIMULATOR_SEED or 7).")
    ] = None,
    preset: Annotated[
        PresetName | None,
        typer.Option(
            help="Data size: default (~200k) or small (~40k); default FRAUD_SIMULATOR_PRESET."
        ),
    ] = None,
    end: Annotated[
        datetime | None,
        typer.Option(formats=["%Y-%m-%d"], help="End of the window (UTC midnight); default today."),
    ] = None,
    var_dir: VarDirOption = None,
    if_missing: Annotated[
        bool, typer.Option(help="Do nothing when the data already exists.")
    ] = False,
) -> None:
    """Simulate transactions with fraud and write the Parquet files Feast reads."""
    settings = from_env(var_dir=var_dir)
    if if_missing and layout.data_present(settings.data_path):
        console.print(f"data already in {settings.data_path}; nothing to do")
        return
    defaults = simulator.SimulatorSettings()
    params = simulator.preset(
        preset.value if preset else defaults.preset,
        seed=defaults.seed if seed is None else seed,
        end=end.date() if end else defaults.end,
    )
    started = time.perf_counter()
    with console.status("simulating …") as status:
        sim = simulator.simulate(params, progress=lambda step: status.update(f"{step} …"))
        status.update("computing card and merchant features …")
        data = dataset.Dataset.from_transactions(sim.transactions)
        status.update("writing Parquet …")
        paths = dataset.write(data, settings.data_path)
    elapsed = time.perf_counter() - started
    tx = sim.transactions
    table = Table(title=f"simulated {len(tx):,} transactions in {elapsed:.1f} s")
    table.add_column("scenario")
    table.add_column("transactions", justify="right")
    table.add_column("share", justify="right")
    for scenario, count in tx["fraud_scenario"].value_counts().items():
        table.add_row(str(scenario), f"{count:,}", f"{count / len(tx):.3%}")
    console.print(table)
    console.print(
        f"window {params.start_time:%Y-%m-%d} → {params.end_time:%Y-%m-%d} (seed {params.seed}, "
        f"{params.n_customers:,} customers, {params.n_merchants:,} merchants)"
    )
    for path in paths.values():
        console.print(f"  wrote {path}")


@app.command()
def apply(var_dir: VarDirOption = None) -> None:
    """Register the entities, sources, feature views and feature service in the registry."""
    from services.featurestore import admin

    settings = from_env(var_dir=var_dir)
    with console.status("applying the Feast repo …"), _failures():
        admin.apply(settings)
    console.print(
        f"applied to {settings.registry_file} (feature_store.yaml in {settings.data_path})"
    )


@app.command()
def materialize(var_dir: VarDirOption = None) -> None:
    """Load the newest features of every card and merchant into the online store."""
    with _failures():
        materialize_with_progress(from_env(var_dir=var_dir), console)


@contextlib.contextmanager
def _failures() -> Iterator[None]:
    """Turns an error the user can act on into its message and exit status 1."""
    try:
        yield
    except FailedPrecondition as error:
        console.print(f"[red]failed:[/red] {error}")
        raise typer.Exit(1) from error


def materialize_with_progress(settings: FeatureStoreSettings, out: Console) -> None:
    """Materializes the whole data window, showing a progress bar on ``out``."""
    from services.featurestore import admin

    started = time.perf_counter()
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} views"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out) as bar:
        task = bar.add_task(f"materializing into {settings.store}", total=len(admin.VIEW_NAMES))

        def report(view: str, done: int, total: int) -> None:
            label = f"materializing {view} into {settings.store}" if view else "materialized"
            bar.update(task, description=label, completed=done, total=total)

        admin.materialize(settings, progress=report)
    out.print(
        f"online store ({settings.store}) holds the newest features of every card and merchant "
        f"({time.perf_counter() - started:.1f} s)"
    )


def materialize_into(settings: FeatureStoreSettings, out: Console) -> None:
    """Applies the repo and materializes into the store ``settings`` name (e.g. a fresh
    Redis the mesh just started)."""
    from services.featurestore import admin

    admin.apply(settings)
    materialize_with_progress(settings, out)
