"""The small model: a few shallow trees beside the full model, for the gateway's cascade and
its first fallback.

Two candidates are grown on the training period with early stopping on the validation
period: one *distilled* from the full model (every training row twice, as a fraud weighted by
the full model's probability and as genuine weighted by its complement: cross-entropy on the
full model's scores, which LightGBM's binary objective then exports like any classifier) and
one trained on the labels. The one with the higher validation average precision is kept. It
takes the version's inputs in the version's order (``TrainParams.feature_order``): the gateway
sends it the same vector as the full model.

Its thresholds come from the validation period too: the *clear-approve* threshold is the
highest score below which the cascade's share of lost review frauds stays under
``max_fraud_loss`` out of sample with probability ``loss_confidence`` (a bound on the
validation count, ``allowed_losses``; never above the full model's review threshold, so a
first-stage approval's score reads as an approval under the version's thresholds), and its own
review and
decline thresholds flag the same shares of genuine payments as the full model's. The test
period then judges it alone and the cascade (docs/cascade.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

import lightgbm as lgb
import numpy as np
import pandas as pd

from services.domain import metrics as field_metrics
from services.models import repository
from services.pipelines import evaluate
from services.pipelines.training.export import (
    PARITY_TOLERANCE,
    ParityError,
    export_onnx,
    parity_gap,
)
from services.pipelines.training.params import TrainParams
from services.pipelines.training.selection import (
    Rows,
    float32_thresholds,
    predict,
    sample_genuine,
)

Kind = Literal["distilled", "labels"]

__all__ = [
    "Dataset",
    "Kind",
    "SmallModelParams",
    "SmallModelStep",
    "allowed_losses",
    "build",
    "clear_approve_threshold",
]


@dataclass(frozen=True)
class SmallModelParams:
    """The small model's shape and the cascade's loss budget."""

    max_trees: int = 100
    """Most trees; early stopping on validation usually ends it sooner."""
    num_leaves: int = 7
    max_depth: int = 3
    learning_rate: float = 0.1
    early_stopping_rounds: int = 30
    max_fraud_loss: float = 0.005
    """Share of the frauds the full model flags at review that the cascade may approve."""
    loss_confidence: float = 0.9
    """Probability that a threshold chosen on validation keeps the loss under
    ``max_fraud_loss`` on fresh payments (see ``allowed_losses``)."""


class Dataset(Protocol):
    """What the step reads of a training run's dataset: inputs, labels, period masks."""

    @property
    def x(self) -> np.ndarray:
        """Model inputs of every transaction (float32)."""
        ...

    @property
    def y(self) -> np.ndarray:
        """Labels (1 = fraud)."""
        ...

    @property
    def fit(self) -> np.ndarray:
        """Mask of the training rows."""
        ...

    @property
    def valid(self) -> np.ndarray:
        """Mask of the validation rows."""
        ...

    @property
    def test(self) -> np.ndarray:
        """Mask of the test rows."""
        ...

    @property
    def tested(self) -> pd.DataFrame:
        """Time, card (and scenario, when known) of each test row."""
        ...


@dataclass(frozen=True)
class SmallModelStep:
    """The kept small model, its thresholds and how it and the cascade did on the test period."""

    booster: lgb.Booster
    kind: Kind
    params: SmallModelParams
    clear_approve: float
    thresholds: repository.Thresholds
    candidates: list[dict[str, str | float]]
    """Each candidate's kind, trees and validation figures."""
    scores: np.ndarray
    """Its fraud probability of each test row."""
    cascade_scores: np.ndarray
    """What the cascade answers for each test row: its score below the clear-approve
    threshold, the full model's otherwise."""
    alone: evaluate.Evaluation
    cascade: evaluate.Evaluation
    summary: dict[str, float] = field(default_factory=dict)
    """First-stage shares (validation, test) and the full model's review frauds it lost."""

    def report(self, report: evaluate.Report) -> evaluate.Report:
        """``report`` with the cascade and the small model alone beside the model and rules."""
        return replace(
            report, cascade=self.cascade, small_model=self.alone, cascade_summary=self.summary
        )

    def metrics(self) -> dict[str, float]:
        """Its figures for the version's metrics: ``cascade_…``, ``small_…`` and the summary."""
        return self.cascade.flat("cascade_") | self.alone.flat("small_") | dict(self.summary)

    def curves(self) -> dict[str, np.ndarray]:
        """Test scores by name, for the report's plot."""
        return {"cascade": self.cascade_scores, "small model": self.scores}

    def export(self, path: Path, x_test: np.ndarray) -> float:
        """Writes it as ONNX to ``path``; returns the parity gap on the test rows, raising
        ParityError beyond the tolerance."""
        export_onnx(self.booster, x_test.shape[1], path)
        gap = parity_gap(path, x_test, self.scores)
        if not gap <= PARITY_TOLERANCE:
            raise ParityError(
                f"the small model's ONNX Runtime output differs from LightGBM by up to "
                f"{gap:.3g} on the test period (tolerance {PARITY_TOLERANCE:g}); the version "
                "is not published"
            )
        return gap

    def metadata(self, parity: float) -> repository.SmallModel:
        """Its entry in the version's metadata."""
        return repository.SmallModel(
            kind=self.kind,
            trees=self.booster.num_trees(),
            num_leaves=self.params.num_leaves,
            max_depth=self.params.max_depth,
            clear_approve=self.clear_approve,
            max_fraud_loss=self.params.max_fraud_loss,
            loss_confidence=self.params.loss_confidence,
            thresholds=self.thresholds,
            parity_max_abs_diff=parity,
            candidates=self.candidates,
        )


