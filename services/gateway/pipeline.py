"""The scoring pipeline: features, then model, then decision, each inside the budget.

Transport-free: the feature and model clients are injected, so the pipeline is tested
without servers. Whatever fails behind it, ``score`` returns an on-time result.

Which model version answers comes from the route table (``routing.py``), swapped whole
when the lifecycle changes: the live version, or the canary for its share of cards. The
version that answers brings its own defaults and thresholds. A canary call gets a shorter
slice of the budget and its own breaker; if it fails, the live version answers (the rules
only when live cannot too), and the canary watch counts the failure. With a shadow version
routed, a model answer carries a shadow job, scored once the answer has been sent.

A version with a small model (run in this process) uses it twice. With the cascade on, it
is the first stage: below the version's clear-approve threshold the answer is APPROVE
without the model call (``ScoredBy.FIRST_STAGE``, a full-quality answer). And when the model
cannot answer (failing, slow, breaker open, too little budget left), it answers alone with
its own thresholds (``ScoredBy.SMALL_MODEL``); the rules answer only when it cannot either.
"""

from __future__ import annotations

import asyncio
import enum
import logging
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
    SmallModelClient,
)
from services.gateway.routing import ModelRoute, RouteTable
from services.gateway.shadow import ShadowJob, ShadowQueue, ShadowResult
from services.gateway.validate import Transaction
from services.models.repository import ModelMetadata

log = logging.getLogger(__name__)

