"""Training: Feast point-in-time features → LightGBM → test-period evaluation → ONNX → publish.

Each transaction is joined with the card, merchant and terminal feature rows as of
``timestamp − 1 µs`` (the state after their previous transactions, which is what the
online store holds when the transaction arrives), then ``featurespec.model_frame``
derives the request features exactly as the gateway will.

Periods (``Periods``; UTC, ``until`` exclusive): the model learns from the training window
and is judged on the test period, never seen before. Unless given, the training window
starts after the first ``warmup_days`` (their windows are not yet full) and the test period
is the latest ``holdout_fraction`` of the remaining days, the training window ending where
it starts. The last ``validation_fraction`` of the training window is the validation
period: every choice is made there, never on the test period. Each candidate setting
(leaves, minimum leaf size) grows trees until the validation average precision stops
improving; the best candidate at its best number of trees is the model, and the decision
thresholds come from the validation period's genuine transactions: *review* flags about
1% of them (the operating point of "recall at 1% FPR"), *decline* about 0.1%.

A transaction without a label (``is_fraud`` missing: a payment from the decision log that
is younger than the label delay and has no outcome yet, or whose outcome is a dispute)
stays in the data, so that it counts in the features of the payments after it, but is no
row of any period. When labels are complete only up to a time (``DataSource.label_horizon``),
the default periods end on that day.

The test period is then scored and judged with the field's metrics (``evaluate``), the
rules fallback beside the model. A version is published only if ONNX Runtime reproduces
LightGBM's fraud probability on the whole test period within ``PARITY_TOLERANCE``.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import lightgbm as lgb
import numpy as np
import onnxmltools
import onnxruntime as ort
import pandas as pd
import pyarrow.parquet as pq
from feast.errors import FeatureServiceNotFoundException
from onnxmltools.convert.common.data_types import FloatTensorType

from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain.aggregation import LABEL_DELAY
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.domain.rules_quality import rules_scores
from services.featurestore import admin, layout
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings
from services.models import gates as promotion_gates
from services.models import repository
from services.models.lifecycle import GateReport, ModelLifecycle, VersionState
from services.pipelines import evaluate

INPUT_NAME = "input"
"""Name of the ONNX model's float32 [batch, n_features] input."""
OUTPUT_NAME = "probabilities"
"""Name of the ONNX probability output (onnxmltools, zipmap=False): [batch, 2]."""
PARITY_TOLERANCE = 1e-5
"""Largest accepted |LightGBM − ONNX Runtime| fraud probability on the test period."""

Progress = Callable[[str, int, int], None]
"""Called with (step, done, total); a step starts at done=0 and ends at done=total."""


class ParityError(RuntimeError):
    """ONNX Runtime does not reproduce LightGBM closely enough to publish the model."""


class TrainingDataError(FailedPrecondition):
    """The data or the feature registry is missing or unusable; the message says what to run."""


@dataclass(frozen=True)
class TrainParams:
    """Knobs of a training run; recorded in the published metadata."""

    seed: int = 7
    max_trees: int = 1000
    """Most trees a candidate grows; early stopping usually ends it sooner."""
    early_stopping_rounds: int = 50
    """Trees without a better validation average precision before a candidate stops."""
    learning_rate: float = 0.05
    candidates: tuple[tuple[int, int], ...] = ((31, 40), (63, 20))
    """(num_leaves, min_child_samples) settings compared on the validation period."""
    warmup_days: int = 7
    holdout_fraction: float = 0.2
    validation_fraction: float = 0.15
    max_fit_rows: int = 250_000
    """Above this many training rows, genuine ones are sampled (every fraud kept) and
    weighted by the inverse of the sampling rate: the cost of a tree stops growing with the
    data while the model still sees the population's class balance."""
    max_validation_rows: int = 100_000
    """The same cap for the rows early stopping scores after every tree (thresholds use all)."""
    review_fpr: float = 0.01
    decline_fpr: float = 0.001
    card_precision_k: int = evaluate.CARD_PRECISION_K
    threads: int = 2

    def record(self) -> dict[str, str | int | float | bool]:
        """The params as metadata values (candidates as text)."""
        values = asdict(self)
        values["candidates"] = " ".join(f"{leaves}/{child}" for leaves, child in self.candidates)
        return values


