"""``fraudmesh train``: train, evaluate, export and publish a model version, with progress.

The training stack (Feast, LightGBM, scikit-learn) is imported when the command runs, so
that mounting this command costs the other ``fraudmesh`` commands nothing.
"""

from __future__ import annotations

import contextlib
import enum
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
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

from services.cli import checks, exits
from services.common.errors import FailedPrecondition
from services.decisionlog.settings import DecisionLogSettings
from services.domain import featurespec
from services.featurestore.settings import from_env
from services.models import repository

if TYPE_CHECKING:
    from services.featurestore.settings import FeatureStoreSettings
    from services.models.gates import GatePolicy
    from services.pipelines.evaluate import Evaluation
    from services.pipelines.retraining import TrainingData
    from services.pipelines.train import Periods, TrainParams, TrainResult

console = Console()

_TIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]

_STEP_LABELS = {
    "decisions": "reading the decision log, joining outcomes, merging with the history",
    "dataset": "feature tables of the training dataset",
    "apply": "registering the training dataset (Feast)",
    "features": "point-in-time features (Feast)",
    "train": "training LightGBM (candidates, early stopping on validation)",
    "evaluate": "evaluating on the test period",
    "small model": "small model (distilled and on labels) and the cascade's thresholds",
    "export": "exporting to ONNX",
    "parity": "checking LightGBM ↔ ONNX parity",
    "reference": "reference distributions and test-period intervals (monitoring)",
    "gates": "promotion gates against the live version",
    "publish": "publishing",
}


_ModelRoot = Annotated[
    Path | None, typer.Option(help="Folder of published models; default <var-dir>/models.")
]
_Seed = Annotated[
    int | None,
    typer.Option(min=0, max=2**31 - 1, help="LightGBM seed (default: the training default, 7)."),
]
_VarDir = Annotated[
    Path | None,
    typer.Option(help="State folder (data, Feast, models); default FRAUD_FEATURES_VAR_DIR or var."),
]
_IfMissing = Annotated[
    bool, typer.Option(help="Do nothing when a model version is already published.")
]
_TrainFrom = Annotated[
    datetime | None,
    typer.Option(
        formats=["%Y-%m-%d"],
        help="First day of the training window (UTC); default: 7 days after the data starts.",
    ),
]
_TrainUntil = Annotated[
    datetime | None,
    typer.Option(
        formats=["%Y-%m-%d"],
        help="End of the training window (UTC, exclusive); default: --test-from. Leave "
        "the label delay (7 days) before --test-from to train as production would.",
    ),
]
_TestFrom = Annotated[
    datetime | None,
    typer.Option(
        formats=["%Y-%m-%d"],
        help="First day of the test period (UTC); default: the latest 20% of the days.",
    ),
]
_TestUntil = Annotated[
    datetime | None,
    typer.Option(
        formats=["%Y-%m-%d"],
        help="End of the test period (UTC, exclusive); default: the end of the data.",
    ),
]
_ScoresOut = Annotated[
    Path | None,
    typer.Option(
        help="Write every test-period transaction's score here (Parquet: transaction_id "
        "as imported, timestamp, card_id, score, is_fraud)."
    ),
]
_ReportDir = Annotated[
    Path | None,
    typer.Option(
        help="Also write the evaluation report (evaluation.json, .md, .png) here; it is "
        "always in the published version's folder."
    ),
]
_CardPrecisionK = Annotated[
    int, typer.Option(min=1, help="k of card precision at k (cards per day).")
]
_Promote = Annotated[
    bool,
    typer.Option(
        help="Promote the new version to live if its gates pass (parity, average "
        "precision against live on the same test period, single-row p99). Without it "
        "the version is a candidate (docs/lifecycle.md); a store's first version is "
        "always live."
    ),
]
_ApTolerance = Annotated[
    float,
    typer.Option(
        min=0.0, max=1.0, help="How far below live's average precision the new version may be."
    ),
]
_LatencyRatio = Annotated[
    float,
    typer.Option(
        min=0.001, max=100.0, help="Most the new single-row p99 may be, as a multiple of live's."
    ),
]
_FromDecisions = Annotated[
    bool,
    typer.Option(
        help="Train on the history plus the decision log joined with reported outcomes "
        "(fraud → fraud, legitimate → genuine, no outcome after the 7-day label delay → "
        "genuine; recent or disputed → no label yet), built as a dataset of its own "
        "under --work-dir; the serving dataset and online store are left alone."
    ),
]
_DecisionsRoot = Annotated[
    Path | None,
    typer.Option(
        help="With --from-decisions: the decision log's folder; default "
        "FRAUD_DECISIONLOG_ROOT or <var-dir>/decisions."
    ),
]
_DecisionsSince = Annotated[
    datetime | None,
    typer.Option(
        formats=_TIME_FORMATS,
        help="With --from-decisions: first decided_at read (UTC, inclusive); default all.",
    ),
]
_DecisionsUntil = Annotated[
    datetime | None,
    typer.Option(
        formats=_TIME_FORMATS,
        help="With --from-decisions: end of the decisions read (UTC, exclusive).",
    ),
]
_Feature = Annotated[
    list[str] | None,
    typer.Option(
        "--feature",
        metavar="NAME",
        help="Add a servable feature to the model's default inputs (repeatable; taken after "
        f"them, in the order given): one of {', '.join(featurespec.ADDABLE_FEATURES)}. The "
        "small model, the reference and the gates follow the version's order; the gateway "
        "builds each version's input by name (docs/lifecycle.md).",
    ),
]


