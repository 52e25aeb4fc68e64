"""The cascade and the three-step degradation in the pipeline, with fake dependencies: the
small model's clear approvals skip the model call; when the model cannot answer the small
model answers with its own thresholds; the rules only when it cannot either."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from prometheus_client import CollectorRegistry

from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.gateway.breaker import BreakerConfig, CircuitBreaker, State
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.canary import CanaryLimits, CanaryWatch
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, Pipeline, ScoredBy
from services.gateway.ports import Arm, DependencyError
from services.gateway.routing import ModelRoute, RouteTable, card_bucket
from services.gateway.shadow import ShadowJob, ShadowScorer
from services.gateway.validate import Transaction
from services.models import repository

from .tiny_models import metadata

NOW = 1_800_000_000.0
POLICY = BudgetPolicy()
CANARY_CARD = next(f"card-{i}" for i in range(1000) if card_bucket(f"card-{i}") < 5000)
LIVE_CARD = next(f"card-{i}" for i in range(1000) if card_bucket(f"card-{i}") >= 5000)


def _small(clear: float, review: float = 0.2, decline: float = 0.6) -> repository.SmallModel:
    return repository.SmallModel(
        kind="distilled",
        trees=10,
        num_leaves=7,
        max_depth=3,
        clear_approve=clear,
        max_fraud_loss=0.005,
        thresholds=repository.Thresholds(review=review, decline=decline),
        parity_max_abs_diff=1e-7,
    )


# Versions of their own: with Feast imported, prometheus_client shares a label set's value
# across registries, and other modules count answers of versions 1 and 2.
LIVE = metadata(
    version="11",
    thresholds=repository.Thresholds(review=0.5, decline=0.9),
    small_model=_small(0.05),
)
CANARY = metadata(
    version="12",
    thresholds=repository.Thresholds(review=0.4, decline=0.8),
    small_model=_small(0.01),
)


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
        return values


class Model:
    """The full model behind the scorer: a fixed score, or a failure (None)."""

    def __init__(self, score: float | None, reason: str = "timeout") -> None:
        self.value = score
        self.reason = reason
        self.calls = 0

    async def score(self, vector: list[float], timeout_s: float) -> float:
        self.calls += 1
        if self.value is None:
            raise DependencyError("scorer", self.reason)
        return self.value

    async def score_batch(self, vectors: list[list[float]], timeout_s: float) -> list[float]:
        return [await self.score(v, timeout_s) for v in vectors]


class Small:
    """A small model in process: a fixed score, or a failure (None)."""

    def __init__(self, score: float | None) -> None:
        self.value = score
        self.calls = 0

    def score(self, vector: list[float]) -> float:
        self.calls += 1
        assert len(vector) == len(featurespec.MODEL_FEATURES)
        if self.value is None:
            raise RuntimeError("onnxruntime failed")
        return self.value


def _breaker(name: str) -> CircuitBreaker:
    config = BreakerConfig(
        sliding_window_size=4, minimum_number_of_calls=4, wait_duration_in_open_state_s=60
    )
    return CircuitBreaker(name, config)


def _pipeline(model: Model, small: Small | None, cascade: bool = True) -> Pipeline:
    registry = CollectorRegistry()
    rules = RulesEngine.load(DEFAULT_RULES, LIVE.feature_order)
    pipeline = Pipeline(
        LIVE,
        rules,
        Features(),
        model,
        GatewayMetrics(registry),
        _breaker("features"),
        _breaker("scorer"),
        small=small,
        cascade=cascade,
    )
    return pipeline


def _tx(card: str = LIVE_CARD) -> Transaction:
    return Transaction("t", card, "m", 2500, "EUR", NOW, "", False)


def _small_answers(pipeline: Pipeline, role: str, route: str = "live") -> float:
    # Read as deltas, the child made first: with Feast imported, prometheus_client keeps one
    # value per process and label set, shared by every registry.
    version = "11" if route == "live" else "12"
    pipeline.metrics.small_model_answers.labels(route, version, role)
    labels = {"route": route, "model_version": version, "role": role}
    registry = pipeline.metrics.registry
    return registry.get_sample_value("fraudmesh_small_model_answers_total", labels) or 0.0


def _small_errors(pipeline: Pipeline) -> float:
    pipeline.metrics.dependency_errors.labels("small-model", "error")
    labels = {"dependency": "small-model", "reason": "error"}
    registry = pipeline.metrics.registry
    return registry.get_sample_value("fraudmesh_dependency_errors_total", labels) or 0.0


async def test_a_clear_case_is_approved_at_the_first_stage_without_the_model() -> None:
    model, small = Model(0.95), Small(0.01)
    pipeline = _pipeline(model, small)
    before = _small_answers(pipeline, "first_stage")
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.FIRST_STAGE
    assert result.decision is Decision.APPROVE and result.score == 0.01
    assert result.model_version == "11" and result.arm is Arm.LIVE
    assert "clear-approve threshold 0.050" in result.reasons[0]
    assert model.calls == 0 and small.calls == 1
    assert _small_answers(pipeline, "first_stage") == before + 1


async def test_a_case_at_or_above_clear_approve_goes_to_the_model() -> None:
    model, small = Model(0.95), Small(0.05)
    pipeline = _pipeline(model, small)
    before = _small_answers(pipeline, "first_stage")
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.MODEL and result.decision is Decision.DECLINE
    assert result.score == 0.95 and model.calls == 1
    assert _small_answers(pipeline, "first_stage") == before


async def test_without_the_cascade_every_case_goes_to_the_model() -> None:
    model, small = Model(0.2), Small(0.0)
    pipeline = _pipeline(model, small, cascade=False)
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.MODEL and model.calls == 1 and small.calls == 0


@pytest.mark.parametrize("cascade", [True, False])
async def test_a_failing_model_is_answered_by_the_small_model_with_its_thresholds(
    cascade: bool,
) -> None:
    model, small = Model(None), Small(0.3)
    pipeline = _pipeline(model, small, cascade)
    before = _small_answers(pipeline, "fallback")
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.SMALL_MODEL
    # 0.3 is below the full model's review threshold (0.5) but above the small model's (0.2).
    assert result.decision is Decision.REVIEW and result.score == 0.3
    assert result.model_version == "11"
    assert result.reasons[0] == "small model score 0.300 >= review threshold 0.200"
    assert "small model fallback: model timed out" in result.reasons
    # With the cascade on, the first stage's score is reused: one small-model run.
    assert small.calls == 1
    assert _small_answers(pipeline, "fallback") == before + 1


class TimedModel(Model):
    """A model that records the timeout each call was given."""

    def __init__(self, score: float | None, reason: str = "timeout") -> None:
        super().__init__(score, reason)
        self.timeouts: list[float] = []

    async def score(self, vector: list[float], timeout_s: float) -> float:
        self.timeouts.append(timeout_s)
        return await super().score(vector, timeout_s)


@pytest.mark.parametrize("with_small", [True, False])
async def test_after_a_timeout_the_model_gets_the_short_slice_until_it_answers(
    with_small: bool,
) -> None:
    model = TimedModel(None)
    pipeline = _pipeline(model, Small(0.3) if with_small else None, cascade=False)
    short = POLICY.scorer_suspect_cap_s if with_small else POLICY.scorer_cap_s
    await pipeline.score(_tx(), Budget(POLICY, None))
    await pipeline.score(_tx(), Budget(POLICY, None))
    model.value = 0.2
    await pipeline.score(_tx(), Budget(POLICY, None))
    await pipeline.score(_tx(), Budget(POLICY, None))
    # The first call has the whole slice; after its timeout, the short one while a small
    # model stands by; the first answer gives the whole slice back.
    assert model.timeouts == pytest.approx(
        [POLICY.scorer_cap_s, short, short, POLICY.scorer_cap_s], abs=1e-3
    )


async def test_an_unavailable_scorer_is_not_suspect() -> None:
    model = TimedModel(None, reason="unavailable")
    pipeline = _pipeline(model, Small(0.3), cascade=False)
    for _ in range(2):
        await pipeline.score(_tx(), Budget(POLICY, None))
    assert model.timeouts == pytest.approx([POLICY.scorer_cap_s] * 2, abs=1e-3)


async def test_an_open_breaker_and_a_spent_budget_are_answered_by_the_small_model() -> None:
    model, small = Model(None), Small(0.7)
    pipeline = _pipeline(model, small)
    for _ in range(4):
        await pipeline.score(_tx(), Budget(POLICY, None))
    assert pipeline.scorer_breaker.state is State.OPEN
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.SMALL_MODEL and result.decision is Decision.DECLINE
    assert "small model fallback: model circuit breaker open" in result.reasons

    spent = Budget(POLICY, 0.001)
    result = await _pipeline(Model(0.9), Small(0.7)).score(_tx(), spent)
    assert result.scored_by is ScoredBy.SMALL_MODEL
    assert "small model fallback: too little budget left for the model" in result.reasons


async def test_the_rules_answer_only_when_the_small_model_cannot() -> None:
    for small in (None, Small(None)):
        pipeline = _pipeline(Model(None), small)
        before = _small_errors(pipeline)
        result = await pipeline.score(_tx(), Budget(POLICY, None))
        assert result.scored_by is ScoredBy.RULES
        assert result.model_version.startswith("rules-")
        fallback = next(r for r in result.reasons if r.startswith("rules fallback"))
        assert fallback.endswith("small model failed") == (small is not None)
        # A small model that failed at the first stage is not run again for the fallback.
        assert _small_errors(pipeline) == before + (1 if small is not None else 0)
        assert small is None or small.calls == 1


async def test_a_failing_small_model_at_the_first_stage_leaves_the_model_to_answer() -> None:
    model = Model(0.2)
    pipeline = _pipeline(model, Small(None))
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.MODEL and model.calls == 1


def _with_canary(
    pipeline: Pipeline, canary: Model, small: Small | None
) -> tuple[Pipeline, CanaryWatch]:
    watch = CanaryWatch("12", CanaryLimits(min_calls=1), cap_s=0.008)
    pipeline.routes = RouteTable(
        live=pipeline.routes.live,
        canary=ModelRoute(CANARY, canary, small),
        canary_buckets=5000,
        canary_breaker=_breaker("canary"),
        watch=watch,
    )
    return pipeline, watch


async def test_the_canary_runs_its_own_cascade_and_the_watch_counts_it() -> None:
    live_model, canary_model = Model(0.2), Model(0.2)
    pipeline = _pipeline(live_model, Small(0.03))
    pipeline, watch = _with_canary(pipeline, canary_model, Small(0.005))
    before = _small_answers(pipeline, "first_stage", "canary")
    result = await pipeline.score(_tx(CANARY_CARD), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.FIRST_STAGE and result.arm is Arm.CANARY
    assert result.model_version == "12" and canary_model.calls == 0
    assert _small_answers(pipeline, "first_stage", "canary") == before + 1
    result = await pipeline.score(_tx(LIVE_CARD), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.FIRST_STAGE and result.arm is Arm.LIVE
    figures = watch.figures()
    # Answered and not declined, with no model call to time.
    assert figures[Arm.CANARY].calls == 1 and figures[Arm.CANARY].timed == 0
    assert figures[Arm.LIVE].calls == 1 and figures[Arm.LIVE].error_rate == 0.0


async def test_a_canary_case_its_small_model_does_not_clear_goes_to_the_canary_model() -> None:
    live_model, canary_model = Model(0.2), Model(0.9)
    pipeline = _pipeline(live_model, Small(0.03))
    # 0.03 clears live's threshold (0.05), not the canary's (0.01).
    pipeline, watch = _with_canary(pipeline, canary_model, Small(0.03))
    result = await pipeline.score(_tx(CANARY_CARD), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.MODEL and result.arm is Arm.CANARY
    assert result.decision is Decision.DECLINE and canary_model.calls == 1
    assert watch.figures()[Arm.CANARY].timed == 1


class Queue:
    """Collects submitted shadow jobs."""

    def __init__(self) -> None:
        self.jobs: list[ShadowJob] = []

    def submit(self, job: ShadowJob) -> bool:
        self.jobs.append(job)
        return True


async def test_first_stage_answers_are_shadowed_and_the_shadow_runs_its_cascade() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    shadow_model = Model(0.9)
    live_model = Model(0.2)
    pipeline = _pipeline(live_model, Small(0.01))
    queue = Queue()
    pipeline.shadow_queue = queue  # type: ignore[assignment]
    pipeline.routes = RouteTable(
        live=pipeline.routes.live, shadow=ModelRoute(CANARY, shadow_model, Small(0.001))
    )
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.FIRST_STAGE and result.shadow is not None
    pipeline.after_answer(result)
    # The shadow's small model clears it too: no shadow model call.
    await ShadowScorer(metrics, cascade=True).score(queue.jobs)
    shadowed = await result.shadow.wait(1.0)
    assert shadowed is not None and shadowed.first_stage and shadowed.score == 0.001
    assert shadowed.decision is Decision.APPROVE and shadow_model.calls == 0

    # A case the shadow's small model does not clear goes to the shadow's model.
    pipeline.routes = RouteTable(
        live=pipeline.routes.live, shadow=ModelRoute(CANARY, shadow_model, Small(0.5))
    )
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.shadow is not None
    await ShadowScorer(metrics, cascade=True).score([result.shadow])
    shadowed = await result.shadow.wait(1.0)
    assert shadowed is not None and not shadowed.first_stage
    assert shadowed.decision is Decision.DECLINE and shadow_model.calls == 1


async def test_small_model_answers_standing_in_for_the_model_carry_no_shadow_job() -> None:
    pipeline = _pipeline(Model(None), Small(0.3))
    pipeline.shadow_queue = Queue()  # type: ignore[assignment]
    pipeline.routes = RouteTable(
        live=pipeline.routes.live, shadow=ModelRoute(CANARY, Model(0.2), Small(0.5))
    )
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.SMALL_MODEL and result.shadow is None
    await asyncio.sleep(0)


def test_a_route_without_a_small_model_has_no_cascade() -> None:
    route = ModelRoute(LIVE, Model(0.1))
    assert route.small is None and route.clear_approve == 0.0 and route.small_thresholds is None
    route = ModelRoute(LIVE, Model(0.1), Small(0.1))
    assert route.clear_approve == 0.05
    assert route.small_thresholds == repository.Thresholds(review=0.2, decline=0.6)


class NoFeatures:
    """A feature service that knows nothing of the card or merchant: every feature missing."""

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        return dict.fromkeys(featurespec.STORE_FEATURES)


class DownFeatures(NoFeatures):
    """A feature service that fails every call (the breaker's default features)."""

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        raise DependencyError("features", "unavailable")


@pytest.mark.parametrize("features", [NoFeatures(), DownFeatures()])
async def test_on_default_features_the_first_stage_never_approves(features: NoFeatures) -> None:
    # The small model would clear-approve (0.01 < 0.05); the full model reviews on the same
    # defaulted input. The answer is the full path's, not the first stage's.
    model, small = Model(0.7), Small(0.01)
    pipeline = _pipeline(model, small)
    pipeline.features = features
    before = _small_answers(pipeline, "first_stage")
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.feature_source.value == "default"
    assert result.scored_by is ScoredBy.MODEL and result.decision is Decision.REVIEW
    assert model.calls == 1 and small.calls == 0
    assert _small_answers(pipeline, "first_stage") == before
    # The same payment on online features is a clear case: the rule is about defaults only.
    online = _pipeline(Model(0.7), Small(0.01))
    assert (await online.score(_tx(), Budget(POLICY, None))).scored_by is ScoredBy.FIRST_STAGE


async def test_on_default_features_a_failing_model_falls_to_the_small_models_own_thresholds() -> (
    None
):
    # Without the model, the small model answers alone with its own thresholds (review at
    # 0.2 here), never with the clear approval: 0.3 is a review, not an approval.
    model, small = Model(None), Small(0.3)
    pipeline = _pipeline(model, small)
    pipeline.features = NoFeatures()
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.scored_by is ScoredBy.SMALL_MODEL and result.decision is Decision.REVIEW
    assert small.calls == 1


async def test_on_default_features_the_shadow_skips_its_first_stage_too() -> None:
    shadow_model, shadow_small = Model(0.7), Small(0.001)
    pipeline = _pipeline(Model(0.7), Small(0.01))
    pipeline.features = NoFeatures()
    canary_route = ModelRoute(CANARY, shadow_model, shadow_small)
    pipeline.routes = RouteTable(live=pipeline.routes.live, shadow=canary_route)
    pipeline.shadow_queue = _NullQueue()  # type: ignore[assignment]
    result = await pipeline.score(_tx(), Budget(POLICY, None))
    assert result.shadow is not None and result.shadow.defaulted
    registry = CollectorRegistry()
    await ShadowScorer(GatewayMetrics(registry), cascade=True).score([result.shadow])
    shadowed = result.shadow.result()
    assert shadowed is not None and not shadowed.first_stage
    assert shadowed.score == 0.7 and shadow_small.calls == 0 and shadow_model.calls == 1


class _NullQueue:
    """Stands for the shadow queue: the test scores the job itself."""

    def submit(self, job: ShadowJob) -> bool:
        return True
