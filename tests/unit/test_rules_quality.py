"""Rules quality figures on a tiny labelled set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.domain.rules_quality import rules_metrics, rules_scores

RULES = """
version: q
thresholds: {review: 0.5, decline: 0.8}
rules:
  - {name: big, reason: big, weight: 0.6, when: [[amount, ">=", 100]]}
  - {name: huge, reason: huge, weight: 0.6, when: [[amount, ">=", 1000]]}
"""


def test_precision_recall_and_fpr_at_both_points(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    engine = RulesEngine.load(path, ["amount"])
    amounts = np.array([[5.0], [150.0], [150.0], [2000.0], [3.0]])
    labels = np.array([0, 1, 0, 1, 1])
    metrics = rules_metrics(engine, amounts, ["amount"], labels)
    assert metrics["rules_precision_at_review"] == pytest.approx(2 / 3)
    assert metrics["rules_recall_at_review"] == pytest.approx(2 / 3)
    assert metrics["rules_fpr_at_review"] == pytest.approx(1 / 2)
    assert metrics["rules_precision_at_decline"] == pytest.approx(1.0)
    assert metrics["rules_recall_at_decline"] == pytest.approx(1 / 3)
    assert metrics["rules_fpr_at_decline"] == pytest.approx(0.0)


def test_vectorized_scores_equal_the_engine_row_by_row() -> None:
    names = featurespec.MODEL_FEATURES
    engine = RulesEngine.load(DEFAULT_RULES, names)
    rng = np.random.default_rng(4)
    # Values around every rule's thresholds, so that each fires on some rows.
    features = rng.choice([0.0, 1.0, 3.0, 5.0, 6.0, 0.06, 150.0, 600.0, 2500.0], (3000, len(names)))
    got = rules_scores(engine, features, names)
    want = [engine.evaluate(dict(zip(names, row, strict=True))).score for row in features.tolist()]
    assert got.tolist() == want
    assert len(set(want)) > 5