class OptionalFeatures(enum.StrEnum):
    """Whether training compares the optional features (``TrainParams.optional_features``)."""

    choose = "choose"
    none = "none"


_OptionalFeatures = Annotated[
    OptionalFeatures,
    typer.Option(
        "--optional-features",
        help="choose: grow the selected setting again with the optional features "
        f"({', '.join(featurespec.OPTIONAL_FEATURES)}) and keep them when they raise the "
        "validation average precision by 1% or more of the inputs' own; none: never "
        "(docs/training.md).",
    ),
]
_WorkDir = Annotated[
    Path | None,
    typer.Option(
        help="With --from-decisions: where the training dataset and its Feast registry "
        "are built (replaced on every run); default <var-dir>/training/from-decisions."
    ),
]


def train_command(
    model_root: _ModelRoot = None,
    seed: _Seed = None,
    var_dir: _VarDir = None,
    if_missing: _IfMissing = False,
    train_from: _TrainFrom = None,
    train_until: _TrainUntil = None,
    test_from: _TestFrom = None,
    test_until: _TestUntil = None,
    scores_out: _ScoresOut = None,
    report_dir: _ReportDir = None,
    card_precision_k: _CardPrecisionK = 100,
    promote: _Promote = False,
    ap_tolerance: _ApTolerance = 0.01,
    latency_ratio: _LatencyRatio = 2.0,
    from_decisions: _FromDecisions = False,
    decisions_root: _DecisionsRoot = None,
    decisions_since: _DecisionsSince = None,
    decisions_until: _DecisionsUntil = None,
    work_dir: _WorkDir = None,
    feature: _Feature = None,
    optional_features: _OptionalFeatures = OptionalFeatures.choose,
) -> None:
    """Train on Feast's point-in-time features, pick the model on a validation period carved
    from the end of the training window, judge it on the test period, export to ONNX and
    publish as a candidate (live with --promote when its gates pass). Validation never
    overlaps the test period; decision thresholds come from it. With --from-decisions the
    data is the history plus the decision log and its outcomes, and the default periods end
    one label delay ago."""
    from services.models.gates import GatePolicy
    from services.pipelines import train

    if not from_decisions:
        _refuse_decision_options(decisions_root, decisions_since, decisions_until, work_dir)
    # Bad dates and paths end the command before any work (exit 2), not after training.
    _check_dates(train_from, train_until, test_from, test_until, decisions_since, decisions_until)
    for name, folder in (("--var-dir", var_dir), ("--decisions-root", decisions_root)):
        checks.existing_folder(name, folder)
    for name, folder in (
        ("--model-root", model_root),
        ("--report-dir", report_dir),
        ("--work-dir", work_dir),
    ):
        checks.output_folder(name, folder)
    checks.output_file("--scores-out", scores_out)
    added = _added_features(feature)
    settings = from_env(var_dir=var_dir)
    root = model_root or settings.var_dir / "models"
    existing = repository.latest_version(root, repository.DEFAULT_MODEL_NAME)
    if if_missing and existing is not None:
        console.print(f"{repository.DEFAULT_MODEL_NAME} v{existing} is already published in {root}")
        return
    periods = train.Periods(
        train_from=_utc(train_from),
        train_until=_utc(train_until),
        test_from=_utc(test_from),
        test_until=_utc(test_until),
    )
    params = train.TrainParams(
        card_precision_k=card_precision_k,
        added_features=added,
        optional_features=optional_features.value,
    )
    if seed is not None:
        params = replace(params, seed=seed)
    policy = GatePolicy(ap_tolerance=ap_tolerance, latency_ratio=latency_ratio)
    decisions = (
        _DecisionLog.of(settings, decisions_root, decisions_since, decisions_until, work_dir)
        if from_decisions
        else None
    )
    result, data = _run(settings, root, params, periods, policy, promote, decisions)
    if data is not None:
        _print_source(data)
    _write_outputs(result, scores_out, report_dir)
    _print_result(result, report_dir)


