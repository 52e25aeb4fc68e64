"""The pipeline with several versions: canary routing, live as the canary's fallback, shadow."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from prometheus_client import CollectorRegistry

from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.gateway.breaker import BreakerConfig, CircuitBreaker
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.canary import CanaryLimits, CanaryWatch
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import (
    Decision,
    Pipeline,
    ScoredBy,
)
from services.gateway.ports import Arm, DependencyError
from services.gateway.routing import ModelRoute, RouteTable, card_bucket
from services.gateway.shadow import ShadowPolicy, ShadowQueue, ShadowScorer
from services.gateway.validate import Transaction
from services.models import repository

from .tiny_models import metadata

NOW = 1_800_000_000.0
POLICY = BudgetPolicy()


class Features:
    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        values: dict[str, float | None] = dict.fromkeys(featurespec.STORE_FEATURES, 1.0)
        values["card_last_txn_s"] = NOW - 3600
        values["card_txn_count_1h"] = None  # a missing value: filled from the version's defaults
        return values


class Model:
    def __init__(self, score: float | None, delay_s: float = 0.0) -> None:
        self.value = score
        self.delay_s = delay_s
        self.vectors: list[list[float]] = []
        self.timeouts: list[float] = []

    async def score(self, vector: list[float], timeout_s: float) -> float:
        self.vectors.append(vector)
        self.timeouts.append(timeout_s)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.value is None:
            raise DependencyError("scorer", "timeout")
        return self.value


def _breaker(name: str) -> CircuitBreaker:
    config = BreakerConfig(
        sliding_window_size=4, minimum_number_of_calls=4, wait_duration_in_open_state_s=60
    )
    return CircuitBreaker(name, config)


def _version(
    version: str, review: float, decline: float, default: float
) -> repository.ModelMetadata:
    return metadata(
        version=version,
        thresholds=repository.Thresholds(review=review, decline=decline),
        default_features=dict.fromkeys(featurespec.MODEL_FEATURES, default),
    )


LIVE = _version("1", review=0.5, decline=0.9, default=1.0)
NEW = _version("2", review=0.1, decline=0.3, default=7.0)
CANARY_CARD = next(f"card-{i}" for i in range(1000) if card_bucket(f"card-{i}") < 5000)
LIVE_CARD = next(f"card-{i}" for i in range(1000) if card_bucket(f"card-{i}") >= 5000)


def _tx(card: str) -> Transaction:
    return Transaction("t", card, "m", 2500, "EUR", NOW, "", False)


REGISTRIES: dict[int, CollectorRegistry] = {}


def _sample(metrics: GatewayMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample of ``metrics``' registry (0 when absent)."""
    return REGISTRIES[id(metrics)].get_sample_value(name, labels or {}) or 0.0


