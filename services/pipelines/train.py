"""Training: Feast point-in-time features → LightGBM → test-period evaluation → ONNX → publish.

``train`` runs the steps in order: the training frame (``training.frame``), the periods
(``training.periods``), model selection on the validation period and the refit on the whole
training window (``training.selection``), thresholds and the test-period evaluation, the small
model for the gateway's cascade and fallback (``training.small``), ONNX export and parity
(``training.export``), the promotion gates, publishing. How periods, selection and thresholds
are chosen is in
``docs/training.md``.

Every step takes the version's inputs in its order, ``TrainParams.feature_order``: the default
inputs, then any servable features added to them (``fraudmesh train --feature``).
"""

from __future__ import annotations

import contextlib
import json
import resource
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd

from services.common import filecommit
from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.domain.rules_quality import rules_scores
from services.featurestore.settings import FeatureStoreSettings
from services.models import gates as promotion_gates
from services.models import reference, repository
from services.models.lifecycle import GateReport, ModelLifecycle, VersionState
from services.pipelines import evaluate
from services.pipelines.training import small as small_model
from services.pipelines.training.export import (
    INPUT_NAME,
    OUTPUT_NAME,
    PARITY_TOLERANCE,
    ParityError,
    export_onnx,
    metadata,
    parity_gap,
)
from services.pipelines.training.frame import training_frame as _training_frame
from services.pipelines.training.params import Progress, TrainingDataError, TrainParams
from services.pipelines.training.periods import Periods, describe, period_strings
from services.pipelines.training.periods import period_notes as _notes
from services.pipelines.training.periods import training_window as _window
from services.pipelines.training.reference import version_reference
from services.pipelines.training.selection import (
    Rows,
    Selection,
    predict,
    refit,
    sample_genuine,
    select,
)

__all__ = [
    "INPUT_NAME",
    "OUTPUT_NAME",
    "PARITY_TOLERANCE",
    "SCORE_COLUMNS",
    "DataSource",
    "ParityError",
    "Periods",
    "Progress",
    "TrainParams",
    "TrainResult",
    "TrainingDataError",
    "train",
    "write_scores",
]


@dataclass(frozen=True)
class TrainResult:
    """The published version, its evaluation, the test scores and how long each step took."""

    metadata: repository.ModelMetadata
    folder: Path
    seconds: dict[str, float]
    report: evaluate.Report
    test_scores: pd.DataFrame
    """One row per test-period transaction: ``transaction_id`` (as imported), ``timestamp``,
    ``card_id``, ``score``, ``is_fraud``."""
    selection: list[dict[str, float]] = field(default_factory=list)
    """Each candidate's validation average precision and best number of trees."""
    gates: GateReport | None = None
    """The promotion gates, judged against the live version on the same test period."""
    state: VersionState = VersionState.CANDIDATE
    """The version's lifecycle state after the run: a candidate, or live once promoted."""
    lifecycle_notes: list[str] = field(default_factory=list)
    """Why the version was or was not promoted."""


@dataclass(frozen=True)
class DataSource:
    """Where a dataset came from, when it is more than one history's labels (retraining from
    the decision log): recorded in the version's metrics and its evaluation report."""

    counts: dict[str, int]
    """Rows by origin and label (``source_<name>`` in the metrics)."""
    label_horizon: datetime | None = None
    """Labels are complete up to here; after it only payments with a reported outcome are
    labelled (mostly frauds), so the default periods end on its day."""
    published_by: str = "fraudmesh train"
    """Who publishes the version, for the lifecycle's audit trail."""
    notes: tuple[str, ...] = ()
    """Caveats about the data, for the report."""

    def metrics(self) -> dict[str, float]:
        """The counts as metrics (``source_`` prefix)."""
        return {f"source_{name}": float(value) for name, value in self.counts.items()}


SCORE_COLUMNS = ("transaction_id", "timestamp", "card_id", "score", "is_fraud")
"""Columns of ``TrainResult.test_scores`` and of the ``--scores-out`` file."""