@dataclass(frozen=True)
class Periods:
    """Explicit periods (UTC, ``until`` exclusive); a None bound takes the default."""

    train_from: datetime | None = None
    train_until: datetime | None = None
    test_from: datetime | None = None
    test_until: datetime | None = None


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
    report = progress or (lambda step, done, total: None)
    seconds: dict[str, float] = {}

    def timed(step: str, started: float) -> None:
        seconds[step] = round(time.perf_counter() - started, 3)

    started = time.perf_counter()
    report("features", 0, 1)
    frame = _training_frame(settings)
    report("features", 1, 1)
    timed("features", started)

    horizon = source.label_horizon if source is not None else None
    window = _window(frame["timestamp"], params, periods or Periods(), horizon)
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
    raw = featurespec.model_frame(frame)
    defaults = featurespec.population_defaults(raw, rows=fit | valid)
    x = featurespec.model_matrix(raw, defaults, np.float32)
    del raw
    y = frame["is_fraud"].fillna(False).to_numpy(dtype=np.int32)
    kept = ["transaction_id", "timestamp", "card_id"]
    kept += ["fraud_scenario"] if "fraud_scenario" in frame.columns else []
    tested = frame.loc[test, kept].reset_index(drop=True)
    del frame
    for name, rows in (("training", fit), ("validation", valid), ("test", test)):
        if not rows.any() or y[rows].sum() == 0 or y[rows].sum() == rows.sum():
            raise TrainingDataError(
                f"the {name} period ({_describe(window, name)}) needs both fraud and genuine "
                "transactions: choose other periods"
            )

    started = time.perf_counter()
    rng = np.random.default_rng(params.seed)
    fit_rows, fit_weights = _sample_genuine(y, fit, params.max_fit_rows, rng)
    valid_rows, valid_weights = _sample_genuine(y, valid, params.max_validation_rows, rng)
    booster, selection = _select(
        _Rows(x[fit_rows], y[fit_rows], fit_weights),
        _Rows(x[valid_rows], y[valid_rows], valid_weights),
        params,
        report,
    )
    timed("train", started)

    started = time.perf_counter()
    report("evaluate", 0, 1)
    # LightGBM scores the float32 rows the scorer will receive, widened exactly.
    # The (sampled) validation rows: a uniform sample of genuine ones has their quantiles.
    valid_scores = _predict(booster, x[valid_rows])
    negatives = valid_scores[y[valid_rows] == 0]
    review = evaluate.threshold_at_fpr(negatives, params.review_fpr)
    decline = max(review, evaluate.threshold_at_fpr(negatives, params.decline_fpr))
    thresholds = repository.Thresholds(review=review, decline=decline)
    scores = _predict(booster, x[test])
    days = tested["timestamp"].dt.floor("D").to_numpy()
    cards = tested["card_id"].to_numpy()
    scenarios = tested["fraud_scenario"].to_numpy() if "fraud_scenario" in tested else None
    judged = evaluate.evaluate(
        y[test], scores, review=review, decline=decline, days=days, cards=cards,
        k=params.card_precision_k, scenarios=scenarios,
    )  # fmt: skip
    # The rules fallback judged on the same rows, so degraded mode is comparable.
    rules = RulesEngine.load(DEFAULT_RULES, featurespec.MODEL_FEATURES)
    fallback = rules_scores(rules, x[test], featurespec.MODEL_FEATURES)
    rules_judged = evaluate.evaluate(
        y[test], fallback, review=rules.review, decline=rules.decline, days=days, cards=cards,
        k=params.card_precision_k, scenarios=scenarios,
    )  # fmt: skip
    counts = {
        "train_rows": int(fit.sum()),
        "train_frauds": int(y[fit].sum()),
        "validation_rows": int(valid.sum()),
        "validation_frauds": int(y[valid].sum()),
        "test_rows": int(test.sum()),
        "test_frauds": int(y[test].sum()),
    }
    evaluation = evaluate.Report(
        model=judged,
        rules=rules_judged,
        periods=_period_strings(window),
        rows=counts,
        notes=_notes(window, first_seen, params, horizon, unlabelled)
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
    report("evaluate", 1, 1)
    timed("evaluate", started)

    with tempfile.TemporaryDirectory(prefix="fraudmesh-train-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        report("export", 0, 1)
        onnx_path = work / repository.MODEL_FILE
        _export(booster, len(featurespec.MODEL_FEATURES), onnx_path)
        report("export", 1, 1)
        timed("export", started)

        started = time.perf_counter()
        report("parity", 0, 1)
        parity = _parity(onnx_path, x[test], scores)
        if not parity <= PARITY_TOLERANCE:
            raise ParityError(
                f"ONNX Runtime differs from LightGBM by up to {parity:.3g} on the test period "
                f"(tolerance {PARITY_TOLERANCE:g}); the model is not published"
            )
        report("parity", 1, 1)
        timed("parity", started)

        started = time.perf_counter()
        report("gates", 0, 1)
        lifecycle = ModelLifecycle(model_root)
        live = lifecycle.read().routing.live
        candidate = _metadata(
            thresholds, defaults, metrics, window, parity, params, created_at=datetime.now(UTC)
        )
        holdout = {name: x[test][:, j] for j, name in enumerate(featurespec.MODEL_FEATURES)}
        gate_report = promotion_gates.evaluate(
            candidate, onnx_path, holdout, y[test], model_root, gate_policy, live
        )
        report("gates", 1, 1)
        timed("gates", started)

        started = time.perf_counter()
        report("publish", 0, 1)
        (work / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        (work / "selection.json").write_text(json.dumps(selection, indent=2))
        # Steps up to here; publishing itself is not in it.
        (work / "timings.json").write_text(json.dumps(seconds, indent=2))
        evaluation.write(work, y[test], scores, fallback)
        booster.save_model(str(work / "lightgbm.txt"))
        names = (
            repository.MODEL_FILE,
            "metrics.json",
            "selection.json",
            "timings.json",
            "evaluation.json",
            "evaluation.md",
            "evaluation.png",
            "lightgbm.txt",
        )
        published, folder, _ = lifecycle.publish_candidate(
            candidate,
            {name: work / name for name in names},
            gate_report,
            by=source.published_by if source is not None else "fraudmesh train",
        )
        state, notes = _promote_if_asked(lifecycle, published.version, gate_report, promote, live)
        report("publish", 1, 1)
        timed("publish", started)
    return TrainResult(
        published,
        folder,
        seconds,
        evaluation,
        test_scores,
        selection,
        gates=gate_report,
        state=state,
        lifecycle_notes=notes,
    )


def _metadata(
    thresholds: repository.Thresholds,
    defaults: dict[str, float],
    metrics: dict[str, float],
    window: repository.TrainingWindow,
    parity: float,
    params: TrainParams,
    created_at: datetime,
) -> repository.ModelMetadata:
    return repository.ModelMetadata(
        version="0",  # publishing assigns the real one
        feature_order=list(featurespec.MODEL_FEATURES),
        input_name=INPUT_NAME,
        output_name=OUTPUT_NAME,
        thresholds=thresholds,
        default_features=defaults,
        metrics=metrics,
        training_window=window,
        parity_max_abs_diff=parity,
        created_at=created_at,
        lightgbm_version=lgb.__version__,
        onnxmltools_version=onnxmltools.__version__,
        onnxruntime_version=ort.__version__,
        params=params.record(),
    )


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
    tmp = path.with_name(f".{path.name}.tmp")
    scores.loc[:, list(SCORE_COLUMNS)].to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def _training_frame(settings: FeatureStoreSettings) -> pd.DataFrame:
    """Transactions with their point-in-time store features from Feast, in time order."""
    data_dir = settings.data_path
    if not layout.data_present(data_dir):
        raise TrainingDataError(
            f"no dataset in {data_dir}: run `fraudmesh features simulate` or `fraudmesh data import`"
        )
    available = pq.ParquetFile(data_dir / layout.TRANSACTIONS_FILE).schema_arrow.names
    tx = pd.read_parquet(
        data_dir / layout.TRANSACTIONS_FILE, columns=[c for c in _TX_COLUMNS if c in available]
    )
    # Time order, so that periods are contiguous and scores come out in time order.
    tx = tx.sort_values("timestamp", kind="stable").reset_index(drop=True)
    fs = admin.feature_store(settings)
    try:
        service = fs.get_feature_service(definitions.FEATURE_SERVICE)
    except FeatureServiceNotFoundException as error:
        raise TrainingDataError(
            f"feature service {definitions.FEATURE_SERVICE!r} is not registered: "
            "run `fraudmesh features apply`"
        ) from error
    entity_df = pd.DataFrame(
        {
            "card_id": tx["card_id"],
            "merchant_id": tx["merchant_id"],
            # Payments without a terminal find no terminal row: its features stay missing.
            "terminal_id": _terminal_ids(tx),
            # The state after the previous transactions, as the online store holds it.
            "event_timestamp": tx["timestamp"] - pd.Timedelta(microseconds=1),
        }
    )
    features = fs.get_historical_features(entity_df=entity_df, features=service).to_df()
    del entity_df
    if len(features) != len(tx):
        raise TrainingDataError(f"the offline store returned {len(features)} rows for {len(tx)}")
    # Every entity row comes back once, in input order (the offline store's contract). Raw
    # columns named like store features (the codes) give way to the store's values: those
    # are what serving reads.
    columns = {name: tx[name].array for name in tx.columns}
    columns |= {name: features[name].array for name in featurespec.STORE_FEATURES}
    columns["timestamp_s"] = tx["timestamp"].astype("datetime64[ns, UTC]").astype("int64") / 1e9
    columns["card_not_present"] = (tx["channel"] == featurespec.CARD_NOT_PRESENT).array
    return pd.DataFrame(columns, copy=False)


_TX_COLUMNS = (
    "transaction_id",
    "timestamp",
    "card_id",
    "merchant_id",
    "terminal_id",
    "amount_minor",
    "currency",
    "channel",
    "is_fraud",
    "fraud_scenario",
)
"""The transaction columns training reads."""


def _terminal_ids(tx: pd.DataFrame) -> pd.Series:
    """The terminal of each transaction, "" where none is named (no terminal row has that id)."""
    if "terminal_id" not in tx.columns:
        return pd.Series("", index=tx.index, dtype=object)
    return tx["terminal_id"].fillna("").astype(object)


def _utc(value: datetime) -> pd.Timestamp:
    stamp = pd.Timestamp(value)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _window(
    timestamps: pd.Series,
    params: TrainParams,
    periods: Periods,
    label_horizon: datetime | None = None,
) -> repository.TrainingWindow:
    """The training, validation and test periods: the explicit bounds, defaults elsewhere.
    By default the data ends with its last day, or with the label horizon's day when that
    comes first (after it the labels are incomplete)."""
    first = timestamps.min().floor("D")
    data_end = timestamps.max().floor("D") + pd.Timedelta(days=1)
    if label_horizon is not None:
        data_end = min(data_end, _utc(label_horizon).floor("D"))
    train_from = (
        _utc(periods.train_from)
        if periods.train_from
        else first + pd.Timedelta(days=params.warmup_days)
    )
    test_until = _utc(periods.test_until) if periods.test_until else data_end
    if periods.test_from:
        test_from = _utc(periods.test_from)
    elif periods.train_until:
        test_from = _utc(periods.train_until)
    else:
        days = (data_end - train_from).days
        holdout_days = max(1, round(days * params.holdout_fraction))
        if days - holdout_days < 2:
            raise TrainingDataError(
                f"{days} days after the warm-up are too few to train, validate and test"
            )
        test_from = data_end - pd.Timedelta(days=holdout_days)
    train_until = _utc(periods.train_until) if periods.train_until else test_from
    if not train_from < train_until <= test_from < test_until:
        raise TrainingDataError(
            f"periods out of order: training {train_from:%Y-%m-%d} → {train_until:%Y-%m-%d}, "
            f"test {test_from:%Y-%m-%d} → {test_until:%Y-%m-%d} (need train-from < "
            "train-until <= test-from < test-until)"
        )
    span = train_until - train_from
    validation = max(pd.Timedelta(days=1), (span * params.validation_fraction).ceil("D"))
    if validation >= span:
        raise TrainingDataError(
            f"the training window {train_from:%Y-%m-%d} → {train_until:%Y-%m-%d} is too short "
            "to carve a validation period from its end: give it at least two days"
        )
    return repository.TrainingWindow(
        start=train_from.to_pydatetime(),
        end=test_until.to_pydatetime(),
        holdout_start=test_from.to_pydatetime(),
        train_end=train_until.to_pydatetime(),
        validation_start=(train_until - validation).to_pydatetime(),
    )


def _period_strings(window: repository.TrainingWindow) -> dict[str, list[str]]:
    assert window.train_end is not None and window.validation_start is not None
    bounds = {
        "train": (window.start, window.validation_start),
        "validation": (window.validation_start, window.train_end),
        "test": (window.holdout_start, window.end),
    }
    return {name: [a.isoformat(), b.isoformat()] for name, (a, b) in bounds.items()}


def _describe(window: repository.TrainingWindow, name: str) -> str:
    period = {"training": "train", "validation": "validation", "test": "test"}[name]
    start, end = _period_strings(window)[period]
    return f"{start[:10]} → {end[:10]}"


def _notes(
    window: repository.TrainingWindow,
    first: pd.Timestamp,
    params: TrainParams,
    label_horizon: datetime | None = None,
    unlabelled: dict[str, int] | None = None,
) -> list[str]:
    """Caveats about the periods, for the report."""
    notes = []
    if label_horizon is not None and window.end > label_horizon:
        notes.append(
            f"The test period ends after the label horizon ({label_horizon:%Y-%m-%d %H:%M} "
            "UTC): after it only payments with a reported outcome are labelled, mostly frauds, "
            "so the test figures overstate fraud. Leave --test-until out to end at the horizon."
        )
    for period, count in (unlabelled or {}).items():
        if count:
            notes.append(
                f"{count:,} payment(s) in the {period} window have no label yet (younger than "
                "the label delay without an outcome, or disputed): they count in the features "
                "of later payments, not as rows."
            )
    assert window.train_end is not None
    gap = window.holdout_start - window.train_end
    if gap < LABEL_DELAY:
        notes.append(
            f"The training window ends {gap.days} day(s) before the test period, less than the "
            f"label delay ({LABEL_DELAY.days} days): in production the labels of the last "
            f"{LABEL_DELAY.days} days are not known when a model is trained, so these test "
            "figures may be slightly optimistic. Leave a gap (--train-until) to measure that."
        )
    history = window.start - first.to_pydatetime()
    if history < timedelta(days=params.warmup_days):
        notes.append(
            f"Training starts {history / timedelta(days=1):.1f} day(s) after the first "
            "transaction: the windows of its first rows (up to 30 days) hold little history."
        )
    return notes


@dataclass(frozen=True)
class _Rows:
    """Model inputs, labels and sample weights of one period."""

    x: np.ndarray
    y: np.ndarray
    weight: np.ndarray


def _sample_genuine(
    y: np.ndarray, rows: np.ndarray, cap: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``rows`` (a mask) with at most ``cap`` of them: every fraud, a uniform sample
    of the genuine ones; and weights (1 for frauds, 1 / sampling rate for genuine rows)."""
    index = np.flatnonzero(rows)
    weights = np.ones(len(index), dtype=np.float64)
    if len(index) <= cap:
        return index, weights
    fraud = y[index] == 1
    genuine = index[~fraud]
    keep = max(cap - int(fraud.sum()), min(len(genuine), cap // 2))
    kept = np.sort(rng.choice(genuine, size=keep, replace=False))
    index = np.sort(np.concatenate([index[fraud], kept]))
    weights = np.where(y[index] == 1, 1.0, len(genuine) / keep)
    return index, weights


def _select(
    fit: _Rows, valid: _Rows, params: TrainParams, report: Progress
) -> tuple[lgb.Booster, list[dict[str, float]]]:
    """Grows each candidate with early stopping on the validation period; the best one, cut
    to its best number of trees, and every candidate's figures."""
    # The class balance of the population the (weighted) rows stand for.
    positives = max(float(fit.weight[fit.y == 1].sum()), 1.0)
    negatives = float(fit.weight[fit.y == 0].sum())
    total = params.max_trees * len(params.candidates)
    done = 0
    report("train", 0, total)
    best: tuple[float, lgb.Booster] | None = None
    selection: list[dict[str, float]] = []
    names = list(featurespec.MODEL_FEATURES)
    for leaves, min_child in params.candidates:
        lgb_params = {
            "objective": "binary",
            "metric": "average_precision",
            "learning_rate": params.learning_rate,
            "num_leaves": leaves,
            "min_child_samples": min_child,
            "feature_fraction": 0.9,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "lambda_l2": 1.0,
            # Up-weight the ~1% fraud class, by the square root of the imbalance: enough to
            # learn its patterns, not so much that every odd genuine payment looks like fraud.
            "scale_pos_weight": math.sqrt(negatives / positives),
            "seed": params.seed,
            "deterministic": True,
            "force_col_wise": True,
            "num_threads": params.threads,
            "verbose": -1,
        }
        fit_set = lgb.Dataset(fit.x, label=fit.y, weight=fit.weight, feature_name=names)
        valid_set = lgb.Dataset(
            valid.x, label=valid.y, weight=valid.weight, feature_name=names, reference=fit_set
        )
        offset = done

        def on_iteration(env: lgb.callback.CallbackEnv, offset: int = offset) -> None:
            report("train", offset + env.iteration + 1, total)

        booster = lgb.train(
            lgb_params,
            fit_set,
            num_boost_round=params.max_trees,
            valid_sets=[valid_set],
            valid_names=["validation"],
            callbacks=[
                lgb.early_stopping(params.early_stopping_rounds, verbose=False),
                on_iteration,
            ],
        )
        done += params.max_trees
        report("train", done, total)
        score = float(booster.best_score["validation"]["average_precision"])
        trees = int(booster.best_iteration) or booster.current_iteration()
        selection.append(
            {
                "num_leaves": leaves,
                "min_child_samples": min_child,
                "trees": trees,
                "validation_average_precision": score,
                "fit_rows": len(fit.y),
                "validation_rows": len(valid.y),
            }
        )
        if best is None or score > best[0]:
            cut = booster.model_to_string(num_iteration=trees)
            best = (score, lgb.Booster(model_str=cut))
    assert best is not None
    return _float32_thresholds(best[1]), selection


def _predict(booster: lgb.Booster, x: np.ndarray) -> np.ndarray:
    """Fraud probabilities of float32 rows, widened exactly (as the scorer receives them)."""
    return np.asarray(booster.predict(x.astype(np.float64)), dtype=np.float64)


_THRESHOLD_LINE = re.compile(r"^threshold=(.*)$", re.MULTILINE)
# Byte offsets of the trees in the model text; stale once thresholds are rewritten, and
# optional: without them LightGBM parses the trees one after another.
_TREE_SIZES_LINE = re.compile(r"^tree_sizes=.*\n", re.MULTILINE)


def _float32_thresholds(booster: lgb.Booster) -> lgb.Booster:
    """The same model with each split threshold t replaced by the largest float32 <= t.

    The scorer's inputs are float32, and for a float32 x, ``x <= t`` holds exactly when
    ``x <= that float32`` does: the model's decisions on such inputs do not change. ONNX
    stores thresholds as float32, rounded to nearest, which flips the decision for the x
    just above t; with float32 thresholds there is nothing left to round.
    """

    def round_down(match: re.Match[str]) -> str:
        exact = np.array(match.group(1).split(), dtype=np.float64)
        nearest = exact.astype(np.float32)
        down = np.where(nearest.astype(np.float64) > exact, np.nextafter(nearest, -np.inf), nearest)
        return "threshold=" + " ".join(repr(float(v)) for v in down)

    text = _THRESHOLD_LINE.sub(round_down, booster.model_to_string())
    return lgb.Booster(model_str=_TREE_SIZES_LINE.sub("", text))


def _export(booster: lgb.Booster, n_features: int, path: Path) -> None:
    model = onnxmltools.convert_lightgbm(
        booster,
        name=repository.DEFAULT_MODEL_NAME,
        initial_types=[(INPUT_NAME, FloatTensorType([None, n_features]))],
        zipmap=False,
    )
    outputs = [o.name for o in model.graph.output]
    if OUTPUT_NAME not in outputs:
        raise ParityError(f"ONNX export has outputs {outputs}, expected {OUTPUT_NAME!r}")
    path.write_bytes(model.SerializeToString())


def _parity(onnx_path: Path, x: np.ndarray, expected: np.ndarray) -> float:
    """Largest |ONNX Runtime − LightGBM| fraud probability over the rows of ``x``."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    proba = session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    return float(np.max(np.abs(proba[:, 1].astype(np.float64) - expected)))
