"""How well the rules fallback catches fraud: precision and recall at its operating points.

Measured on the model's holdout (the same rows and features the model is judged on), so
degraded mode can be compared with the model side by side.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.domain.rules import RulesEngine


def rules_metrics(
    engine: RulesEngine, features: np.ndarray, names: Sequence[str], labels: np.ndarray
) -> dict[str, float]:
    """Rules scores on every row of ``features`` (columns ``names``) against ``labels``.

    Returns precision, recall and false-positive rate at the rules' review threshold
    (review or decline) and at their decline threshold, prefixed ``rules_``.
    """
    columns = list(names)
    scores = np.fromiter(
        (engine.evaluate(dict(zip(columns, row, strict=True))).score for row in features.tolist()),
        dtype=np.float64,
        count=len(features),
    )
    fraud = labels.astype(bool)
    metrics: dict[str, float] = {}
    for point, threshold in (("review", engine.review), ("decline", engine.decline)):
        flagged = scores >= threshold
        caught = int((flagged & fraud).sum())
        metrics[f"rules_precision_at_{point}"] = caught / max(int(flagged.sum()), 1)
        metrics[f"rules_recall_at_{point}"] = caught / max(int(fraud.sum()), 1)
        metrics[f"rules_fpr_at_{point}"] = int((flagged & ~fraud).sum()) / max(
            int((~fraud).sum()), 1
        )
    return metrics
