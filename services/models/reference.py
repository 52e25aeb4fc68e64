"""A model version's reference: the distributions it was validated on and the quality it was
tested at, stored in its folder (``reference.json``) for the monitor to judge live traffic by.

- the score's quantile bins and each model feature's bins (quantiles, or category shares for
  categorical ones), with the missing share in the last bin, over the validation period;
- with a small model, the score as the version answers through its cascade (the small model's
  below the clear-approve threshold, the full model's otherwise), in its own quantile bins
  (``answered``; absent in older references, which the monitor still reads);
- the decision rates the version's thresholds gave on that period;
- the test period's precision and recall at the review and decline thresholds (Wilson
  intervals) and its average precision (a bootstrap interval over cards).

The math is ``services.domain.metrics``; this module only fits, stores and reads. A version
published before references existed has none: ``load`` answers None and the monitor counts
its traffic without drift figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from services.domain import metrics
from services.models.repository import Thresholds

REFERENCE_FILE = "reference.json"
"""The reference inside a version folder."""
FORMAT = 1
"""Format number of ``reference.json``; a reader refuses a newer one."""
CATEGORICAL_FEATURES = frozenset({"merchant_category", "merchant_country", "card_home_country"})
"""Model inputs that are codes, not quantities: binned by category, not by quantile (the
country codes are inputs of versions trained with them added, ``fraudmesh train --feature``)."""
CYCLIC_FEATURES = frozenset({"hour_of_day"})
"""Inputs that follow the clock: a window shorter than a day covers part of their cycle, so
their PSI against a whole-period reference measures the time of day, not drift (the monitor
exports it, but neither alerts nor advice use it)."""
SCORE = "score"
"""The name the score's distribution goes by beside the features (``feature="score"``)."""
BOOTSTRAP_RESAMPLES = 200
"""Resamples of the average precision's interval (whole cards at a time)."""
LEVEL = 0.95
"""Confidence level of every interval."""


class ReferenceFormatError(ValueError):
    """``reference.json`` is unreadable or of a newer format than this build reads."""


@dataclass(frozen=True)
class Quality:
    """A version's figures on its test period, each with its interval."""

    rows: int
    frauds: int
    precision: dict[str, metrics.Interval]
    """By threshold (``review``, ``decline``): caught of flagged."""
    recall: dict[str, metrics.Interval]
    """By threshold: caught of frauds."""
    average_precision: metrics.Interval

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "rows": self.rows,
            "frauds": self.frauds,
            "precision": {k: _interval_dict(v) for k, v in self.precision.items()},
            "recall": {k: _interval_dict(v) for k, v in self.recall.items()},
            "average_precision": _interval_dict(self.average_precision),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Quality:
        """From ``to_dict``'s form."""
        return cls(
            rows=int(data["rows"]),
            frauds=int(data["frauds"]),
            precision={k: _interval(v) for k, v in data["precision"].items()},
            recall={k: _interval(v) for k, v in data["recall"].items()},
            average_precision=_interval(data["average_precision"]),
        )


