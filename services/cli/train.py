"""``fraudmesh train``: train, evaluate, export and publish a model version, with progress.

The training stack (Feast, LightGBM, scikit-learn) is imported when the command runs, so
that mounting this command costs the other ``fraudmesh`` commands nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from services.common.errors import FailedPrecondition
from services.featurestore.settings import from_env
from services.models import repository

if TYPE_CHECKING:
    from services.pipelines.train import TrainResult

console = Console()

_STEP_LABELS = {
    "features": "point-in-time features (Feast)",
    "train": "training LightGBM",
    "evaluate": "evaluating on the holdout",
    "export": "exporting to ONNX",
    "parity": "checking LightGBM ↔ ONNX parity",
    "publish": "publishing",
}


def train_command(
    model_root: Annotated[
        Path | None, typer.Option(help="Folder of published models; default <var-dir>/models.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="LightGBM seed (default: the training default, 7).")
    ] = None,
    var_dir: Annotated[
        Path | None,
        typer.Option(
            help="State folder (data, Feast, models); default FRAUD_FEATURES_VAR_DIR or var."
        ),
    ] = None,
    if_missing: Annotated[
        bool, typer.Option(help="Do nothing when a model version is already published.")
    ] = False,
) -> None:
    """Train on Feast's point-in-time features, evaluate, export to ONNX and publish."""
    from services.pipelines import train

    settings = from_env(var_dir=var_dir)
    root = model_root or settings.var_dir / "models"
    existing = repository.latest_version(root, repository.DEFAULT_MODEL_NAME)
    if if_missing and existing is not None:
        console.print(f"{repository.DEFAULT_MODEL_NAME} v{existing} is already published in {root}")
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console) as bar:
            tasks: dict[str, TaskID] = {}

            def report(step: str, done: int, total: int) -> None:
                if step not in tasks:
                    tasks[step] = bar.add_task(_STEP_LABELS.get(step, step), total=total)
                bar.update(tasks[step], completed=done, total=total)

            params = train.TrainParams() if seed is None else train.TrainParams(seed=seed)
            result = train.train(settings, root, params, progress=report)
    except (FailedPrecondition, train.ParityError) as error:
        console.print(f"[red]training failed:[/red] {error}")
        raise typer.Exit(1) from error
    _print_result(result)


def _print_result(result: TrainResult) -> None:
    metrics = result.metadata.metrics
    table = Table(title="holdout metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in sorted(metrics):
        value = metrics[name]
        shown = f"{value:,.0f}" if name.endswith(("_rows", "_frauds")) else f"{value:.4f}"
        table.add_row(name, shown)
    console.print(table)
    m = result.metadata
    window = m.training_window
    console.print(f"[bold]model[/bold]: {m.name} v{m.version} in {result.folder}")
    console.print(
        f"[bold]window[/bold]: {window.start:%Y-%m-%d} → {window.end:%Y-%m-%d} "
        f"(holdout from {window.holdout_start:%Y-%m-%d})"
    )
    console.print(
        f"[bold]thresholds[/bold]: review ≥ {m.thresholds.review:.4f}, "
        f"decline ≥ {m.thresholds.decline:.4f}"
    )
    console.print(f"[bold]parity[/bold]: max |LightGBM − ONNX| = {m.parity_max_abs_diff:.2e}")
