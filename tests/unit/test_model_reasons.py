"""Reasons from the model: exact TreeSHAP contributions of real LightGBM trees (sum, order,
sign, float32 inputs), and the pipeline that puts them in REVIEW and DECLINE answers only."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.explain import LocalExplainer, LocalExplainerProvider
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, Pipeline, ScoredBy, ScoreResult
from services.gateway.ports import DependencyError
from services.models import repository
from services.models.explain import (
    BOOSTER_FILE,
    BoosterMismatch,
    Contribution,
    Explanation,
    TreeExplainer,
)
from tests.unit.test_pipeline import TX, Clock, Features, _breaker, _metadata, _store

ORDER = list(featurespec.MODEL_FEATURES)
ROOMY = BudgetPolicy(default_s=20.0, explain_cap_s=10.0)
"""A budget a busy machine cannot run out of, for the tests whose reasons must be given."""
LINE = re.compile(r"^model feature (\S+) = (\S+): ([+-]\d+\.\d+) log-odds \(toward (\w+)\)$")
SUMMARY = re.compile(
    r"^model log-odds (\S+) = base (\S+) (\S+) from (\d+) features above (\S+) from (\d+) others$"
)


@pytest.fixture(scope="module")
def booster() -> lgb.Booster:
    """Real trees on the model's inputs: fraud when card velocity and amount are high."""
    rng = np.random.default_rng(7)
    x = rng.gamma(2.0, 2.0, size=(4000, len(ORDER)))
    logit = 0.8 * x[:, 0] + 0.3 * x[:, ORDER.index("amount_eur")] - 6.0
    y = rng.random(4000) < 1.0 / (1.0 + np.exp(-logit))
    params = {"objective": "binary", "num_leaves": 8, "verbose": -1, "seed": 7}
    return lgb.train(params, lgb.Dataset(x, y, feature_name=ORDER), num_boost_round=40)


@pytest.fixture(scope="module")
def trees(booster: lgb.Booster) -> TreeExplainer:
    return TreeExplainer(booster, ORDER)


def _rows(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).gamma(2.0, 2.0, size=(n, len(ORDER)))


def test_contributions_plus_base_are_the_raw_score(
    booster: lgb.Booster, trees: TreeExplainer
) -> None:
    rows = _rows(200)
    raw = booster.predict(rows.astype(np.float32).astype(np.float64), raw_score=True)
    for row, expected in zip(rows, raw, strict=True):
        explanation = trees.explain(row.tolist())
        assert abs(explanation.raw - expected) < 1e-9
        assert abs(explanation.probability - 1.0 / (1.0 + math.exp(-expected))) < 1e-12
        assert [c.feature for c in explanation.contributions] == ORDER
    # Not every input is alike: the explanation follows it.
    first, second = (trees.explain(r.tolist()) for r in rows[:2])
    assert first.contributions != second.contributions


def test_the_tables_give_lightgbms_own_contributions(trees: TreeExplainer) -> None:
    assert trees.tabulated
    rows = _rows(200, seed=3)
    rows[::7, 2] = np.nan  # missing values take each split's default branch on both paths
    for row in rows:
        fast, checked = trees.explain(list(row)), trees.explain_by_predict(list(row))
        assert fast.base == pytest.approx(checked.base, abs=1e-12)
        for a, b in zip(fast.contributions, checked.contributions, strict=True):
            assert a.feature == b.feature
            assert a.log_odds == pytest.approx(b.log_odds, abs=1e-12)
            assert a.value == b.value or (math.isnan(a.value) and math.isnan(b.value))


def test_the_trees_see_the_float32_input_the_scorer_receives(trees: TreeExplainer) -> None:
    row = _rows(1)[0].tolist()
    row[0] = 0.1
    explanation = trees.explain(row)
    assert explanation.contributions[0].value == float(np.float32(0.1)) != 0.1
    assert explanation.raw == pytest.approx(trees.raw_score(row), abs=1e-9)


