"""The scoring pipeline: features, then model, then decision, each inside the budget.

Transport-free: the feature and model clients are injected, so the pipeline is tested
without servers. Whatever fails behind it, ``score`` returns an on-time outcome.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from services.domain import featurespec
from services.domain.rules import RulesEngine
from services.gateway.breaker import CircuitBreaker
from services.gateway.budget import Budget
from services.gateway.metrics import GatewayMetrics
from services.gateway.validate import Transaction
from services.models.repository import ModelMetadata


class Decision(enum.Enum):
    """What the payment system should do."""

    APPROVE = "approve"
    REVIEW = "review"
    DECLINE = "decline"


class ScoredBy(enum.Enum):
    """Which engine produced the score."""

    MODEL = "model"
    RULES = "rules"


class Source(enum.Enum):
    """Where the features came from."""

    ONLINE = "online"
    PARTIAL = "partial"
    DEFAULT = "default"


class DependencyError(Exception):
    """A downstream call failed; ``reason`` is a short label (timeout, unavailable, …)."""

    def __init__(self, dependency: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{dependency}: {reason} {detail}".strip())
        self.dependency = dependency
        self.reason = reason


T = TypeVar("T")


async def guarded(breaker: CircuitBreaker, call: Callable[[], Awaitable[T]]) -> T:
    """Runs ``call`` under ``breaker``: refused while open, outcome and duration recorded."""
    if not breaker.try_acquire():
        raise DependencyError(breaker.name, "breaker_open")
    start = time.perf_counter()
    try:
        result = await call()
    except DependencyError:
        breaker.on_error(time.perf_counter() - start)
        raise
    except asyncio.CancelledError:
        # The caller went away: no outcome to judge the dependency by.
        breaker.release()
        raise
    breaker.on_success(time.perf_counter() - start)
    return result


class FeatureClient(Protocol):
    """Reads store features; None marks a missing or stale value."""

    async def get(
        self, card_id: str, merchant_id: str, as_of_s: float, timeout_s: float
    ) -> Mapping[str, float | None]:
        """Raises DependencyError when the feature service cannot answer in time."""
        ...


class ModelClient(Protocol):
    """Scores one model feature vector."""

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability; raises DependencyError when the model cannot answer in time."""
        ...


@dataclass(slots=True)
class Outcome:
    """The decision and how it was reached."""

    decision: Decision
    score: float
    reasons: list[str] = field(default_factory=list)
    model_version: str = ""
    scored_by: ScoredBy = ScoredBy.MODEL
    feature_source: Source = Source.ONLINE
    features: list[float] = field(default_factory=list)
    """The model input the score was computed from (``metadata.feature_order``)."""


def _decide(score: float, review: float, decline: float) -> Decision:
    if score >= decline:
        return Decision.DECLINE
    if score >= review:
        return Decision.REVIEW
    return Decision.APPROVE


class Pipeline:
    """Scores validated transactions with the model, falling back to defaults and rules."""

    def __init__(
        self,
        metadata: ModelMetadata,
        rules: RulesEngine,
        features: FeatureClient,
        model: ModelClient,
        metrics: GatewayMetrics,
        features_breaker: CircuitBreaker,
        scorer_breaker: CircuitBreaker,
    ) -> None:
        self.metadata = metadata
        self.features_breaker = features_breaker
        self.scorer_breaker = scorer_breaker
        self.rules = rules
        self.features = features
        self.model = model
        self.metrics = metrics
        self._order = tuple(metadata.feature_order)
        self._defaults = dict(metadata.default_features)
        self._store_names = featurespec.STORE_FEATURES

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
                lambda: self.features.get(tx.card_id, tx.merchant_id, tx.timestamp_s, timeout),
            )
        except DependencyError as error:
            self.metrics.dependency_error("features", error.reason)
            return {}, Source.DEFAULT
        missing = sum(1 for name in self._store_names if store.get(name) is None)
        if missing == 0:
            return store, Source.ONLINE
        if missing == len(self._store_names):
            return store, Source.DEFAULT
        return store, Source.PARTIAL

    async def score(self, tx: Transaction, budget: Budget) -> Outcome:
        """Scores ``tx``; always returns before the budget's reserve is spent."""
        store, source = await self._read_features(tx, budget)
        vector = featurespec.model_vector(
            store,
            amount_minor=tx.amount_minor,
            currency=tx.currency,
            timestamp_s=tx.timestamp_s,
            card_not_present=tx.card_not_present,
            defaults=self._defaults,
        )
        named = dict(zip(self._order, vector, strict=True))
        verdict = self.rules.evaluate(named)
        rule_reasons = verdict.reasons(named)
        notes = [] if source is Source.ONLINE else [_SOURCE_NOTE[source]]

        timeout = budget.scorer_timeout()
        fallback_reason = "too little budget left for the model"
        if timeout > 0:
            try:
                score = await guarded(
                    self.scorer_breaker, lambda: self.model.score(vector, timeout)
                )
            except DependencyError as error:
                self.metrics.dependency_error("scorer", error.reason)
                fallback_reason = f"model {_REASON_TEXT.get(error.reason, error.reason)}"
            else:
                t = self.metadata.thresholds
                decision = _decide(score, t.review, t.decline)
                return Outcome(
                    decision=decision,
                    score=score,
                    reasons=[
                        _model_reason(score, decision, t.review, t.decline),
                        *rule_reasons,
                        *notes,
                    ],
                    model_version=self.metadata.version,
                    scored_by=ScoredBy.MODEL,
                    feature_source=source,
                    features=vector,
                )
        else:
            self.metrics.dependency_error("scorer", "no_budget")
        decision = _decide(verdict.score, self.rules.review, self.rules.decline)
        return Outcome(
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
        )


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