__all__ = [
    "CANARY_CAP_S",
    "CASCADE",
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


CASCADE = True
"""Whether the small model's first stage approves clear cases by default: on, as its quality
on the test period allows it (docs/cascade.md)."""


class ScoredBy(enum.Enum):
    """Which engine produced the score."""

    MODEL = "model"
    RULES = "rules"
    FIRST_STAGE = "first_stage"
    """The cascade's first stage: the small model's clear approval, without the model call."""
    SMALL_MODEL = "small_model"
    """The small model alone, because the model could not answer."""


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
    canary_failed: str = ""
    """The canary version this card was routed to when the canary could not answer (live or
    the rules answered instead); empty otherwise."""
    canary_timed_out: bool = False
    """True when that canary ran out of time rather than failed."""
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
        small: SmallModelClient | None = None,
        cascade: bool = CASCADE,
    ) -> None:
        self.routes = RouteTable(live=ModelRoute(metadata, model, small))
        """What answers now; replaced whole when the lifecycle changes."""
        self.cascade = cascade
        """Whether a routed version's small model approves clear cases first."""
        self.features_breaker = features_breaker
        self.scorer_breaker = scorer_breaker
        self.rules = rules
        self.features = features
        self.metrics = metrics
        self.canary_cap_s = canary_cap_s
        self.scorer_suspect = False
        """The live model's last call timed out and none has answered since: its next calls
        get ``BudgetPolicy.scorer_suspect_cap_s`` where a small model can answer instead."""
        self.shadow_queue = shadow_queue
        """Where shadow jobs go after the answer (``ShadowScorer`` scores them); None scores
        no shadow."""
        self._store_names = featurespec.STORE_FEATURES
        # A payment that names no terminal expects none of the terminal's features.
        self._named_store = featurespec.CARD_FEATURES + featurespec.MERCHANT_FEATURES
        self._answer_counters: dict[tuple[Arm, str], Any] = {}
        self._small_counters: dict[tuple[Arm, str, str], Any] = {}
        self._small_failed: set[str] = set()

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
        failed: tuple[str, bool] | None = None
        if arm is Arm.CANARY:
            answered = await self._score_canary(table, route, tx, store, source, notes, budget)
            if isinstance(answered, ScoreResult):
                answered.store = store
                return self._with_shadow(table, answered, tx, store)
            failed = answered
            route = table.live
        result = await self._score_live(table, route, tx, store, source, notes, budget)
        if failed is not None:
            # The event says the canary failed this card, so one process watching every
            # gateway's events can judge the canary's error and timeout rates.
            result.canary_failed, result.canary_timed_out = failed
        return result

    async def _score_live(
        self,
        table: RouteTable,
        route: ModelRoute,
        tx: Transaction,
        store: Mapping[str, float | None],
        source: Source,
        notes: list[str],
        budget: Budget,
    ) -> ScoreResult:
        """Live's answer, or the rules' when the model cannot give one in time."""
        vector = route.vector(tx, store)
        small_score = None
        small_tried = False
        if self.cascade and route.small is not None:
            small_score, small_tried = self._small_score(route, vector), True
            if small_score is not None and small_score < route.clear_approve:
                first = self._first_stage(route, Arm.LIVE, small_score, notes, source, vector)
                if table.watch is not None:
                    table.watch.record(Arm.LIVE, True, None, False)
                return self._with_shadow(table, first, tx, store)
        named = dict(zip(route.order, vector, strict=True))
        verdict = self.rules.evaluate(named)
        rule_reasons = verdict.reasons(named)

        timeout = budget.scorer_timeout(suspect=self.scorer_suspect and route.small is not None)
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
                if error.reason == "timeout":
                    self.scorer_suspect = True
                fallback_reason = f"model {_REASON_TEXT.get(error.reason, error.reason)}"
                if watch is not None and error.reason != "breaker_open":
                    watch.record(Arm.LIVE, False, time.perf_counter() - started, False)
            else:
                self.scorer_suspect = False
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
        if route.small is not None:
            if not small_tried:
                small_score = self._small_score(route, vector)
            if small_score is not None:
                return self._small_alone(
                    route, small_score, rule_reasons, fallback_reason, notes, source, vector
                )
            fallback_reason += "; small model failed"
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

    def _small_score(self, route: ModelRoute, vector: list[float]) -> float | None:
        """The route's small-model score of ``vector``; None (counted, logged) when it fails."""
        small = route.small
        assert small is not None
        try:
            return small.score(vector)
        except Exception:
            self.metrics.dependency_error("small-model", "error")
            # Once per version: a broken model would fail every call.
            if route.version not in self._small_failed:
                self._small_failed.add(route.version)
                log.exception("small model failed", extra={"version": route.version})
            return None

    def _first_stage(
        self,
        route: ModelRoute,
        arm: Arm,
        score: float,
        notes: list[str],
        source: Source,
        vector: list[float],
    ) -> ScoreResult:
        """The cascade's clear approval: the small model's score, below the clear-approve
        threshold (itself never above the version's review threshold)."""
        self._count_small(arm, route.version, "first_stage")
        return ScoreResult(
            decision=Decision.APPROVE,
            score=score,
            reasons=[
                f"small model score {score:.3f} < clear-approve threshold "
                f"{route.clear_approve:.3f}: approved at the first stage",
                *notes,
            ],
            model_version=route.version,
            scored_by=ScoredBy.FIRST_STAGE,
            feature_source=source,
            arm=arm,
            features=vector,
            feature_order=route.order,
        )

    def _small_alone(
        self,
        route: ModelRoute,
        score: float,
        rule_reasons: list[str],
        fallback_reason: str,
        notes: list[str],
        source: Source,
        vector: list[float],
    ) -> ScoreResult:
        """The small model's answer with its own thresholds, the model having failed."""
        t = route.small_thresholds
        assert t is not None
        decision = decide(score, t.review, t.decline)
        self._count_small(Arm.LIVE, route.version, "fallback")
        return ScoreResult(
            decision=decision,
            score=score,
            reasons=[
                _model_reason(score, decision, t.review, t.decline, "small model"),
                *rule_reasons,
                f"small model fallback: {fallback_reason}",
                *notes,
            ],
            model_version=route.version,
            scored_by=ScoredBy.SMALL_MODEL,
            feature_source=source,
            features=vector,
            feature_order=route.order,
        )

    def _count_small(self, arm: Arm, version: str, role: str) -> None:
        key = (arm, version, role)
        counter = self._small_counters.get(key)
        if counter is None:
            counter = self._small_counters[key] = self.metrics.small_model_answers.labels(
                arm.value, version, role
            )
        counter.inc()

    async def _score_canary(
        self,
        table: RouteTable,
        route: ModelRoute,
        tx: Transaction,
        store: Mapping[str, float | None],
        source: Source,
        notes: list[str],
        budget: Budget,
    ) -> ScoreResult | tuple[str, bool] | None:
        """The canary's answer; when it cannot give one (live answers then), its version and
        whether it ran out of time, or None when it was not asked (no budget left)."""
        breaker, watch = table.canary_breaker, table.watch
        vector = route.vector(tx, store)
        if self.cascade and route.small is not None:
            small_score = self._small_score(route, vector)
            if small_score is not None and small_score < route.clear_approve:
                if watch is not None:
                    watch.record(Arm.CANARY, True, None, False)
                return self._first_stage(route, Arm.CANARY, small_score, notes, source, vector)
        timeout = min(budget.scorer_timeout(), self.canary_cap_s)
        if breaker is None or timeout <= 0:
            return None
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
            return route.version, error.reason == "timeout"
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


def _model_reason(
    score: float, decision: Decision, review: float, decline: float, engine: str = "model"
) -> str:
    if decision is Decision.DECLINE:
        return f"{engine} score {score:.3f} >= decline threshold {decline:.3f}"
    if decision is Decision.REVIEW:
        return f"{engine} score {score:.3f} >= review threshold {review:.3f}"
    return f"{engine} score {score:.3f} < review threshold {review:.3f}"
