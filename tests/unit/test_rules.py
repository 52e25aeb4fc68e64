"""The rules engine: loading, checking and scoring."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine

RULES = """
version: test-1
thresholds: {review: 0.5, decline: 0.8}
rules:
  - name: big
    reason: "amount {amount:.0f} is big"
    weight: 0.6
    when: [[amount, ">=", 1000]]
  - name: fast
    reason: "{count:.0f} payments in the last hour"
    weight: 0.5
    when: [[count, ">", 5], [amount, ">", 0]]
"""


def _engine(tmp_path: Path, text: str = RULES) -> RulesEngine:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return RulesEngine.load(path, ["amount", "count"])


def test_no_rule_fires_scores_zero(tmp_path: Path) -> None:
    verdict = _engine(tmp_path).evaluate({"amount": 10.0, "count": 1.0})
    assert verdict.score == 0.0
    assert verdict.fired == ()


def test_weights_combine_as_independent_evidence(tmp_path: Path) -> None:
    features = {"amount": 2000.0, "count": 9.0}
    verdict = _engine(tmp_path).evaluate(features)
    assert verdict.score == pytest.approx(1 - 0.4 * 0.5)
    assert verdict.reasons(features) == ["amount 2000 is big", "9 payments in the last hour"]


def test_all_conditions_must_hold(tmp_path: Path) -> None:
    verdict = _engine(tmp_path).evaluate({"amount": 0.0, "count": 9.0})
    assert verdict.fired == ()


def test_unknown_feature_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="unknown feature 'nope'"):
        _engine(tmp_path, RULES.replace('[[amount, ">=", 1000]]', '[[nope, ">=", 1]]'))


def test_bad_weight_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="weight"):
        _engine(tmp_path, RULES.replace("weight: 0.6", "weight: 1.5"))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="rules file"):
        RulesEngine.load(tmp_path / "absent.yaml", ["amount"])


def test_shipped_rules_load_against_model_features() -> None:
    engine = RulesEngine.load(DEFAULT_RULES, featurespec.MODEL_FEATURES)
    assert engine.rules
    assert 0 < engine.review < engine.decline < 1