def test_top_k_largest_first_with_sign_and_value(trees: TreeExplainer) -> None:
    for row in _rows(50, seed=2):
        explanation = trees.explain(row.tolist())
        top = explanation.top(3)
        sizes = sorted((abs(c.log_odds) for c in explanation.contributions), reverse=True)
        assert [abs(c.log_odds) for c in top] == sizes[:3]
        lines = explanation.reasons(3)
        assert len(lines) == 4
        for line, c in zip(lines, top, strict=False):
            match = LINE.match(line)
            assert match is not None, line
            name, value, log_odds, toward = match.groups()
            assert name == c.feature and float(value) == pytest.approx(c.value, rel=1e-5)
            assert float(log_odds) == pytest.approx(c.log_odds, abs=1e-9)
            assert toward == ("fraud" if c.log_odds >= 0 else "legitimate")
        _assert_sums(lines, explanation.raw, k=3)


def _assert_sums(lines: list[str], raw: float, k: int) -> None:
    """The reasons' own figures add up to the raw score they state (and to ``raw``)."""
    summary = SUMMARY.match(lines[k])
    assert summary is not None, lines[k]
    stated, base, shown, above, rest, others = summary.groups()
    features = [float(LINE.match(line).group(3)) for line in lines[:k]]  # type: ignore[union-attr]
    assert int(above) == k and int(others) == len(ORDER) - k
    assert abs(sum(features) - float(shown)) < 1e-6
    assert abs(float(base) + float(shown) + float(rest) - float(stated)) < 1e-6
    assert abs(float(stated) - raw) < 1e-6


def test_signs_point_both_ways_and_ties_keep_feature_order() -> None:
    made_up = Explanation(
        -2.0,
        (
            Contribution("a", 1.0, -0.5),
            Contribution("b", 2.0, 0.5),
            Contribution("c", 3.0, 1.5),
            Contribution("d", 4.0, 0.0),
        ),
    )
    assert [c.feature for c in made_up.top(3)] == ["c", "a", "b"]
    lines = made_up.reasons(2)
    assert lines[0] == "model feature c = 3: +1.500000000 log-odds (toward fraud)"
    assert lines[1] == "model feature a = 1: -0.500000000 log-odds (toward legitimate)"
    assert lines[2] == (
        "model log-odds -0.500000000 = base -2.000000000 +1.000000000 from 2 features above "
        "+0.500000000 from 2 others"
    )


def test_an_explanation_matches_only_its_served_probability(trees: TreeExplainer) -> None:
    explanation = trees.explain(_rows(1)[0].tolist())
    served = float(np.float32(explanation.probability))
    assert explanation.matches(served)
    assert not explanation.matches(explanation.probability + 2e-6)


async def test_a_version_without_booster_text_has_no_explainer(
    tmp_path: Path, booster: lgb.Booster
) -> None:
    assert TreeExplainer.load(tmp_path, ORDER) is None
    booster.save_model(str(tmp_path / BOOSTER_FILE))
    assert TreeExplainer.load(tmp_path, ORDER) is not None
    with pytest.raises(BoosterMismatch):
        TreeExplainer.load(tmp_path, ORDER[:-1])
    # The gateway's loader: no booster text in the version folder, no explainer.
    metadata = _metadata()
    (tmp_path / metadata.name / metadata.version).mkdir(parents=True)
    provider = LocalExplainerProvider(tmp_path)
    assert await provider.prepare(metadata) is None
    provider.close()
    with pytest.raises(BoosterMismatch):
        TreeExplainer.load(tmp_path, list(reversed(ORDER)))


# The pipeline ----------------------------------------------------------------------------


class TreesModel:
    """The scorer's stand-in: serves the trees' own probability as float32, as ONNX does."""

    def __init__(
        self,
        trees: TreeExplainer,
        offset: float = 0.0,
        clock: Clock | None = None,
        at: float = 0,
        fail: bool = False,
    ) -> None:
        self.trees = trees
        self.fail = fail
        self.offset = offset
        self.clock = clock
        self.at = at
        """Where the model call leaves the clock (with ``clock``)."""

    async def score(self, vector: list[float], timeout_s: float) -> float:
        if self.clock is not None:
            self.clock.now = self.at
        if self.fail:
            raise DependencyError("scorer", "unavailable")
        raw = self.trees.raw_score(vector)
        return float(np.float32(1.0 / (1.0 + math.exp(-raw)))) + self.offset


async def _provider(
    tmp_path: Path, booster: lgb.Booster
) -> tuple[LocalExplainer, LocalExplainerProvider]:
    metadata = _metadata()
    folder = tmp_path / metadata.name / metadata.version
    folder.mkdir(parents=True)
    booster.save_model(str(folder / BOOSTER_FILE))
    provider = LocalExplainerProvider(tmp_path)
    explainer = await provider.prepare(metadata)
    assert explainer is not None
    return explainer, provider