def _pipeline(
    live: Model,
    canary: Model | None = None,
    shadow: Model | None = None,
    queue: dict[str, int] | None = None,
) -> tuple[Pipeline, GatewayMetrics]:
    """A pipeline over ``live`` (a canary, a shadow); with ``queue``, a shadow queue with
    those ``ShadowPolicy`` fields (not started)."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    REGISTRIES[id(metrics)] = registry
    rules = RulesEngine.load(DEFAULT_RULES, LIVE.feature_order)
    shadow_queue = (
        ShadowQueue(ShadowScorer(metrics).score, metrics.shadow_dropped.inc, ShadowPolicy(**queue))
        if queue is not None
        else None
    )
    pipeline = Pipeline(
        LIVE,
        rules,
        Features(),
        live,
        metrics,
        _breaker("features"),
        _breaker("scorer"),
        shadow_queue=shadow_queue,
    )
    base = pipeline.routes
    pipeline.routes = RouteTable(
        live=base.live,
        canary=ModelRoute(NEW, canary) if canary else None,
        canary_buckets=5000 if canary else 0,
        canary_breaker=_breaker("canary") if canary else None,
        watch=CanaryWatch("2", CanaryLimits(min_calls=1), cap_s=0.008) if canary else None,
        shadow=ModelRoute(NEW, shadow) if shadow else None,
    )
    return pipeline, metrics


async def test_canary_cards_get_the_canarys_answer_thresholds_and_defaults() -> None:
    live, canary = Model(0.2), Model(0.2)
    pipeline, metrics = _pipeline(live, canary)
    outcome = await pipeline.score(_tx(CANARY_CARD), Budget(POLICY, None))
    assert outcome.model_version == "2" and outcome.arm is Arm.CANARY
    # 0.2 is below live's review threshold but at the canary's decline-less review band.
    assert outcome.decision is Decision.REVIEW
    assert "review threshold 0.100" in outcome.reasons[0]
    index = featurespec.MODEL_FEATURES.index("card_txn_count_1h")
    assert canary.vectors[0][index] == 7.0 and not live.vectors
    assert max(canary.timeouts) <= pipeline.canary_cap_s
    assert (
        _sample(metrics, "fraudmesh_model_answers_total", {"route": "canary", "model_version": "2"})
        == 1
    )

    outcome = await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None))
    assert outcome.model_version == "1" and outcome.arm is Arm.LIVE
    assert outcome.decision is Decision.APPROVE
    assert live.vectors[0][index] == 1.0


async def test_a_failing_canary_is_answered_by_live_not_the_rules() -> None:
    live, canary = Model(0.2), Model(None)
    pipeline, metrics = _pipeline(live, canary)
    timed_out = []
    for _ in range(6):
        outcome = await pipeline.score(_tx(CANARY_CARD), Budget(POLICY, None))
        assert outcome.scored_by is ScoredBy.MODEL
        assert outcome.model_version == "1" and outcome.arm is Arm.LIVE
        # The answer names the canary that failed the card, for the monitor to count.
        assert outcome.canary_failed == "2"
        timed_out.append(outcome.canary_timed_out)
    assert timed_out == [True] * 4 + [False] * 2  # then refused by its open breaker
    # The canary's breaker opened after four failures; live's never saw them.
    assert len(canary.vectors) == 4
    assert pipeline.scorer_breaker.failed_calls == 0
    watch = pipeline.routes.watch
    assert watch is not None
    figures = watch.figures()
    assert figures[Arm.CANARY].calls == 6 and figures[Arm.CANARY].error_rate == 1.0
    assert figures[Arm.LIVE].calls == 6 and figures[Arm.LIVE].error_rate == 0.0
    labels = {"dependency": "scorer-canary", "reason": "timeout"}
    assert _sample(metrics, "fraudmesh_dependency_errors_total", labels) == 4


async def test_shadow_scores_after_the_answer_and_never_changes_it() -> None:
    live, shadow = Model(0.95), Model(0.2)
    pipeline, metrics = _pipeline(live, shadow=shadow, queue={"size": 10, "workers": 1})
    queue = pipeline.shadow_queue
    assert queue is not None
    queue.start()
    try:
        outcome = await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None))
        assert outcome.decision is Decision.DECLINE and outcome.model_version == "1"
        assert outcome.shadow_version == "2"
        await asyncio.sleep(0)
        assert not shadow.vectors, "shadow scored before the answer was handed over"
        pipeline.after_answer(outcome)
        assert outcome.shadow is not None
        result = await outcome.shadow.wait(1.0)
    finally:
        await queue.close()
    assert result is not None and result.version == "2"
    assert result.score == 0.2 and result.decision is Decision.REVIEW
    assert outcome.shadow_result() == result
    labels = {"model_version": "2", "answer": "decline", "shadow": "review"}
    assert _sample(metrics, "fraudmesh_shadow_decisions_total", labels) == 1
    # -0.75: at or below the -0.5 bucket's bound, so counted in it.
    diff = "fraudmesh_shadow_score_diff_bucket"
    assert _sample(metrics, diff, {"model_version": "2", "le": "-0.5"}) == 1


async def test_a_full_shadow_queue_drops_and_counts() -> None:
    live, shadow = Model(0.5), Model(0.5)
    pipeline, metrics = _pipeline(live, shadow=shadow, queue={"size": 2, "workers": 1})
    queue = pipeline.shadow_queue  # not started: nothing drains it
    assert queue is not None
    outcomes = [await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None)) for _ in range(3)]
    for outcome in outcomes:
        pipeline.after_answer(outcome)
    assert queue.pending == 2
    dropped = outcomes[2].shadow
    assert dropped is not None and await dropped.wait(0.1) is None
    assert _sample(metrics, "fraudmesh_shadow_dropped_total") == 1
    await queue.close()
    assert all(o.shadow is not None and o.shadow.result() is None for o in outcomes)


async def test_a_failing_shadow_is_counted_and_resolves_to_nothing() -> None:
    live, shadow = Model(0.5), Model(None)
    pipeline, metrics = _pipeline(live, shadow=shadow, queue={"workers": 1})
    queue = pipeline.shadow_queue
    assert queue is not None
    queue.start()
    try:
        outcome = await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None))
        pipeline.after_answer(outcome)
        assert outcome.shadow is not None and await outcome.shadow.wait(1.0) is None
    finally:
        await queue.close()
    labels = {"model_version": "2", "reason": "timeout"}
    assert _sample(metrics, "fraudmesh_shadow_errors_total", labels) == 1


async def test_rules_answers_carry_no_shadow() -> None:
    pipeline, _ = _pipeline(Model(None), shadow=Model(0.5), queue={})
    outcome = await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None))
    assert outcome.scored_by is ScoredBy.RULES and outcome.shadow is None


class BatchModel(Model):
    def __init__(self, score: float) -> None:
        super().__init__(score)
        self.batches: list[int] = []

    async def score_batch(self, vectors: list[list[float]], timeout_s: float) -> list[float]:
        self.batches.append(len(vectors))
        return [float(self.value or 0.0) + i / 100 for i in range(len(vectors))]


async def test_waiting_shadow_jobs_are_scored_in_one_call() -> None:
    live, shadow = Model(0.5), BatchModel(0.1)
    pipeline, metrics = _pipeline(live, shadow=shadow, queue={"max_batch": 4})
    queue = pipeline.shadow_queue
    assert queue is not None
    outcomes = [await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None)) for _ in range(6)]
    for outcome in outcomes:
        pipeline.after_answer(outcome)
    queue.start()  # six jobs wait: a batch of four, then one of two
    try:
        results = [await o.shadow.wait(1.0) for o in outcomes if o.shadow is not None]
    finally:
        await queue.close()
    assert shadow.batches == [4, 2] and not shadow.vectors
    assert [r.score if r else None for r in results] == pytest.approx(
        [0.1, 0.11, 0.12, 0.13, 0.1, 0.11]
    )
    decisions = {"model_version": "2", "answer": "review", "shadow": "review"}
    assert _sample(metrics, "fraudmesh_shadow_decisions_total", decisions) == 6