def train(
    settings: FeatureStoreSettings,
    model_root: Path,
    params: TrainParams | None = None,
    progress: Progress | None = None,
    periods: Periods | None = None,
    promote: bool = False,
    gate_policy: promotion_gates.GatePolicy | None = None,
    source: DataSource | None = None,
) -> TrainResult:
    """Trains, selects on validation, evaluates on the test period, exports, checks parity,
    judges the promotion gates against the live version on the same test period and
    publishes a new version as a **candidate**. It goes live only with ``promote`` and
    passed gates, or when no version is live yet (the first model of a store). ``source``
    describes a dataset built from more than one origin (see ``DataSource``)."""
    params = params or TrainParams()
    steps = _Steps(progress)
    horizon = source.label_horizon if source is not None else None
    data, model, params = _trained(settings, params, periods or Periods(), horizon, steps)
    with steps.step("evaluate"):
        judged = _judge(model, data, params, source)
    with steps.step("small model"):
        small = small_model.build(model.booster, data, judged.thresholds, judged.scores, params)
        judged = replace(
            judged, report=small.report(judged.report), metrics=judged.metrics | small.metrics()
        )
    with tempfile.TemporaryDirectory(prefix="fraudmesh-train-") as tmp:
        work = Path(tmp)
        with steps.step("export"):
            onnx_path = work / repository.MODEL_FILE
            export_onnx(model.booster, len(data.order), onnx_path)
        with steps.step("parity"):
            test_x = data.x[data.test]
            parity = _check_parity(onnx_path, test_x, judged.scores)
            small_parity = small.export(work / repository.SMALL_MODEL_FILE, test_x)
            del test_x
        with steps.step("reference"):
            test = (data.y[data.test], judged.scores, data.tested["card_id"].to_numpy())
            version_reference(
                model.selected, data.x[data.valid], data.raw_valid, data.window,
                judged.thresholds, test, params.seed, (small.booster, small.clear_approve),
                data.order,
            ).write(work)  # fmt: skip
        with steps.step("gates"):
            lifecycle = ModelLifecycle(model_root)
            live = lifecycle.read().routing.live
            candidate = metadata(
                judged.thresholds,
                data.defaults,
                judged.metrics,
                data.window,
                parity,
                params,
                created_at=datetime.now(UTC),
            ).model_copy(update={"small_model": small.metadata(small_parity)})
            gate_report = _gates(candidate, onnx_path, data, model_root, gate_policy, live)
        with steps.step("publish"):
            _write_version_files(work, model, judged, data, steps, small.curves())
            published, folder, _ = lifecycle.publish_candidate(
                candidate,
                {name: work / name for name in _VERSION_FILES},
                gate_report,
                by=source.published_by if source is not None else "fraudmesh train",
            )
            state, notes = _promote_if_asked(
                lifecycle, published.version, gate_report, promote, live
            )
    return TrainResult(
        published, folder, steps.seconds, judged.report, judged.test_scores, model.selection,
        gates=gate_report, state=state, lifecycle_notes=notes,
    )  # fmt: skip


def _trained(
    settings: FeatureStoreSettings,
    params: TrainParams,
    periods: Periods,
    horizon: datetime | None,
    steps: _Steps,
) -> tuple[_Dataset, _Model, TrainParams]:
    """The training frame's periods, the model grown on them, and the version's inputs: the
    params' own, or with the optional features when selection kept them."""
    with steps.step("features"):
        frame = _training_frame(settings)
    # The columns of every input the run may choose: the version's, then the optional ones.
    data = _split(frame, params, periods, horizon, params.feature_order + params.optional)
    del frame
    with steps.step("train", counted=False):
        model = _fit(data, params, steps.report)
    params = replace(params, added_features=model.added_features)
    return _narrowed(data, params.feature_order), model, params