def _pipeline(
    explainer: LocalExplainer | None,
    model: TreesModel,
    review: float,
    decline: float,
    k: int = 3,
    features: Features | None = None,
) -> tuple[Pipeline, Callable[[], dict[str, float]]]:
    """The pipeline, and what its model-reason outcomes have counted since it was built."""
    metadata = _metadata().model_copy(
        update={"thresholds": repository.Thresholds(review=review, decline=decline)}
    )
    metrics = GatewayMetrics(CollectorRegistry())
    pipeline = Pipeline(
        metadata,
        RulesEngine.load(DEFAULT_RULES, metadata.feature_order),
        features or Features(_store(card_txn_count_1h=9.0)),
        model,
        metrics,
        _breaker("features"),
        _breaker("scorer"),
        explainer=explainer,
        model_reasons=k,
    )
    before = _counts(metrics)
    return pipeline, lambda: _added(before, metrics)


OUTCOMES = ("given", "no_budget", "busy", "timeout", "error", "mismatch")


def _counts(metrics: GatewayMetrics) -> dict[str, float]:
    """Each outcome's count; compare two readings (children start from the process's value)."""
    for outcome in OUTCOMES:
        metrics.model_reasons.labels(outcome)
    return {
        outcome: metrics.registry.get_sample_value(
            "fraudmesh_model_reasons_total", {"outcome": outcome}
        )
        or 0.0
        for outcome in OUTCOMES
    }


def _added(before: dict[str, float], metrics: GatewayMetrics) -> dict[str, float]:
    """The outcomes counted since ``before``."""
    after = _counts(metrics)
    return {k: after[k] - before[k] for k in OUTCOMES if after[k] != before[k]}


async def test_a_decline_names_the_models_features_after_its_score(
    tmp_path: Path, booster: lgb.Booster
) -> None:
    explainer, provider = await _provider(tmp_path, booster)
    model = TreesModel(explainer.trees)
    pipeline, added = _pipeline(explainer, model, 0.0, 0.0, k=2)
    result = await pipeline.score(TX, Budget(ROOMY, None))
    assert result.decision is Decision.DECLINE and result.scored_by is ScoredBy.MODEL
    assert result.reasons[0].startswith("model score")
    assert all(LINE.match(r) for r in result.reasons[1:3]), result.reasons
    raw = explainer.trees.raw_score(result.features)
    _assert_sums(result.reasons[1:4], raw, k=2)
    assert abs(1.0 / (1.0 + math.exp(-raw)) - result.score) <= 1e-6
    # The rules that fired still follow: the model's reasons come first.
    assert "payments on this card in the last hour" in " ".join(result.reasons[4:])
    assert added() == {"given": 1}
    provider.close()


async def test_approvals_and_fallbacks_keep_their_reasons(
    tmp_path: Path, booster: lgb.Booster
) -> None:
    explainer, provider = await _provider(tmp_path, booster)
    model = TreesModel(explainer.trees)
    approving, added = _pipeline(explainer, model, 1.0, 1.0)
    approved = await approving.score(TX, Budget(BudgetPolicy(), None))
    assert approved.decision is Decision.APPROVE
    assert not any(r.startswith("model feature") for r in approved.reasons)
    # Default features: the model's reasons would explain the population's average.
    on_defaults, on_defaults_added = _pipeline(explainer, model, 0.0, 0.0, features=Features(None))
    declined = await on_defaults.score(TX, Budget(BudgetPolicy(), None))
    assert declined.decision is Decision.DECLINE
    assert not any(r.startswith("model feature") for r in declined.reasons)
    # The rules' fallback: the model gave no answer to explain.
    failing, failing_added = _pipeline(explainer, TreesModel(explainer.trees, fail=True), 0, 0)
    fallback = await failing.score(TX, Budget(BudgetPolicy(), None))
    assert fallback.scored_by is ScoredBy.RULES
    assert not any(r.startswith("model feature") for r in fallback.reasons)
    off, off_added = _pipeline(explainer, model, 0.0, 0.0, k=0)
    plain = await off.score(TX, Budget(BudgetPolicy(), None))
    assert not any(r.startswith("model feature") for r in plain.reasons)
    assert added() == on_defaults_added() == failing_added() == off_added() == {}
    provider.close()


