"""``fraudmesh train``: train, evaluate, export and publish a model version, with progress.

The training stack (Feast, LightGBM, scikit-learn) is imported when the command runs, so
that mounting this command costs the other ``fraudmesh`` commands nothing.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import UTC, datetime
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
    "train": "training LightGBM (candidates, early stopping on validation)",
    "evaluate": "evaluating on the test period",
    "export": "exporting to ONNX",
    "parity": "checking LightGBM ↔ ONNX parity",
    "gates": "promotion gates against the live version",
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
    train_from: Annotated[
        datetime | None,
        typer.Option(
            formats=["%Y-%m-%d"],
            help="First day of the training window (UTC); default: 7 days after the data starts.",
        ),
    ] = None,
    train_until: Annotated[
        datetime | None,
        typer.Option(
            formats=["%Y-%m-%d"],
            help="End of the training window (UTC, exclusive); default: --test-from. Leave "
            "the label delay (7 days) before --test-from to train as production would.",
        ),
    ] = None,
    test_from: Annotated[
        datetime | None,
        typer.Option(
            formats=["%Y-%m-%d"],
            help="First day of the test period (UTC); default: the latest 20% of the days.",
        ),
    ] = None,
    test_until: Annotated[
        datetime | None,
        typer.Option(
            formats=["%Y-%m-%d"],
            help="End of the test period (UTC, exclusive); default: the end of the data.",
        ),
    ] = None,
    scores_out: Annotated[
        Path | None,
        typer.Option(
            help="Write every test-period transaction's score here (Parquet: transaction_id "
            "as imported, timestamp, card_id, score, is_fraud)."
        ),
    ] = None,
    report_dir: Annotated[
        Path | None,
        typer.Option(
            help="Also write the evaluation report (evaluation.json, .md, .png) here; it is "
            "always in the published version's folder."
        ),
    ] = None,
    card_precision_k: Annotated[
        int, typer.Option(min=1, help="k of card precision at k (cards per day).")
    ] = 100,
    promote: Annotated[
        bool,
        typer.Option(
            help="Promote the new version to live if its gates pass (parity, average "
            "precision against live on the same test period, single-row p99). Without it "
            "the version is a candidate (docs/lifecycle.md); a store's first version is "
            "always live."
        ),
    ] = False,
    ap_tolerance: Annotated[
        float,
        typer.Option(
            min=0.0, help="How far below live's average precision the new version may be."
        ),
    ] = 0.01,
    latency_ratio: Annotated[
        float,
        typer.Option(min=0.1, help="Most the new single-row p99 may be, as a multiple of live's."),
    ] = 2.0,
) -> None:
    """Train on Feast's point-in-time features, pick the model on a validation period carved
    from the end of the training window, judge it on the test period, export to ONNX and
    publish as a candidate (live with --promote when its gates pass). Validation never
    overlaps the test period; decision thresholds come from it."""
    from services.models.gates import GatePolicy
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
    periods = train.Periods(
        train_from=_utc(train_from),
        train_until=_utc(train_until),
        test_from=_utc(test_from),
        test_until=_utc(test_until),
    )
    params = train.TrainParams(card_precision_k=card_precision_k)
    if seed is not None:
        params = replace(params, seed=seed)
    try:
        with Progress(*columns, console=console) as bar:
            tasks: dict[str, TaskID] = {}

            def report(step: str, done: int, total: int) -> None:
                if step not in tasks:
                    tasks[step] = bar.add_task(_STEP_LABELS.get(step, step), total=total)
                bar.update(tasks[step], completed=done, total=total)

            result = train.train(
                settings,
                root,
                params,
                progress=report,
                periods=periods,
                promote=promote,
                gate_policy=GatePolicy(ap_tolerance=ap_tolerance, latency_ratio=latency_ratio),
            )
    except (FailedPrecondition, train.ParityError) as error:
        console.print(f"[red]training failed:[/red] {error}")
        raise typer.Exit(1) from error
    if scores_out is not None:
        train.write_scores(result.test_scores, scores_out)
        console.print(f"[bold]scores[/bold]: {len(result.test_scores):,} rows in {scores_out}")
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        for name in ("evaluation.json", "evaluation.md", "evaluation.png"):
            shutil.copyfile(result.folder / name, report_dir / name)
    _print_result(result, report_dir)


def _utc(day: datetime | None) -> datetime | None:
    return None if day is None else day.replace(tzinfo=UTC)


def _print_result(result: TrainResult, report_dir: Path | None) -> None:
    m = result.metadata
    report = result.report
    table = Table(title="test period: model and rules fallback")
    table.add_column("metric")
    table.add_column("model", justify="right")
    table.add_column("rules", justify="right")
    model, rules = report.model, report.rules
    k = model.card_precision_k
    rows = [
        ("ROC-AUC", model.roc_auc, rules.roc_auc),
        ("average precision (PR-AUC)", model.average_precision, rules.average_precision),
        ("recall at 1% FPR", model.recall_at_1pct_fpr, rules.recall_at_1pct_fpr),
        (f"card precision at {k}", model.card_precision_at_k, rules.card_precision_at_k),
        ("precision at review", model.review.precision, rules.review.precision),
        ("recall at review", model.review.recall, rules.review.recall),
        ("precision at decline", model.decline.precision, rules.decline.precision),
        ("recall at decline", model.decline.recall, rules.decline.recall),
    ]
    for name, a, b in rows:
        table.add_row(name, f"{a:.4f}", f"{b:.4f}")
    console.print(table)
    for scenario, recall in model.recall_at_review_by_scenario.items():
        console.print(f"  recall at review, {scenario}: {recall:.4f}")
    for period, (start, end) in report.periods.items():
        rows_in = report.rows.get(f"{period}_rows", 0)
        frauds = report.rows.get(f"{period}_frauds", 0)
        console.print(
            f"[bold]{period}[/bold]: {start[:10]} → {end[:10]} ({rows_in:,} rows, {frauds:,} frauds)"
        )
    chosen = max(result.selection, key=lambda c: c["validation_average_precision"])
    console.print(
        f"[bold]selected[/bold] on validation: {chosen['num_leaves']:.0f} leaves, "
        f"min {chosen['min_child_samples']:.0f} per leaf, {chosen['trees']:.0f} trees "
        f"(validation AP {chosen['validation_average_precision']:.4f})"
    )
    console.print(f"[bold]model[/bold]: {m.name} v{m.version} in {result.folder}")
    console.print(
        f"[bold]thresholds[/bold] (from validation): review ≥ {m.thresholds.review:.4f}, "
        f"decline ≥ {m.thresholds.decline:.4f}"
    )
    console.print(f"[bold]parity[/bold]: max |LightGBM − ONNX| = {m.parity_max_abs_diff:.2e}")
    console.print(
        f"[bold]report[/bold]: {(report_dir or result.folder) / 'evaluation.md'} (+ .json, .png)"
    )
    for note in report.notes:
        console.print(f"[yellow]note[/yellow]: {note}")
    if result.gates is not None:
        against = f"v{result.gates.against}" if result.gates.against else "no live version"
        verdict = "[green]passed[/green]" if result.gates.passed else "[red]failed[/red]"
        console.print(f"[bold]gates[/bold] against {against}: {verdict}")
        for check in result.gates.checks:
            mark = "[green]ok[/green]  " if check.passed else "[red]FAIL[/red]"
            console.print(f"  {mark} {check.name}: {check.detail}", highlight=False)
    console.print(f"[bold]state[/bold]: v{m.version} is {result.state.value}")
    for note in result.lifecycle_notes:
        console.print(f"  {note}", highlight=False)
