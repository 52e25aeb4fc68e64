"""Training: Feast point-in-time features → LightGBM → holdout evaluation → ONNX → publish.

Each transaction is joined with the card and merchant feature rows as of
``timestamp − 1 µs`` (the state after their previous transactions, which is what the
online store holds when the transaction arrives), then ``featurespec.model_frame``
derives the request features exactly as the gateway will. The first ``warmup_days`` are
left out (their 7-day windows are not yet full); the latest ``holdout_fraction`` of the
remaining days is the holdout, never seen in training.

Decision thresholds come from the holdout's genuine transactions: *review* flags about
1% of them (the operating point of "recall at 1% FPR"), *decline* about 0.1%, a point
where precision is high. A version is published only if ONNX Runtime reproduces
LightGBM's fraud probability on the whole holdout within ``PARITY_TOLERANCE``.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import lightgbm as lgb
import numpy as np
import onnxmltools
import onnxruntime as ort
import pandas as pd
from feast.errors import FeatureServiceNotFoundException
from onnxmltools.convert.common.data_types import FloatTensorType
from sklearn.metrics import (
    average_precision_score,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.domain.rules_quality import rules_metrics
from services.featurestore import admin, layout
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings
from services.models import repository

INPUT_NAME = "input"
"""Name of the ONNX model's float32 [batch, n_features] input."""
OUTPUT_NAME = "probabilities"
"""Name of the ONNX probability output (onnxmltools, zipmap=False): [batch, 2]."""
PARITY_TOLERANCE = 1e-5
"""Largest accepted |LightGBM − ONNX Runtime| fraud probability on the holdout."""

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
    num_trees: int = 300
    learning_rate: float = 0.05
    num_leaves: int = 31
    min_child_samples: int = 40
    warmup_days: int = 7
    holdout_fraction: float = 0.2
    review_fpr: float = 0.01
    decline_fpr: float = 0.001
    threads: int = 2


@dataclass(frozen=True)
class TrainResult:
    """The published version and how long each step took."""

    metadata: repository.ModelMetadata
    folder: Path
    seconds: dict[str, float]