async def test_no_reasons_without_budget_or_from_other_trees(
    tmp_path: Path, booster: lgb.Booster
) -> None:
    explainer, provider = await _provider(tmp_path, booster)
    clock, policy = Clock(), BudgetPolicy()
    # The model answers when only the reserve and less than the reasons' least time are left.
    at = policy.default_s - policy.reserve_s - policy.explain_min_s / 2
    model = TreesModel(explainer.trees, clock=clock, at=at)
    pipeline, added = _pipeline(explainer, model, 0.0, 0.0)
    late = await pipeline.score(TX, Budget(policy, None, clock))
    assert late.decision is Decision.DECLINE
    assert not any(r.startswith("model feature") for r in late.reasons)
    assert added() == {"no_budget": 1}
    # A served score the trees do not give: the trees are not the served model.
    other, other_added = _pipeline(explainer, TreesModel(explainer.trees, 1e-5), 0.0, 0.0)
    mismatched = await other.score(TX, Budget(ROOMY, None))
    assert not any(r.startswith("model feature") for r in mismatched.reasons)
    assert other_added() == {"mismatch": 1}
    provider.close()


async def test_a_busy_explainer_is_not_waited_for(
    tmp_path: Path, booster: lgb.Booster, monkeypatch: pytest.MonkeyPatch
) -> None:
    explainer, provider = await _provider(tmp_path, booster)
    # A version the contribution tables do not cover: LightGBM explains on the worker.
    monkeypatch.setattr(explainer.trees, "_tables", None)
    pipeline, added = _pipeline(explainer, TreesModel(explainer.trees), 0.0, 0.0)
    # The first call's explanation holds the worker until the second call has answered.
    gate, explain = threading.Event(), explainer.trees.explain

    def held(vector: list[float]) -> Explanation:
        assert gate.wait(10.0)
        return explain(vector)

    monkeypatch.setattr(explainer.trees, "explain", held)

    async def second() -> ScoreResult:
        await asyncio.sleep(0)
        try:
            return await pipeline.score(TX, Budget(ROOMY, None))
        finally:
            gate.set()

    first, other = await asyncio.gather(pipeline.score(TX, Budget(ROOMY, None)), second())
    assert any(r.startswith("model feature") for r in first.reasons)
    assert not any(r.startswith("model feature") for r in other.reasons)
    assert other.decision is Decision.DECLINE
    assert added() == {"busy": 1, "given": 1}
    provider.close()


def test_a_lean_load_explains_without_data_frames_and_leaves_them_importable(
    tmp_path: Path, booster: lgb.Booster
) -> None:
    """A gateway's first import of LightGBM leaves out pandas and scikit-learn (0.7 s of CPU
    of a restart), gives the same contributions, and a later import of either still works."""
    booster.save_model(str(tmp_path / BOOSTER_FILE))
    row = _rows(1)[0].tolist()
    expected = TreeExplainer(booster, ORDER).explain(row)
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from services.models.explain import TreeExplainer\n"
        f"trees = TreeExplainer.load(Path({str(tmp_path)!r}), {ORDER!r}, lean=True)\n"
        f"e = trees.explain({row!r})\n"
        "loaded = [m for m in ('pandas', 'sklearn') if m in sys.modules]\n"
        "import pandas, sklearn\n"
        "print(json.dumps([loaded, e.base, [c.log_odds for c in e.contributions]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded, base, shares = json.loads(done.stdout)
    assert loaded == []
    assert base == expected.base
    assert shares == [c.log_odds for c in expected.contributions]


async def test_a_tabulated_version_is_explained_at_once_without_the_worker(
    tmp_path: Path, booster: lgb.Booster
) -> None:
    explainer, provider = await _provider(tmp_path, booster)
    assert explainer.trees.tabulated
    provider.close()  # no worker thread any more: the tables need none
    pipeline, added = _pipeline(explainer, TreesModel(explainer.trees), 0.0, 0.0)
    first, second = await asyncio.gather(
        pipeline.score(TX, Budget(ROOMY, None)), pipeline.score(TX, Budget(ROOMY, None))
    )
    for result in (first, second):
        assert any(r.startswith("model feature") for r in result.reasons)
    assert added() == {"given": 2}