class _Steps:
    """Progress and wall time of a run's steps."""

    def __init__(self, progress: Progress | None) -> None:
        self.report: Progress = progress or (lambda step, done, total: None)
        self.seconds: dict[str, float] = {}
        """Seconds each finished step took."""
        self.peak_mb: dict[str, float] = {}
        """The process's peak resident memory when each step finished (MB): the step where
        it rises is the one that needed it."""

    @contextlib.contextmanager
    def step(self, name: str, *, counted: bool = True) -> Iterator[None]:
        """Times the step; ``counted`` reports it as 0 of 1 before and 1 of 1 after (a step
        that reports its own progress is not counted). A step that raises reports nothing."""
        started = time.perf_counter()
        if counted:
            self.report(name, 0, 1)
        yield
        if counted:
            self.report(name, 1, 1)
        self.seconds[name] = round(time.perf_counter() - started, 3)
        self.peak_mb[name] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


@dataclass(frozen=True)
class _Dataset:
    """The model inputs and labels of every transaction, and which rows each period holds."""

    window: repository.TrainingWindow
    first_seen: pd.Timestamp
    """The first transaction's time (how much history the first training rows have)."""
    unlabelled: dict[str, int]
    """Payments without a label inside the training and the test window."""
    x: np.ndarray
    y: np.ndarray
    fit: np.ndarray
    """Mask of the labelled rows the trees are grown on."""
    valid: np.ndarray
    """Mask of the labelled validation rows (selection and thresholds)."""
    test: np.ndarray
    """Mask of the labelled test rows."""
    defaults: dict[str, float]
    """Default feature values, from the training window's population."""
    tested: pd.DataFrame
    """Transaction id, time, card (and scenario, when known) of each test row."""
    raw_valid: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    """The validation rows' features before defaults (NaN where missing): the reference."""
    order: tuple[str, ...] = featurespec.MODEL_FEATURES
    """The columns of ``x``, ``defaults`` and ``raw_valid``: the version's feature order."""


def _split(
    frame: pd.DataFrame,
    params: TrainParams,
    periods: Periods,
    horizon: datetime | None,
    order: tuple[str, ...] | None = None,
) -> _Dataset:
    """The periods of ``frame`` and its rows as model inputs in ``order`` (default: the
    params' ``feature_order``); raises unless every period holds both fraud and genuine
    transactions."""
    order = order or params.feature_order
    window = _window(frame["timestamp"], params, periods, horizon)
    first_seen = frame["timestamp"].min()
    assert window.train_end is not None and window.validation_start is not None
    stamp = frame["timestamp"]
    # Unlabelled payments stay in the frame (their features were computed with them) but
    # belong to no period.
    known = frame["is_fraud"].notna().to_numpy()
    in_train = ((stamp >= window.start) & (stamp < window.train_end)).to_numpy()
    in_test = ((stamp >= window.holdout_start) & (stamp < window.end)).to_numpy()
    unlabelled = {"train": int((in_train & ~known).sum()), "test": int((in_test & ~known).sum())}
    fit = ((stamp >= window.start) & (stamp < window.validation_start)).to_numpy() & known
    valid = ((stamp >= window.validation_start) & (stamp < window.train_end)).to_numpy() & known
    test = in_test & known
    del in_train, in_test
    # Column by column, without copying the frame: it holds every transaction.
    # The helper store features come from the same offline read as the others: the store's
    # values (the country codes as numbers), as the feature service serves them.
    raw = featurespec.model_frame(
        frame, helpers=[n for n in order if n in featurespec.ADDABLE_FEATURES]
    )
    defaults = featurespec.population_defaults(raw, rows=fit | valid, names=order)
    x = featurespec.model_matrix(raw, defaults, np.float32, names=order)
    raw_valid = raw.loc[valid, list(order)].to_numpy(dtype=np.float64)
    del raw
    y = frame["is_fraud"].fillna(False).to_numpy(dtype=np.int32)
    kept = ["transaction_id", "timestamp", "card_id"]
    kept += ["fraud_scenario"] if "fraud_scenario" in frame.columns else []
    tested = frame.loc[test, kept].reset_index(drop=True)
    for name, rows in (("training", fit), ("validation", valid), ("test", test)):
        if not rows.any() or y[rows].sum() == 0 or y[rows].sum() == rows.sum():
            raise TrainingDataError(
                f"the {name} period ({describe(window, name)}) needs both fraud and genuine "
                "transactions: choose other periods"
            )
    return _Dataset(
        window, first_seen, unlabelled, x, y, fit, valid, test, defaults, tested, raw_valid, order
    )