def _check_dates(
    train_from: datetime | None,
    train_until: datetime | None,
    test_from: datetime | None,
    test_until: datetime | None,
    decisions_since: datetime | None,
    decisions_until: datetime | None,
) -> None:
    """Ends the command (exit 2) on a date that does not parse or periods out of order."""
    checks.ordered(
        ("--train-from", _utc(train_from)),
        ("--train-until", _utc(train_until)),
        ("--test-from", _utc(test_from)),
        ("--test-until", _utc(test_until)),
        touching=("--train-until", "--test-from"),
    )
    checks.ordered(
        ("--decisions-since", _utc_time(decisions_since)),
        ("--decisions-until", _utc_time(decisions_until)),
    )


def _run(
    settings: FeatureStoreSettings,
    root: Path,
    params: TrainParams,
    periods: Periods,
    policy: GatePolicy,
    promote: bool,
    decisions: _DecisionLog | None,
) -> tuple[TrainResult, TrainingData | None]:
    """Trains (on the decision log too, when given) with a progress bar; exits 1 with the
    reason when the data or the parity check does not allow a version."""
    from services.pipelines import retraining, train

    try:
        with _progress_bar() as report:
            if decisions is not None:
                retrained = retraining.train_from_decisions(
                    settings,
                    root,
                    decisions.root,
                    work_dir=decisions.work_dir,
                    since=decisions.since,
                    until=decisions.until,
                    params=params,
                    progress=report,
                    periods=periods,
                    promote=promote,
                    gate_policy=policy,
                )
                return retrained.training, retrained.data
            result = train.train(
                settings,
                root,
                params,
                progress=report,
                periods=periods,
                promote=promote,
                gate_policy=policy,
            )
            return result, None
    except (FailedPrecondition, train.ParityError) as error:
        console.print(f"[red]training failed:[/red] {error}")
        raise typer.Exit(1) from error


@dataclass(frozen=True)
class _DecisionLog:
    """Where ``--from-decisions`` reads the decision log and builds its dataset."""

    root: Path
    since: datetime | None
    until: datetime | None
    work_dir: Path | None

    @classmethod
    def of(
        cls,
        settings: FeatureStoreSettings,
        root: Path | None,
        since: datetime | None,
        until: datetime | None,
        work_dir: Path | None,
    ) -> _DecisionLog:
        """The options as given; the sink's settings (FRAUD_DECISIONLOG_ROOT) name the log
        unless told."""
        log_root = root or DecisionLogSettings(var_dir=settings.var_dir).root_path
        return cls(log_root, _utc_time(since), _utc_time(until), work_dir)