def train(
    settings: FeatureStoreSettings,
    model_root: Path,
    params: TrainParams | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Trains, evaluates, exports, checks parity and publishes a new version."""
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

    window = _window(frame["timestamp"], params)
    in_window = frame["timestamp"] >= window.start
    frame = frame[in_window].reset_index(drop=True)
    holdout = (frame["timestamp"] >= window.holdout_start).to_numpy()
    raw = featurespec.model_frame(frame)
    defaults = featurespec.population_defaults(raw[~holdout])
    x = featurespec.model_frame(frame, defaults).to_numpy(dtype=np.float32)
    y = frame["is_fraud"].to_numpy(dtype=np.int32)
    if y[~holdout].sum() == 0 or y[holdout].sum() == 0:
        raise TrainingDataError("both the training and the holdout period need fraud cases")

    started = time.perf_counter()
    booster = _fit(x[~holdout], y[~holdout], params, report)
    timed("train", started)

    started = time.perf_counter()
    report("evaluate", 0, 1)
    # LightGBM scores the float32 rows the scorer will receive, widened exactly.
    scores = np.asarray(booster.predict(x[holdout].astype(np.float64)), dtype=np.float64)
    metrics, thresholds = _evaluate(
        y[holdout], scores, frame.loc[holdout, "fraud_scenario"], params
    )
    # The rules fallback judged on the same holdout rows, so degraded mode is comparable.
    rules = RulesEngine.load(DEFAULT_RULES, featurespec.MODEL_FEATURES)
    metrics |= rules_metrics(rules, x[holdout], featurespec.MODEL_FEATURES, y[holdout])
    metrics["train_rows"] = float((~holdout).sum())
    metrics["train_frauds"] = float(y[~holdout].sum())
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
        parity = _parity(onnx_path, x[holdout], scores)
        if not parity <= PARITY_TOLERANCE:
            raise ParityError(
                f"ONNX Runtime differs from LightGBM by up to {parity:.3g} on the holdout "
                f"(tolerance {PARITY_TOLERANCE:g}); the model is not published"
            )
        report("parity", 1, 1)
        timed("parity", started)

        started = time.perf_counter()
        report("publish", 0, 1)
        (work / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        _plot_curves(y[holdout], scores, thresholds, work / "curves.png")
        booster.save_model(str(work / "lightgbm.txt"))
        metadata = repository.ModelMetadata(
            version="0",  # publish() assigns the real one
            feature_order=list(featurespec.MODEL_FEATURES),
            input_name=INPUT_NAME,
            output_name=OUTPUT_NAME,
            thresholds=thresholds,
            default_features=defaults,
            metrics=metrics,
            training_window=window,
            parity_max_abs_diff=parity,
            created_at=datetime.now(UTC),
            lightgbm_version=lgb.__version__,
            onnxmltools_version=onnxmltools.__version__,
            onnxruntime_version=ort.__version__,
            params=asdict(params),
        )
        files = {
            name: work / name
            for name in (repository.MODEL_FILE, "metrics.json", "curves.png", "lightgbm.txt")
        }
        folder = repository.publish(model_root, metadata, files)
        published, _ = repository.load(model_root, metadata.name, folder.name)
        report("publish", 1, 1)
        timed("publish", started)
    return TrainResult(published, folder, seconds)


def _training_frame(settings: FeatureStoreSettings) -> pd.DataFrame:
    """Transactions with their point-in-time store features from Feast, in time order."""
    data_dir = settings.data_path
    if not layout.data_present(data_dir):
        raise TrainingDataError(f"no dataset in {data_dir}: run `fraudmesh features simulate`")
    tx = pd.read_parquet(data_dir / layout.TRANSACTIONS_FILE)
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
            "transaction_id": tx["transaction_id"],
            "card_id": tx["card_id"],
            "merchant_id": tx["merchant_id"],
            # Payments without a terminal find no terminal row: its features stay missing.
            "terminal_id": _terminal_ids(tx),
            # The state after the previous transactions, as the online store holds it.
            "event_timestamp": tx["timestamp"] - pd.Timedelta(microseconds=1),
        }
    )
    features = fs.get_historical_features(entity_df=entity_df, features=service).to_df()
    features = features.set_index("transaction_id")[list(featurespec.STORE_FEATURES)]
    # Raw columns named like store features (the codes) give way to the store's values:
    # those are what serving reads.
    tx = tx.drop(columns=[c for c in featurespec.STORE_FEATURES if c in tx.columns])
    frame = tx.join(features, on="transaction_id")
    frame["timestamp_s"] = frame["timestamp"].astype("datetime64[ns, UTC]").astype("int64") / 1e9
    frame["card_not_present"] = frame["channel"] == featurespec.CARD_NOT_PRESENT
    return frame.sort_values("timestamp", kind="stable").reset_index(drop=True)


def _terminal_ids(tx: pd.DataFrame) -> pd.Series:
    """The terminal of each transaction, "" where none is named (no terminal row has that id)."""
    if "terminal_id" not in tx.columns:
        return pd.Series("", index=tx.index, dtype=object)
    return tx["terminal_id"].fillna("").astype(object)


def _window(timestamps: pd.Series, params: TrainParams) -> repository.TrainingWindow:
    """Whole UTC days: warm-up left out, the latest share of days held out."""
    first = timestamps.min().floor("D")
    end = timestamps.max().floor("D") + pd.Timedelta(days=1)
    start = first + pd.Timedelta(days=params.warmup_days)
    days = (end - start).days
    holdout_days = max(1, round(days * params.holdout_fraction))
    if days - holdout_days < 1:
        raise TrainingDataError(f"{days} days after the warm-up are too few to train and hold out")
    return repository.TrainingWindow(
        start=start.to_pydatetime(),
        end=end.to_pydatetime(),
        holdout_start=(end - pd.Timedelta(days=holdout_days)).to_pydatetime(),
    )


def _fit(x: np.ndarray, y: np.ndarray, params: TrainParams, report: Progress) -> lgb.Booster:
    positives = max(int(y.sum()), 1)
    negatives = len(y) - positives
    lgb_params = {
        "objective": "binary",
        "learning_rate": params.learning_rate,
        "num_leaves": params.num_leaves,
        "min_child_samples": params.min_child_samples,
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
    dataset = lgb.Dataset(x, label=y, feature_name=list(featurespec.MODEL_FEATURES))

    def on_iteration(env: lgb.callback.CallbackEnv) -> None:
        report("train", env.iteration + 1, params.num_trees)

    report("train", 0, params.num_trees)
    booster = lgb.train(
        lgb_params, dataset, num_boost_round=params.num_trees, callbacks=[on_iteration]
    )
    return _float32_thresholds(booster)


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


def _threshold_at_fpr(negative_scores: np.ndarray, fpr: float) -> float:
    """Lowest threshold flagging (score >= threshold) at most ``fpr`` of the negatives."""
    ranked = np.sort(negative_scores)[::-1]
    allowed = math.floor(fpr * len(ranked))
    if allowed >= len(ranked):
        return 0.0
    # Just above the first negative that must not be flagged.
    return float(np.nextafter(ranked[allowed], np.inf))


def _evaluate(
    y: np.ndarray, scores: np.ndarray, scenarios: pd.Series, params: TrainParams
) -> tuple[dict[str, float], repository.Thresholds]:
    """Holdout metrics and the review/decline thresholds."""
    negatives = scores[y == 0]
    review = _threshold_at_fpr(negatives, params.review_fpr)
    decline = max(review, _threshold_at_fpr(negatives, params.decline_fpr))
    metrics: dict[str, float] = {
        "pr_auc": float(average_precision_score(y, scores)),
        "roc_auc": float(roc_auc_score(y, scores)),
        "holdout_rows": float(len(y)),
        "holdout_frauds": float(y.sum()),
    }
    for label, threshold in (("review", review), ("decline", decline)):
        flagged = scores >= threshold
        true_positive = int((flagged & (y == 1)).sum())
        metrics[f"recall_at_{label}"] = true_positive / max(int(y.sum()), 1)
        metrics[f"precision_at_{label}"] = true_positive / max(int(flagged.sum()), 1)
        metrics[f"fpr_at_{label}"] = float(flagged[y == 0].mean())
    # The review threshold is the 1% FPR operating point (with the default review_fpr).
    fpr_label = f"{params.review_fpr:.0%}".replace("%", "pct")
    metrics[f"recall_at_{fpr_label}_fpr"] = metrics["recall_at_review"]
    metrics[f"precision_at_{fpr_label}_fpr"] = metrics["precision_at_review"]
    # Recall per fraud pattern, where the data names the pattern of each fraud case.
    scenario_values = scenarios.to_numpy()
    for scenario in sorted(set(scenario_values[y == 1].tolist())):
        cases = scenario_values == scenario
        metrics[f"recall_at_review/{scenario}"] = float((scores[cases] >= review).mean())
    return metrics, repository.Thresholds(review=review, decline=decline)


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


def _plot_curves(
    y: np.ndarray, scores: np.ndarray, thresholds: repository.Thresholds, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    precision, recall, _ = precision_recall_curve(y, scores)
    fpr, tpr, _ = roc_curve(y, scores)
    fig, (ax_pr, ax_roc) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax_pr.plot(recall, precision)
    ax_pr.set(xlabel="recall", ylabel="precision", title="Precision-recall (holdout)")
    ax_pr.set_xlim(0, 1)
    ax_pr.set_ylim(0, 1.02)
    ax_roc.plot(fpr, tpr)
    ax_roc.set_xscale("log")
    ax_roc.set(xlabel="false-positive rate (log)", ylabel="recall", title="ROC (holdout)")
    ax_roc.set_xlim(1e-4, 1)
    for label, threshold, color in (
        ("review", thresholds.review, "tab:orange"),
        ("decline", thresholds.decline, "tab:red"),
    ):
        flagged = scores >= threshold
        point_recall = flagged[y == 1].mean()
        point_fpr = flagged[y == 0].mean()
        point_precision = (flagged & (y == 1)).sum() / max(int(flagged.sum()), 1)
        name = f"{label} ≥ {threshold:.3f}"
        ax_roc.scatter(point_fpr, point_recall, color=color, zorder=3, label=name)
        ax_pr.scatter(point_recall, point_precision, color=color, zorder=3, label=name)
    ax_pr.legend(loc="lower left")
    ax_roc.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
