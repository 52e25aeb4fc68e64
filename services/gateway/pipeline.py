"""The scoring pipeline: features, then model, then decision, each inside the budget.

Transport-free: the feature and model clients are injected, so the pipeline is tested
without servers. Whatever fails behind it, ``score`` returns an on-time result.

Which model version answers comes from the route table (``routing.py``), swapped whole
when the lifecycle changes: the live version, or the canary for its share of cards. The
version that answers brings its own defaults and thresholds. A canary call gets a shorter
slice of the budget and its own breaker; if it fails, the live version answers (the rules
only when live cannot too), and the canary watch counts the failure. With a shadow version
routed, a model answer carries a shadow job, scored once the answer has been sent.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.domain import featurespec
from services.domain.rules import RulesEngine
from services.gateway.breaker import CircuitBreaker
from services.gateway.budget import Budget
from services.gateway.decision import Decision, decide
from services.gateway.metrics import GatewayMetrics
from services.gateway.ports import (
    Arm,
    DependencyError,
    FeatureClient,
    ModelClient,
)
from services.gateway.routing import ModelRoute, RouteTable
from services.gateway.shadow import ShadowJob, ShadowQueue, ShadowResult
from services.gateway.validate import Transaction
from services.models.repository import ModelMetadata

__all__ = [
    "CANARY_CAP_S",
    "Decision",
    "Pipeline",
    "ScoreResult",
    "ScoredBy",
    "Source",
    "guarded",
]


CANARY_CAP_S = 0.008
"""Longest a canary model call may take by default; after it the live version answers, with
the rest of the budget."""


class ScoredBy(enum.Enum):
    """Which engine produced the score."""

    MODEL = "model"
    RULES = "rules"


class Source(enum.Enum):
    """Where the features came from."""

    ONLINE = "online"
    PARTIAL = "partial"
    DEFAULT = "default"


T = TypeVar("T")


async def guarded(breaker: CircuitBreaker, call: Callable[[], Awaitable[T]]) -> T:
    """Runs ``call`` under ``breaker``: refused while open, success or failure and duration recorded."""
    if not breaker.try_acquire():
        raise DependencyError(breaker.name, "breaker_open")
    start = time.perf_counter()
    try:
        result = await call()
    except DependencyError:
        breaker.on_error(time.perf_counter() - start)
        raise
    except asyncio.CancelledError:
        # The caller went away: nothing to judge the dependency by.
        breaker.release()
        raise
    breaker.on_success(time.perf_counter() - start)
    return result


@dataclass(slots=True)
class ScoreResult:
    """What scoring one transaction gave: the decision and how it was reached."""

    decision: Decision
    score: float
    reasons: list[str] = field(default_factory=list)
    model_version: str = ""
    """The version that answered (``rules-…`` when the rules did)."""
    scored_by: ScoredBy = ScoredBy.MODEL
    feature_source: Source = Source.ONLINE
    arm: Arm = Arm.LIVE
    """The arm that answered: the canary, or live (also when the rules answered)."""
    shadow: ShadowJob | None = None
    """The shadow version's scoring of this transaction, run after the answer is sent
    (``Pipeline.after_answer``): ``shadow.version``, ``await shadow.wait(timeout)``."""
    features: list[float] = field(default_factory=list)
    """The model input the score was computed from, in ``feature_order``."""
    feature_order: tuple[str, ...] = ()
    """Names of ``features``: the feature order of the version whose input was built."""
    store: Mapping[str, float | None] | None = None
    """The store read ``features`` came from (the decision event names the values that
    took defaults from it, after the answer)."""

    @property
    def shadow_version(self) -> str:
        """The shadow version that scores this transaction, or empty."""
        return self.shadow.version if self.shadow is not None else ""

    def shadow_result(self) -> ShadowResult | None:
        """The shadow's result if it has finished, else None."""
        return self.shadow.result() if self.shadow is not None else None