def _narrowed(data: _Dataset, order: tuple[str, ...]) -> _Dataset:
    """``data`` with the inputs of ``order``, a prefix of its own (views, not copies)."""
    if order == data.order:
        return data
    assert data.order[: len(order)] == order, (order, data.order)
    inputs = len(order)
    return replace(
        data,
        x=data.x[:, :inputs],
        raw_valid=data.raw_valid[:, :inputs],
        defaults={name: data.defaults[name] for name in order},
        order=order,
    )


@dataclass(frozen=True)
class _Model:
    """The published model and what selection saw."""

    booster: lgb.Booster
    """The model to publish: the selected setting refitted on the whole training window, or
    the selected candidate itself when ``TrainParams.refit`` is off."""
    selection: list[dict[str, float]]
    """Each candidate's validation average precision and best number of trees."""
    valid_rows: np.ndarray
    """The (sampled) validation rows early stopping scored."""
    valid_scores: np.ndarray
    """The selected candidate's scores of ``valid_rows``: it never trained on them, so the
    thresholds set on them hold out of sample (the refit, which did, would set them too low)."""
    selected: lgb.Booster
    """The selected candidate: its validation scores are the reference distribution (the
    refit's own would be in-sample there)."""
    added_features: tuple[str, ...] = ()
    """The features the model takes besides the default inputs: the params' added ones,
    then the optional ones when they were chosen."""


def _fit(data: _Dataset, params: TrainParams, report: Progress) -> _Model:
    """Samples the genuine rows down to the caps, selects the setting on validation (and the
    optional features, ``TrainParams.optional_features``) and refits it on the whole
    training window. ``data`` holds the params' inputs, then the optional features."""
    x, y = data.x, data.y
    rng = np.random.default_rng(params.seed)
    fit_rows, fit_weights = sample_genuine(y, data.fit, params.max_fit_rows, rng)
    valid_rows, valid_weights = sample_genuine(y, data.valid, params.max_validation_rows, rng)
    inputs = len(params.feature_order)
    searched = params.max_trees * (len(params.candidates) + (1 if params.optional else 0))
    total = searched + (params.max_trees if params.refit else 0)
    fit = Rows(x[fit_rows], y[fit_rows], fit_weights)
    valid = Rows(x[valid_rows], y[valid_rows], valid_weights)
    chosen = select(_columns(fit, inputs), _columns(valid, inputs), params, report, total)
    best = _best(chosen.figures)
    figures = [
        figure | {"optional_features": 0.0, "selected": float(i == best)}
        for i, figure in enumerate(chosen.figures)
    ]
    if params.optional:
        chosen, params, figures = _choose_optional(
            chosen, fit, valid, params, figures, total, report
        )
    del fit, valid
    x = x[:, : len(params.feature_order)]
    valid_scores = predict(chosen.booster, x[valid_rows])
    booster = chosen.booster
    if params.refit:
        del fit_rows, fit_weights
        whole, whole_weights = sample_genuine(y, data.fit | data.valid, params.max_fit_rows, rng)
        booster = refit(
            chosen, Rows(x[whole], y[whole], whole_weights), params, report, (searched, total)
        )
    return _Model(booster, figures, valid_rows, valid_scores, chosen.booster, params.added_features)


def _columns(rows: Rows, inputs: int) -> Rows:
    """``rows`` with their first ``inputs`` columns."""
    return rows if rows.x.shape[1] == inputs else replace(rows, x=rows.x[:, :inputs])


def _best(figures: list[dict[str, float]]) -> int:
    """The index of the first figure with the highest validation average precision (the one
    ``select`` keeps)."""
    scores = [f["validation_average_precision"] for f in figures]
    return scores.index(max(scores))