def allowed_losses(flagged: int, max_loss: float, confidence: float) -> int:
    """How many of ``flagged`` validation frauds the threshold may fall above.

    With the threshold at the (k+1)-th lowest small-model score of the ``flagged`` frauds the
    full model catches, the share of fresh caught frauds it loses is the (k+1)-th order
    statistic of ``flagged`` uniforms, Beta(k+1, flagged-k), whatever the scores'
    distribution: P(loss <= max_loss) = P(Binomial(flagged, max_loss) >= k+1). The largest k
    with that probability at least ``confidence``; 0 (lose none of validation's) when even
    k = 0 falls short, as it does below ln(1-confidence)/ln(1-max_loss) flagged frauds (460
    at 0.5 % and 90 %). Taking k = floor(max_loss * flagged), the budget's own count, loses
    (k+1)/(flagged+1) on average, more than the budget: the bound exists for that.
    """
    if flagged <= 0 or max_loss <= 0.0:
        return 0
    if max_loss >= 1.0:
        return flagged - 1
    log_p, log_q = math.log(max_loss), math.log1p(-max_loss)
    at_most = 0.0  # P(Binomial(flagged, max_loss) <= k), summed up k by k
    best = 0
    for k in range(flagged):
        at_most += math.exp(
            math.lgamma(flagged + 1)
            - math.lgamma(k + 1)
            - math.lgamma(flagged - k + 1)
            + k * log_p
            + (flagged - k) * log_q
        )
        if 1.0 - at_most < confidence:
            break
        best = k
    return best


def clear_approve_threshold(
    small: np.ndarray,
    full: np.ndarray,
    y: np.ndarray,
    review: float,
    max_loss: float,
    confidence: float = 0.9,
) -> float:
    """The highest threshold t (at most ``review``) such that, among the frauds the full model
    flags (``full >= review``), at most ``allowed_losses`` of them have a small-model score
    below t: the cascade then loses at most ``max_loss`` of the full model's review frauds on
    fresh payments with probability ``confidence``. 0.0 when the full model flags no fraud
    (nothing is approved at the first stage)."""
    caught = np.sort(small[(y == 1) & (full >= review)])
    if caught.size == 0:
        return 0.0
    allowed = allowed_losses(int(caught.size), max_loss, confidence)
    # Scores below caught[allowed] are those of at most ``allowed`` caught frauds.
    return float(min(caught[allowed], review))


def build(
    teacher: lgb.Booster,
    data: Dataset,
    full_thresholds: repository.Thresholds,
    full_test_scores: np.ndarray,
    params: TrainParams,
    small: SmallModelParams | None = None,
) -> SmallModelStep:
    """Grows both candidates, keeps the better one on validation, chooses its thresholds on
    validation and judges it and the cascade on the test period."""
    small = small or SmallModelParams()
    x, y = data.x, data.y
    rng = np.random.default_rng(params.seed)
    fit_rows, fit_weights = sample_genuine(y, data.fit, params.max_fit_rows, rng)
    fit = Rows(x[fit_rows], y[fit_rows], fit_weights)
    valid_rows = np.flatnonzero(data.valid)
    valid = Rows(x[valid_rows], y[valid_rows], np.ones(len(valid_rows)))
    soft = predict(teacher, fit.x)
    grown: list[tuple[Kind, lgb.Booster, float]] = []
    for kind in ("distilled", "labels"):
        booster = _grow(kind, fit, soft, valid, params, small)
        score = field_metrics.average_precision(valid.y, predict(booster, valid.x))
        grown.append((kind, booster, score))
    kind, booster, _ = max(grown, key=lambda g: g[2])

    review, decline = full_thresholds.review, full_thresholds.decline
    full_valid = predict(teacher, valid.x)
    candidates = _candidates(grown, kind, valid, full_valid, review, params, small)
    small_valid = predict(booster, valid.x)
    clear = clear_approve_threshold(
        small_valid, full_valid, valid.y, review, small.max_fraud_loss, small.loss_confidence
    )
    thresholds = own_thresholds(small_valid[valid.y == 0], params)

    test_x, test_y = x[data.test], y[data.test]
    scores = predict(booster, test_x)
    first = scores < clear
    cascade_scores = np.where(first, scores, full_test_scores)
    tested = data.tested
    judge = {
        "days": tested["timestamp"].dt.floor("D").to_numpy(),
        "cards": tested["card_id"].to_numpy(),
        "k": params.card_precision_k,
        "scenarios": (tested["fraud_scenario"].to_numpy() if "fraud_scenario" in tested else None),
    }
    alone = evaluate.evaluate(
        test_y, scores, review=thresholds.review, decline=thresholds.decline, **judge
    )
    cascade = evaluate.evaluate(test_y, cascade_scores, review=review, decline=decline, **judge)
    flagged_frauds = (test_y == 1) & (full_test_scores >= review)
    summary = {
        "cascade_clear_approve": clear,
        "cascade_first_stage_share": float(first.mean()),
        "cascade_validation_first_stage_share": float((small_valid < clear).mean()),
        "cascade_review_frauds_lost": float((flagged_frauds & first).sum()),
        "cascade_review_frauds": float(flagged_frauds.sum()),
    }
    return SmallModelStep(
        booster=booster,
        kind=kind,
        params=small,
        clear_approve=clear,
        thresholds=thresholds,
        candidates=candidates,
        scores=scores,
        cascade_scores=cascade_scores,
        alone=alone,
        cascade=cascade,
        summary=summary,
    )


