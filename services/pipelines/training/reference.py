"""Training's reference step: the validation period's score and feature distributions and the
test period's quality with intervals, as the version's ``reference.json``
(``services.models.reference``)."""

from __future__ import annotations

from collections.abc import Sequence

import lightgbm as lgb
import numpy as np

from services.domain import featurespec
from services.models import reference
from services.models.repository import Thresholds, TrainingWindow
from services.pipelines.training.selection import predict


def version_reference(
    booster: lgb.Booster,
    x_valid: np.ndarray,
    raw_valid: np.ndarray,
    window: TrainingWindow,
    thresholds: Thresholds,
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
    seed: int = 0,
    cascade: tuple[lgb.Booster, float] | None = None,
    names: Sequence[str] = featurespec.MODEL_FEATURES,
) -> reference.ModelReference:
    """The reference of a trained model: its scores of every validation row (``x_valid``, the
    model input) against the raw features of those rows (``raw_valid``, NaN where missing;
    both in the version's feature order, ``names``),
    the test period's (labels, scores, cards) quality and, with a small model and its
    clear-approve threshold (``cascade``), the scores the cascade answers with."""
    assert window.validation_start is not None and window.train_end is not None
    labels, scores, cards = test
    full = predict(booster, x_valid)
    answered = None
    if cascade is not None:
        small, clear = cascade
        small_scores = predict(small, x_valid)
        answered = np.where(small_scores < clear, small_scores, full)
    return reference.fit(
        full,
        raw_valid,
        names,
        thresholds,
        (window.validation_start.isoformat(), window.train_end.isoformat()),
        reference.tested_quality(labels, scores, thresholds, cards, seed),
        answered=answered,
    )