def _choose_optional(
    chosen: Selection,
    fit: Rows,
    valid: Rows,
    params: TrainParams,
    figures: list[dict[str, float]],
    total: int,
    report: Progress,
) -> tuple[Selection, TrainParams, list[dict[str, float]]]:
    """The selected setting grown again with the optional features after the inputs, kept
    when its validation average precision beats the inputs' own by ``optional_gain``
    (relative). Returns the selection, the params with the version's added features and the
    figures with the grown one's appended; ``selected`` marks the kept one."""
    best = figures[_best(figures)]
    wide = replace(
        params,
        candidates=((int(best["num_leaves"]), int(best["min_child_samples"])),),
        added_features=params.added_features + params.optional,
    )
    offset = params.max_trees * len(params.candidates)

    def progress(step: str, done: int, _: int) -> None:
        report(step, min(offset + done, total), total)

    widened = select(fit, valid, wide, progress)
    grown = widened.figures[0]
    keep = grown["validation_average_precision"] >= best["validation_average_precision"] * (
        1.0 + params.optional_gain
    )
    if keep:
        best["selected"] = 0.0
    figures = [
        *figures,
        grown | {"optional_features": float(len(params.optional)), "selected": float(keep)},
    ]
    return (widened, wide, figures) if keep else (chosen, params, figures)


@dataclass(frozen=True)
class _Judgement:
    """The decision thresholds and the test period's scores and figures."""

    thresholds: repository.Thresholds
    scores: np.ndarray
    """The model's fraud probability of each test row."""
    fallback: np.ndarray
    """The rules fallback's score of each test row."""
    report: evaluate.Report
    metrics: dict[str, float]
    test_scores: pd.DataFrame


def _judge(
    model: _Model, data: _Dataset, params: TrainParams, source: DataSource | None
) -> _Judgement:
    """Thresholds from validation, then the model and the rules fallback on the test period."""
    x, y, test, tested = data.x, data.y, data.test, data.tested
    horizon = source.label_horizon if source is not None else None
    # The selected candidate's out-of-sample scores of the (sampled) validation rows: a
    # uniform sample of genuine ones has their quantiles. The refit grows the same setting to
    # the same number of trees on more rows, so its scores keep that scale: the test period's
    # false-positive rate at review stays near its target (docs/training.md).
    negatives = model.valid_scores[y[model.valid_rows] == 0]
    review = evaluate.threshold_at_fpr(negatives, params.review_fpr)
    decline = max(review, evaluate.threshold_at_fpr(negatives, params.decline_fpr))
    thresholds = repository.Thresholds(review=review, decline=decline)
    scores = predict(model.booster, x[test])
    days = tested["timestamp"].dt.floor("D").to_numpy()
    cards = tested["card_id"].to_numpy()
    scenarios = tested["fraud_scenario"].to_numpy() if "fraud_scenario" in tested else None
    judged = evaluate.evaluate(
        y[test], scores, review=review, decline=decline, days=days, cards=cards,
        k=params.card_precision_k, scenarios=scenarios,
    )  # fmt: skip
    # The rules fallback judged on the same rows, so degraded mode is comparable.
    rules = RulesEngine.load(DEFAULT_RULES, featurespec.MODEL_FEATURES)
    fallback = rules_scores(rules, x[test], data.order)
    rules_judged = evaluate.evaluate(
        y[test], fallback, review=rules.review, decline=rules.decline, days=days, cards=cards,
        k=params.card_precision_k, scenarios=scenarios,
    )  # fmt: skip
    counts = {
        "train_rows": int(data.fit.sum()),
        "train_frauds": int(y[data.fit].sum()),
        "validation_rows": int(data.valid.sum()),
        "validation_frauds": int(y[data.valid].sum()),
        "test_rows": int(test.sum()),
        "test_frauds": int(y[test].sum()),
    }
    evaluation = evaluate.Report(
        model=judged,
        rules=rules_judged,
        periods=period_strings(data.window),
        rows=counts,
        notes=_notes(data.window, data.first_seen, params, horizon, data.unlabelled)
        + list(source.notes if source is not None else ()),
        source=dict(source.counts) if source is not None else {},
    )
    metrics = evaluate.flat_metrics(
        evaluation,
        {
            "holdout_rows": float(counts["test_rows"]),
            "holdout_frauds": float(counts["test_frauds"]),
        }
        | (source.metrics() if source is not None else {}),
    )
    test_scores = pd.DataFrame(
        {
            "transaction_id": tested["transaction_id"].to_numpy(),
            "timestamp": tested["timestamp"].to_numpy(),
            "card_id": cards,
            "score": scores,
            "is_fraud": y[test].astype(bool),
        }
    )
    return _Judgement(thresholds, scores, fallback, evaluation, metrics, test_scores)


