"""The scoring pipeline with in-process fake dependencies (pure logic, no servers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.gateway.breaker import BreakerConfig, CircuitBreaker, State
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import (
    Decision,
    Pipeline,
    ScoredBy,
    Source,
)
from services.gateway.ports import DependencyError
from services.gateway.validate import Transaction
from services.models import repository

NOW = 1_800_000_000.0
POLICY = BudgetPolicy()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Features:
    def __init__(self, values: Mapping[str, float | None] | None, delay_s: float = 0.0) -> None:
        self.values = values
        self.delay_s = delay_s
        self.calls = 0
        self.clock: Clock | None = None

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        self.calls += 1
        self.terminal_id = terminal_id
        if self.clock is not None:
            self.clock.now += self.delay_s
        if self.values is None:
            raise DependencyError("features", "unavailable")
        return self.values


class Model:
    def __init__(self, score: float | None) -> None:
        self.value = score
        self.calls = 0

    async def score(self, vector: list[float], timeout_s: float) -> float:
        self.calls += 1
        assert len(vector) == len(featurespec.MODEL_FEATURES)
        assert timeout_s > 0
        if self.value is None:
            raise DependencyError("scorer", "timeout")
        return self.value


def _metadata() -> repository.ModelMetadata:
    return repository.ModelMetadata(
        version="3",
        feature_order=list(featurespec.MODEL_FEATURES),
        input_name="input",
        output_name="probabilities",
        thresholds=repository.Thresholds(review=0.3, decline=0.8),
        default_features=dict.fromkeys(featurespec.MODEL_FEATURES, 1.0),
        metrics={},
        training_window=repository.TrainingWindow(
            start=datetime(2026, 1, 1, tzinfo=UTC),
            end=datetime(2026, 3, 1, tzinfo=UTC),
            holdout_start=datetime(2026, 2, 17, tzinfo=UTC),
        ),
        parity_max_abs_diff=1e-7,
        created_at=datetime(2026, 3, 1, tzinfo=UTC),
        lightgbm_version="4",
        onnxmltools_version="1",
        onnxruntime_version="1",
    )


def _breaker(name: str) -> CircuitBreaker:
    config = BreakerConfig(
        sliding_window_size=4, minimum_number_of_calls=4, wait_duration_in_open_state_s=60
    )
    return CircuitBreaker(name, config)


def _pipeline(features: Features, model: Model) -> Pipeline:
    metadata = _metadata()
    rules = RulesEngine.load(DEFAULT_RULES, metadata.feature_order)
    return Pipeline(
        metadata,
        rules,
        features,
        model,
        GatewayMetrics(CollectorRegistry()),
        _breaker("features"),
        _breaker("scorer"),
    )


def _store(**overrides: float | None) -> dict[str, float | None]:
    values: dict[str, float | None] = dict.fromkeys(featurespec.STORE_FEATURES, 1.0)
    values["card_last_txn_s"] = NOW - 3600
    values.update(overrides)
    return values


TX = Transaction("t", "c", "m", 2500, "EUR", NOW, "", False)


async def test_online_features_and_model_score() -> None:
    outcome = await _pipeline(Features(_store()), Model(0.9)).score(TX, Budget(POLICY, None))
    assert outcome.scored_by is ScoredBy.MODEL
    assert outcome.feature_source is Source.ONLINE
    assert outcome.decision is Decision.DECLINE
    assert outcome.model_version == "3"
    assert outcome.reasons[0].startswith("model score 0.900 >= decline")


@pytest.mark.parametrize(
    ("score", "decision"),
    [
        (0.05, Decision.APPROVE),
        (0.3, Decision.REVIEW),
        (0.79, Decision.REVIEW),
        (0.8, Decision.DECLINE),
    ],
)
async def test_thresholds_from_model_metadata(score: float, decision: Decision) -> None:
    outcome = await _pipeline(Features(_store()), Model(score)).score(TX, Budget(POLICY, None))
    assert outcome.decision is decision


async def test_some_missing_features_are_partial() -> None:
    store = _store(card_txn_count_1h=None, merchant_fraud_rate_28d=None)
    outcome = await _pipeline(Features(store), Model(0.1)).score(TX, Budget(POLICY, None))
    assert outcome.feature_source is Source.PARTIAL
    assert any("defaults" in r for r in outcome.reasons)


async def test_terminal_features_count_only_when_a_terminal_is_named() -> None:
    store = _store(**dict.fromkeys(featurespec.TERMINAL_FEATURES))
    features = Features(store)
    outcome = await _pipeline(features, Model(0.1)).score(TX, Budget(POLICY, None))
    assert features.terminal_id == ""
    assert outcome.feature_source is Source.ONLINE
    with_terminal = replace(TX, terminal_id="term-1")
    outcome = await _pipeline(features, Model(0.1)).score(with_terminal, Budget(POLICY, None))
    assert features.terminal_id == "term-1"
    assert outcome.feature_source is Source.PARTIAL


async def test_all_missing_features_are_default() -> None:
    store = dict.fromkeys(featurespec.STORE_FEATURES)
    outcome = await _pipeline(Features(store), Model(0.1)).score(TX, Budget(POLICY, None))
    assert outcome.feature_source is Source.DEFAULT


async def test_feature_failure_means_defaults_and_model_still_scores() -> None:
    outcome = await _pipeline(Features(None), Model(0.1)).score(TX, Budget(POLICY, None))
    assert outcome.feature_source is Source.DEFAULT
    assert outcome.scored_by is ScoredBy.MODEL


async def test_model_failure_means_rules() -> None:
    outcome = await _pipeline(Features(_store()), Model(None)).score(TX, Budget(POLICY, None))
    assert outcome.scored_by is ScoredBy.RULES
    assert outcome.model_version.startswith("rules-")
    assert "rules fallback: model timed out" in outcome.reasons


async def test_slow_features_leave_too_little_budget_for_the_model() -> None:
    clock = Clock()
    features = Features(_store(), delay_s=0.037)
    features.clock = clock
    model = Model(0.9)
    outcome = await _pipeline(features, model).score(TX, Budget(POLICY, None, clock))
    assert outcome.scored_by is ScoredBy.RULES
    assert model.calls == 0
    assert "rules fallback: too little budget left for the model" in outcome.reasons


async def test_no_budget_skips_both_calls() -> None:
    features, model = Features(_store()), Model(0.9)
    outcome = await _pipeline(features, model).score(TX, Budget(POLICY, 0.001))
    assert features.calls == 0 and model.calls == 0
    assert outcome.scored_by is ScoredBy.RULES
    assert outcome.feature_source is Source.DEFAULT


async def test_open_scorer_breaker_stops_calling_the_model() -> None:
    model = Model(None)
    pipeline = _pipeline(Features(_store()), model)
    for _ in range(4):
        await pipeline.score(TX, Budget(POLICY, None))
    assert pipeline.scorer_breaker.state is State.OPEN
    outcome = await pipeline.score(TX, Budget(POLICY, None))
    assert model.calls == 4
    assert outcome.scored_by is ScoredBy.RULES
    assert "rules fallback: model circuit breaker open" in outcome.reasons


async def test_open_features_breaker_serves_defaults_without_calling() -> None:
    features = Features(None)
    pipeline = _pipeline(features, Model(0.1))
    for _ in range(4):
        await pipeline.score(TX, Budget(POLICY, None))
    assert pipeline.features_breaker.state is State.OPEN
    outcome = await pipeline.score(TX, Budget(POLICY, None))
    assert features.calls == 4
    assert outcome.feature_source is Source.DEFAULT