def _print_optional(
    selection: list[dict[str, float]], params: dict[str, str | int | float | bool]
) -> None:
    """Whether the optional features were kept, and the validation figures that said so."""
    grown = [c for c in selection if c.get("optional_features")]
    if not grown:
        return
    without = max(
        c["validation_average_precision"] for c in selection if not c.get("optional_features")
    )
    with_them = grown[0]["validation_average_precision"]
    verdict = "kept" if grown[0].get("selected") else "left out"
    least = params.get("optional_gain")
    console.print(
        f"[bold]optional features[/bold] {verdict}: validation AP {with_them:.4f} with them, "
        f"{without:.4f} without ({with_them / without - 1:+.1%}"
        + (f"; kept from {least:+.0%})" if isinstance(least, float) else ")"),
        highlight=False,
    )


def _added_features(names: list[str] | None) -> tuple[str, ...]:
    """The ``--feature`` names, refused (exit 2) before any work when one is not servable,
    already a default input, or given twice."""
    added = tuple(names or ())
    try:
        featurespec.trained_order(added)
    except featurespec.FeatureChoiceError as error:
        exits.bad_option("--feature", str(error))
    return added


def _refuse_decision_options(
    decisions_root: Path | None,
    decisions_since: datetime | None,
    decisions_until: datetime | None,
    work_dir: Path | None,
) -> None:
    """Options that only mean something with --from-decisions are refused without it."""
    given = [
        name
        for name, value in (
            ("--decisions-root", decisions_root),
            ("--decisions-since", decisions_since),
            ("--decisions-until", decisions_until),
            ("--work-dir", work_dir),
        )
        if value is not None
    ]
    if given:
        raise typer.BadParameter(f"{', '.join(given)} only apply with --from-decisions")


@contextlib.contextmanager
def _progress_bar() -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback that shows each training step as a bar of its own."""
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, TaskID] = {}

        def report(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bar.add_task(_STEP_LABELS.get(step, step), total=total)
            bar.update(tasks[step], completed=done, total=total)

        yield report


def _write_outputs(result: TrainResult, scores_out: Path | None, report_dir: Path | None) -> None:
    """The test scores and a copy of the evaluation report, where asked."""
    from services.pipelines import train

    if scores_out is not None:
        train.write_scores(result.test_scores, scores_out)
        console.print(f"[bold]scores[/bold]: {len(result.test_scores):,} rows in {scores_out}")
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        for name in ("evaluation.json", "evaluation.md", "evaluation.png"):
            shutil.copyfile(result.folder / name, report_dir / name)


def _utc(day: datetime | None) -> datetime | None:
    return None if day is None else day.replace(tzinfo=UTC)


def _utc_time(moment: datetime | None) -> datetime | None:
    """A naive time as UTC; one with a zone as it is."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _print_source(data: TrainingData) -> None:
    c = data.source.counts
    s = data.summary
    console.print(
        f"[bold]decision log[/bold]: {c['decisions']:,} decisions (one per transaction; "
        f"retried calls dropped: {s.retried_transactions:,}), {c['outcomes_read']:,} "
        "outcome(s) read",
        highlight=False,
    )
    if c["outcomes_read"] == 0:
        console.print(
            "  [yellow]no outcome found[/yellow]: decisions older than the label delay count "
            "as genuine; report outcomes (ReportOutcome) to label frauds",
            highlight=False,
        )
    console.print(
        f"  {c['decision_rows']:,} added to the history's {c['history_rows']:,} transactions, "
        f"{c['decisions_in_history']:,} already in it (taken once; "
        f"{c['relabelled_history']:,} relabelled by an outcome)",
        highlight=False,
    )
    console.print(
        f"  labelled by outcomes: {c['labelled_by_outcome']:,} ({c['outcome_frauds']:,} fraud, "
        f"{c['outcome_legitimate']:,} legitimate); genuine after the label delay: "
        f"{c['presumed_genuine']:,}; no label yet: {c['unlabelled_recent']:,} recent, "
        f"{c['disputed']:,} disputed (in the dataset, not in any period); "
        f"skipped: {c['decisions_skipped']:,}",
        highlight=False,
    )
    horizon = data.source.label_horizon
    console.print(
        f"[bold]training dataset[/bold]: {data.settings.data_path} ({c['rows']:,} transactions, "
        f"{c['frauds']:,} frauds)"
        + (f"; labels complete up to {horizon:%Y-%m-%d %H:%M} UTC" if horizon else ""),
        highlight=False,
    )