def _check_parity(onnx_path: Path, x: np.ndarray, expected: np.ndarray) -> float:
    """The largest ONNX Runtime ↔ LightGBM gap on the test rows; raises beyond the tolerance."""
    parity = parity_gap(onnx_path, x, expected)
    if not parity <= PARITY_TOLERANCE:
        raise ParityError(
            f"ONNX Runtime differs from LightGBM by up to {parity:.3g} on the test period "
            f"(tolerance {PARITY_TOLERANCE:g}); the model is not published"
        )
    return parity


def _gates(
    candidate: repository.ModelMetadata,
    onnx_path: Path,
    data: _Dataset,
    model_root: Path,
    policy: promotion_gates.GatePolicy | None,
    live: str | None,
) -> GateReport:
    """The promotion gates of the exported candidate against the live version, on the test rows."""
    # One copy of the test rows, its columns views into it: indexing by the mask for each
    # column would copy every row once per feature (2.8 GB at 2 M rows).
    test_x = data.x[data.test]
    holdout = {name: test_x[:, j] for j, name in enumerate(data.order)}
    return promotion_gates.evaluate(
        candidate, onnx_path, holdout, data.y[data.test], model_root, policy, live
    )


_VERSION_FILES = (
    repository.MODEL_FILE,
    repository.SMALL_MODEL_FILE,
    "metrics.json",
    "selection.json",
    "timings.json",
    "memory.json",
    "evaluation.json",
    "evaluation.md",
    "evaluation.png",
    "lightgbm.txt",
    reference.REFERENCE_FILE,
)
"""The files a published version holds."""


def _write_version_files(
    work: Path,
    model: _Model,
    judged: _Judgement,
    data: _Dataset,
    steps: _Steps,
    curves: dict[str, np.ndarray],
) -> None:
    """Writes beside the ONNX models what a version records of its training."""
    (work / "metrics.json").write_text(json.dumps(judged.metrics, indent=2, sort_keys=True))
    (work / "selection.json").write_text(json.dumps(model.selection, indent=2))
    # Steps up to here; publishing itself is not in it.
    (work / "timings.json").write_text(json.dumps(steps.seconds, indent=2))
    judged.report.write(work, data.y[data.test], judged.scores, judged.fallback, others=curves)
    model.booster.save_model(str(work / "lightgbm.txt"))
    steps.peak_mb["version files"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    (work / "memory.json").write_text(json.dumps(steps.peak_mb, indent=2))


def _promote_if_asked(
    lifecycle: ModelLifecycle,
    version: str,
    gates: GateReport,
    promote: bool,
    live: str | None,
) -> tuple[VersionState, list[str]]:
    """Promotes a published candidate when asked and its gates passed, or when no version
    is live (a store's first model: nothing else could answer)."""
    if live is None:
        lifecycle.promote(version, by="fraudmesh train (first version)")
        return VersionState.LIVE, [f"v{version} is live: no version was live before it"]
    if not promote:
        return VersionState.CANDIDATE, [
            f"v{version} is a candidate; v{live} stays live. Compare it in shadow or canary "
            f"(fraudmesh model shadow|canary {version}) or promote it "
            f"(fraudmesh model promote {version})"
        ]
    if not gates.passed:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in gates.failures())
        return VersionState.CANDIDATE, [f"v{version} not promoted, its gates failed: {failed}"]
    lifecycle.promote(version, by="fraudmesh train --promote")
    return VersionState.LIVE, [f"v{version} promoted: its gates passed against v{live}"]


def write_scores(scores: pd.DataFrame, path: Path) -> Path:
    """Writes test scores (``SCORE_COLUMNS``) as Parquet, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with filecommit.replacing(path) as tmp:
        scores.loc[:, list(SCORE_COLUMNS)].to_parquet(tmp, index=False)
    return path