def _interval_dict(interval: metrics.Interval) -> dict[str, float | None]:
    def clean(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {
        "estimate": clean(interval.estimate),
        "low": clean(interval.low),
        "high": clean(interval.high),
        "level": interval.level,
    }


def _interval(data: Mapping[str, Any]) -> metrics.Interval:
    def value(key: str) -> float:
        x = data.get(key)
        return math.nan if x is None else float(x)

    return metrics.Interval(value("estimate"), value("low"), value("high"), float(data["level"]))


@dataclass(frozen=True)
class ModelReference:
    """What live traffic of one version is compared with."""

    period: tuple[str, str]
    """Start and end (ISO 8601, UTC) of the period the distributions come from."""
    rows: int
    """Transactions in that period."""
    score: metrics.NumericReference
    features: dict[str, metrics.Reference]
    """Each model feature's distribution, in the version's feature order; the last bin
    holds the missing values."""
    thresholds: Thresholds
    decision_rates: dict[str, float]
    """Shares of approve, review and decline under ``thresholds`` in the period."""
    quality: Quality | None = None
    """The test period's figures; None when the version was not tested on labels."""
    notes: list[str] = field(default_factory=list)
    answered: metrics.NumericReference | None = None
    """The score as the version answers with its cascade on the same period (the small
    model's below its clear-approve threshold, the full model's otherwise); None without a
    small model, or in a reference written before it existed."""

    def score_reference(self, cascade: bool) -> metrics.NumericReference:
        """The score distribution live answers are compared with: the cascade's when they
        came through the cascade and the reference has it, else the full model's."""
        return self.answered if cascade and self.answered is not None else self.score

    def missing_share(self, feature: str) -> float:
        """The reference's share of missing values of ``feature``."""
        return self.features[feature].proportions[-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "format": FORMAT,
            "period": list(self.period),
            "rows": self.rows,
            "score": self.score.to_dict(),
            "features": {name: ref.to_dict() for name, ref in self.features.items()},
            "thresholds": self.thresholds.model_dump(),
            "decision_rates": self.decision_rates,
            "quality": self.quality.to_dict() if self.quality is not None else None,
            "notes": self.notes,
        } | ({"answered_score": self.answered.to_dict()} if self.answered is not None else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelReference:
        """From ``to_dict``'s form; raises ``ReferenceFormatError`` on a newer format."""
        if int(data.get("format", 0)) > FORMAT:
            raise ReferenceFormatError(
                f"reference format {data.get('format')} is newer than this build reads ({FORMAT})"
            )
        score = metrics.reference_from_dict(data["score"])
        if not isinstance(score, metrics.NumericReference):
            raise ReferenceFormatError("the score's reference must be numeric")
        quality = data.get("quality")
        answered = data.get("answered_score")
        answered_score = metrics.reference_from_dict(answered) if answered else None
        if answered_score is not None and not isinstance(answered_score, metrics.NumericReference):
            raise ReferenceFormatError("the answered score's reference must be numeric")
        return cls(
            period=(str(data["period"][0]), str(data["period"][1])),
            rows=int(data["rows"]),
            score=score,
            features={n: metrics.reference_from_dict(r) for n, r in data["features"].items()},
            thresholds=Thresholds.model_validate(data["thresholds"]),
            decision_rates={k: float(v) for k, v in data["decision_rates"].items()},
            quality=Quality.from_dict(quality) if quality else None,
            notes=[str(n) for n in data.get("notes", [])],
            answered=answered_score,
        )

    def write(self, folder: Path) -> Path:
        """Writes ``reference.json`` into ``folder`` (a version being published)."""
        path = folder / REFERENCE_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        return path


def fit(
    scores: np.ndarray,
    features: np.ndarray,
    feature_names: Sequence[str],
    thresholds: Thresholds,
    period: tuple[str, str],
    quality: Quality | None = None,
    bins: int = metrics.PSI_BINS,
    answered: np.ndarray | None = None,
) -> ModelReference:
    """The reference of a period: ``scores`` (one per row) and ``features`` (rows × names,
    NaN where a value was missing, as ``featurespec.model_frame`` gives them before defaults);
    ``answered``, the scores the version's cascade answers with on the same rows, if it has one."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    if answered is not None and len(answered) != len(s):
        raise ValueError(f"answered must hold {len(s)} scores, not {len(answered)}")
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape != (len(s), len(feature_names)):
        raise ValueError(
            f"features must be {len(s)} rows × {len(feature_names)} columns, not {x.shape}"
        )
    if len(s) == 0:
        raise ValueError("a reference needs at least one row")
    fitted: dict[str, metrics.Reference] = {}
    for j, name in enumerate(feature_names):
        column = x[:, j]
        if name in CATEGORICAL_FEATURES:
            fitted[name] = metrics.CategoricalReference.fit(category_codes(column))
        else:
            fitted[name] = metrics.NumericReference.fit(column, bins)
    return ModelReference(
        period=period,
        rows=len(s),
        score=metrics.NumericReference.fit(s, bins),
        features=fitted,
        thresholds=thresholds,
        decision_rates=metrics.decision_rates(s, thresholds.review, thresholds.decline),
        quality=quality,
        answered=(
            metrics.NumericReference.fit(np.asarray(answered, np.float64), bins)
            if answered is not None
            else None
        ),
    )


def category_codes(values: np.ndarray) -> list[str | None]:
    """Category codes as the categorical reference names them (``5411``), None for NaN."""
    return [None if math.isnan(v) else format(float(v), "g") for v in values.tolist()]


def tested_quality(
    labels: np.ndarray, scores: np.ndarray, thresholds: Thresholds, cards: np.ndarray, seed: int = 0
) -> Quality:
    """Precision and recall at both thresholds (Wilson) and average precision (bootstrap over
    cards) of a labelled test period."""
    y = np.asarray(labels).astype(bool)
    s = np.asarray(scores, dtype=np.float64)
    frauds = int(y.sum())
    precision, recall = {}, {}
    for name, threshold in (("review", thresholds.review), ("decline", thresholds.decline)):
        flagged = s >= threshold
        caught = int((flagged & y).sum())
        precision[name] = metrics.wilson_interval(caught, int(flagged.sum()), LEVEL)
        recall[name] = metrics.wilson_interval(caught, frauds, LEVEL)
    ap = metrics.bootstrap_interval(
        metrics.average_precision, y, s, groups=cards, resamples=BOOTSTRAP_RESAMPLES,
        level=LEVEL, seed=seed,
    )  # fmt: skip
    return Quality(len(y), frauds, precision, recall, ap)


def load(folder: Path) -> ModelReference | None:
    """The reference in a version folder; None when the version has none."""
    path = folder / REFERENCE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return ModelReference.from_dict(json.loads(text))
    except (KeyError, TypeError, ValueError) as error:
        raise ReferenceFormatError(f"{path}: {error}") from error