def _print_inputs(order: list[str]) -> None:
    """How many inputs the version takes, naming those added to the default ones."""
    added = order[len(featurespec.MODEL_FEATURES) :]
    also = f", then {', '.join(added)}" if added else ""
    console.print(f"[bold]inputs[/bold]: {len(order)} (the default ones{also})", highlight=False)


def _print_result(result: TrainResult, report_dir: Path | None) -> None:
    m = result.metadata
    report = result.report
    table = Table(title="test period: model, cascade, small model alone, rules fallback")
    table.add_column("metric")
    scorers = [("model", report.model), ("cascade", report.cascade)]
    scorers += [("small model", report.small_model), ("rules", report.rules)]
    judged = [(name, e) for name, e in scorers if e is not None]
    for name, _ in judged:
        table.add_column(name, justify="right")
    k = report.model.card_precision_k
    rows: list[tuple[str, Callable[[Evaluation], float]]] = [
        ("ROC-AUC", lambda e: e.roc_auc),
        ("average precision (PR-AUC)", lambda e: e.average_precision),
        ("recall at 1% FPR", lambda e: e.recall_at_1pct_fpr),
        (f"card precision at {k}", lambda e: e.card_precision_at_k),
        ("precision at review", lambda e: e.review.precision),
        ("recall at review", lambda e: e.review.recall),
        ("precision at decline", lambda e: e.decline.precision),
        ("recall at decline", lambda e: e.decline.recall),
    ]
    for label, get in rows:
        table.add_row(label, *(f"{get(e):.4f}" for _, e in judged))
    console.print(table)
    for scenario, recall in report.model.recall_at_review_by_scenario.items():
        console.print(f"  recall at review, {scenario}: {recall:.4f}")
    for period, (start, end) in report.periods.items():
        rows_in = report.rows.get(f"{period}_rows", 0)
        frauds = report.rows.get(f"{period}_frauds", 0)
        console.print(
            f"[bold]{period}[/bold]: {start[:10]} → {end[:10]} ({rows_in:,} rows, {frauds:,} frauds)"
        )
    chosen = next(c for c in result.selection if c.get("selected"))
    console.print(
        f"[bold]selected[/bold] on validation: {chosen['num_leaves']:.0f} leaves, "
        f"min {chosen['min_child_samples']:.0f} per leaf, {chosen['trees']:.0f} trees "
        f"(validation AP {chosen['validation_average_precision']:.4f})"
    )
    _print_optional(result.selection, m.params)
    console.print(f"[bold]model[/bold]: {m.name} v{m.version} in {result.folder}")
    _print_inputs(m.feature_order)
    console.print(
        f"[bold]thresholds[/bold] (from validation): review ≥ {m.thresholds.review:.4f}, "
        f"decline ≥ {m.thresholds.decline:.4f}"
    )
    console.print(f"[bold]parity[/bold]: max |LightGBM − ONNX| = {m.parity_max_abs_diff:.2e}")
    small, cascade = m.small_model, report.cascade_summary
    if small is not None and cascade:
        console.print(
            f"[bold]small model[/bold] ({small.kind}, kept on validation AP): {small.trees} "
            f"trees of at most {small.num_leaves} leaves; clear-approve below "
            f"{small.clear_approve:.4g} (first stage: {cascade['cascade_first_stage_share']:.1%}"
            f" of the test payments, {cascade['cascade_review_frauds_lost']:.0f} of "
            f"{cascade['cascade_review_frauds']:.0f} review frauds approved); alone: review ≥ "
            f"{small.thresholds.review:.4f}, decline ≥ {small.thresholds.decline:.4f}; parity "
            f"{small.parity_max_abs_diff:.2e}"
        )
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