def _candidates(
    grown: list[tuple[Kind, lgb.Booster, float]],
    kept: Kind,
    valid: Rows,
    full_valid: np.ndarray,
    review: float,
    params: TrainParams,
    small: SmallModelParams,
) -> list[dict[str, str | float]]:
    """Each candidate's kind, trees and validation figures, for the version's metadata."""
    candidates: list[dict[str, str | float]] = []
    for name, candidate, ap in grown:
        scores = predict(candidate, valid.x)
        clear = clear_approve_threshold(
            scores, full_valid, valid.y, review, small.max_fraud_loss, small.loss_confidence
        )
        own = own_thresholds(scores[valid.y == 0], params)
        candidates.append(
            {
                "kind": name,
                "trees": float(candidate.num_trees()),
                "validation_average_precision": ap,
                "validation_recall_at_review": field_metrics.operating_point(
                    valid.y, scores, own.review
                ).recall,
                "validation_first_stage_share": float((scores < clear).mean()),
                "kept": float(name == kept),
            }
        )
    return candidates


def own_thresholds(genuine_scores: np.ndarray, params: TrainParams) -> repository.Thresholds:
    """Review and decline thresholds flagging the full model's shares of genuine payments."""
    review = field_metrics.threshold_at_fpr(genuine_scores, params.review_fpr)
    decline = max(review, field_metrics.threshold_at_fpr(genuine_scores, params.decline_fpr))
    return repository.Thresholds(review=review, decline=decline)


def _grow(
    kind: Kind,
    fit: Rows,
    soft: np.ndarray,
    valid: Rows,
    params: TrainParams,
    small: SmallModelParams,
) -> lgb.Booster:
    """One candidate, grown with early stopping on the validation labels' average precision."""
    names = list(params.feature_order)
    lgb_params: dict[str, object] = {
        "objective": "binary",
        "metric": "average_precision",
        "learning_rate": small.learning_rate,
        "num_leaves": small.num_leaves,
        "max_depth": small.max_depth,
        "min_child_samples": 20,
        "lambda_l2": 1.0,
        "seed": params.seed,
        "deterministic": True,
        "force_col_wise": True,
        "num_threads": params.threads,
        "verbose": -1,
    }
    if kind == "distilled":
        # Soft targets as two weighted rows each: the binary objective's loss on them is the
        # cross-entropy against the full model's probability.
        rows = np.concatenate([fit.x, fit.x])
        labels = np.r_[np.ones(len(fit.y)), np.zeros(len(fit.y))]
        weights = np.r_[fit.weight * soft, fit.weight * (1.0 - soft)]
    else:
        positives = max(float(fit.weight[fit.y == 1].sum()), 1.0)
        negatives = float(fit.weight[fit.y == 0].sum())
        # The full model's up-weighting of the fraud class, so both see the same balance.
        lgb_params["scale_pos_weight"] = math.sqrt(negatives / positives)
        rows, labels, weights = fit.x, fit.y, fit.weight
    fit_set = lgb.Dataset(rows, label=labels, weight=weights, feature_name=names)
    valid_set = lgb.Dataset(valid.x, label=valid.y, feature_name=names, reference=fit_set)
    booster = lgb.train(
        lgb_params,
        fit_set,
        num_boost_round=small.max_trees,
        valid_sets=[valid_set],
        callbacks=[lgb.early_stopping(small.early_stopping_rounds, verbose=False)],
    )
    trees = int(booster.best_iteration) or booster.current_iteration()
    return float32_thresholds(lgb.Booster(model_str=booster.model_to_string(num_iteration=trees)))
