"""How well the rules fallback catches fraud: precision and recall at its operating points.

Measured on the model's holdout (the same rows and features the model is judged on), so
degraded mode can be compared with the model side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from services.domain.metrics import operating_point
from services.domain.rules import RulesEngine


def rules_scores(engine: RulesEngine, features: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """The engine's score for every row of ``features`` (columns ``names``), vectorized.

    Equal to ``engine.evaluate(row).score`` row by row: each rule fires where all its
    comparisons hold, and the weights of the fired rules combine in rule order.
    """
    column = {name: i for i, name in enumerate(names)}
    clean = np.ones(len(features), dtype=np.float64)
    for rule in engine.rules:
        fires = np.ones(len(features), dtype=bool)
        for condition in rule.conditions:
            # The comparison operators work elementwise on arrays as they do on floats.
            op = cast(Callable[[np.ndarray, float], np.ndarray], condition.op)
            fires &= op(features[:, column[condition.feature]], condition.value)
        clean = np.where(fires, clean * (1.0 - rule.weight), clean)
    return 1.0 - clean


def rules_metrics(
    engine: RulesEngine, features: np.ndarray, names: Sequence[str], labels: np.ndarray
) -> dict[str, float]:
    """Rules scores on every row of ``features`` (columns ``names``) against ``labels``.

    Returns precision, recall and false-positive rate at the rules' review threshold
    (review or decline) and at their decline threshold, prefixed ``rules_``.
    """
    scores = rules_scores(engine, features, names)
    figures: dict[str, float] = {}
    for point, threshold in (("review", engine.review), ("decline", engine.decline)):
        judged = operating_point(labels, scores, threshold)
        figures[f"rules_precision_at_{point}"] = judged.precision
        figures[f"rules_recall_at_{point}"] = judged.recall
        figures[f"rules_fpr_at_{point}"] = judged.fpr
    return figures
