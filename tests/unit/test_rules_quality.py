"""Rules quality figures on a tiny labelled set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.domain.rules import RulesEngine
from services.domain.rules_quality import rules_metrics

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