class Pipeline:
    """Scores validated transactions with the routed model version, falling back to the
    live version, defaults and rules."""

    def __init__(
        self,
        metadata: ModelMetadata,
        rules: RulesEngine,
        features: FeatureClient,
        model: ModelClient,
        metrics: GatewayMetrics,
        features_breaker: CircuitBreaker,
        scorer_breaker: CircuitBreaker,
        *,
        canary_cap_s: float = CANARY_CAP_S,
        shadow_queue: ShadowQueue | None = None,
    ) -> None:
        self.routes = RouteTable(live=ModelRoute(metadata, model))
        """What answers now; replaced whole when the lifecycle changes."""
        self.features_breaker = features_breaker
        self.scorer_breaker = scorer_breaker
        self.rules = rules
        self.features = features
        self.metrics = metrics
        self.canary_cap_s = canary_cap_s
        self.shadow_queue = shadow_queue
        """Where shadow jobs go after the answer (``ShadowScorer`` scores them); None scores
        no shadow."""
        self._store_names = featurespec.STORE_FEATURES
        # A payment that names no terminal expects none of the terminal's features.
        self._named_store = featurespec.CARD_FEATURES + featurespec.MERCHANT_FEATURES
        self._answer_counters: dict[tuple[Arm, str], Any] = {}

    @property
    def metadata(self) -> ModelMetadata:
        """The live version's metadata."""
        return self.routes.live.metadata

    @property
    def model(self) -> ModelClient:
        """The live version's client."""
        return self.routes.live.client

    async def _read_features(
        self, tx: Transaction, budget: Budget
    ) -> tuple[Mapping[str, float | None], Source]:
        timeout = budget.features_timeout()
        if timeout <= 0:
            self.metrics.dependency_error("features", "no_budget")
            return {}, Source.DEFAULT
        try:
            store = await guarded(
                self.features_breaker,
                lambda: self.features.get(
                    tx.card_id, tx.merchant_id, tx.timestamp_s, timeout, tx.terminal_id
                ),
            )
        except DependencyError as error:
            self.metrics.dependency_error("features", error.reason)
            return {}, Source.DEFAULT
        expected = self._store_names if tx.terminal_id else self._named_store
        missing = sum(1 for name in expected if store.get(name) is None)
        if missing == 0:
            return store, Source.ONLINE
        if missing == len(expected):
            return store, Source.DEFAULT
        return store, Source.PARTIAL

    async def score(self, tx: Transaction, budget: Budget) -> ScoreResult:
        """Scores ``tx``; always returns before the budget's reserve is spent."""
        table = self.routes
        route, arm = table.pick(tx.card_id)
        store, source = await self._read_features(tx, budget)
        notes = [] if source is Source.ONLINE else [_SOURCE_NOTE[source]]
        if arm is Arm.CANARY:
            answered = await self._score_canary(table, route, tx, store, source, notes, budget)
            if answered is not None:
                answered.store = store
                return self._with_shadow(table, answered, tx, store)
            route = table.live
        vector = route.vector(tx, store)
        named = dict(zip(route.order, vector, strict=True))
        verdict = self.rules.evaluate(named)
        rule_reasons = verdict.reasons(named)

        timeout = budget.scorer_timeout()
        fallback_reason = "too little budget left for the model"
        if timeout > 0:
            watch = table.watch
            started = time.perf_counter()
            try:
                score = await guarded(
                    self.scorer_breaker, lambda: route.client.score(vector, timeout)
                )
            except DependencyError as error:
                self.metrics.dependency_error("scorer", error.reason)
                fallback_reason = f"model {_REASON_TEXT.get(error.reason, error.reason)}"
                if watch is not None and error.reason != "breaker_open":
                    watch.record(Arm.LIVE, False, time.perf_counter() - started, False)
            else:
                elapsed = time.perf_counter() - started
                result = self._model_result(
                    route, Arm.LIVE, score, rule_reasons, notes, source, vector
                )
                if watch is not None:
                    watch.record(Arm.LIVE, True, elapsed, result.decision is Decision.DECLINE)
                result.store = store
                return self._with_shadow(table, result, tx, store)
        else:
            self.metrics.dependency_error("scorer", "no_budget")
        decision = decide(verdict.score, self.rules.review, self.rules.decline)
        return ScoreResult(
            decision=decision,
            score=verdict.score,
            reasons=[
                *(rule_reasons or ["no rule fired"]),
                f"rules fallback: {fallback_reason}",
                *notes,
            ],
            model_version=f"rules-{self.rules.version}",
            scored_by=ScoredBy.RULES,
            feature_source=source,
            features=vector,
            feature_order=route.order,
            store=store,
        )

    async def _score_canary(
        self,
        table: RouteTable,
        route: ModelRoute,
        tx: Transaction,
        store: Mapping[str, float | None],
        source: Source,
        notes: list[str],
        budget: Budget,
    ) -> ScoreResult | None:
        """The canary's answer, or None when it cannot give one (live answers then)."""
        breaker, watch = table.canary_breaker, table.watch
        timeout = min(budget.scorer_timeout(), self.canary_cap_s)
        if breaker is None or timeout <= 0:
            return None
        vector = route.vector(tx, store)
        started = time.perf_counter()
        try:
            score = await guarded(breaker, lambda: route.client.score(vector, timeout))
        except DependencyError as error:
            self.metrics.dependency_error("scorer-canary", error.reason)
            if watch is not None:
                # A refusal by the canary's open breaker counts as a failure too: it only
                # opens on failures, and the watch must still reach its verdict.
                opened = error.reason == "breaker_open"
                watch.record(
                    Arm.CANARY, False, 0.0 if opened else time.perf_counter() - started, False
                )
            return None
        elapsed = time.perf_counter() - started
        named = dict(zip(route.order, vector, strict=True))
        rule_reasons = self.rules.evaluate(named).reasons(named)
        result = self._model_result(route, Arm.CANARY, score, rule_reasons, notes, source, vector)
        if watch is not None:
            watch.record(Arm.CANARY, True, elapsed, result.decision is Decision.DECLINE)
        return result

    def _model_result(
        self,
        route: ModelRoute,
        arm: Arm,
        score: float,
        rule_reasons: list[str],
        notes: list[str],
        source: Source,
        vector: list[float],
    ) -> ScoreResult:
        t = route.thresholds
        decision = decide(score, t.review, t.decline)
        key = (arm, route.version)
        counter = self._answer_counters.get(key)
        if counter is None:
            counter = self._answer_counters[key] = self.metrics.model_answers.labels(
                arm.value, route.version
            )
        counter.inc()
        return ScoreResult(
            decision=decision,
            score=score,
            reasons=[_model_reason(score, decision, t.review, t.decline), *rule_reasons, *notes],
            model_version=route.version,
            scored_by=ScoredBy.MODEL,
            feature_source=source,
            arm=arm,
            features=vector,
            feature_order=route.order,
        )

    def _with_shadow(
        self,
        table: RouteTable,
        result: ScoreResult,
        tx: Transaction,
        store: Mapping[str, float | None],
    ) -> ScoreResult:
        shadow = table.shadow
        if shadow is not None and self.shadow_queue is not None:
            result.shadow = ShadowJob(shadow, tx, store, result.score, result.decision)
        return result

    def after_answer(self, result: ScoreResult) -> None:
        """Hands the result's shadow job (if any) to the shadow workers; call it once the
        answer has been sent."""
        job, queue = result.shadow, self.shadow_queue
        if job is not None and queue is not None:
            queue.submit(job)


_REASON_TEXT = {
    "breaker_open": "circuit breaker open",
    "timeout": "timed out",
    "unavailable": "unavailable",
}

_SOURCE_NOTE = {
    Source.PARTIAL: "some features missing or stale: population defaults used for them",
    Source.DEFAULT: "no online features: population defaults used",
}


def _model_reason(score: float, decision: Decision, review: float, decline: float) -> str:
    if decision is Decision.DECLINE:
        return f"model score {score:.3f} >= decline threshold {decline:.3f}"
    if decision is Decision.REVIEW:
        return f"model score {score:.3f} >= review threshold {review:.3f}"
    return f"model score {score:.3f} < review threshold {review:.3f}"
