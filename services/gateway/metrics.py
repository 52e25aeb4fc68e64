"""Prometheus metrics of the gateway: latency, decisions, fallbacks, dependency errors, and
the model lifecycle (answers by version and route, the small model's first-stage and
fallback answers, canary rollbacks, shadow comparisons)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from services.common import metric_catalogue as catalogue
from services.gateway.breaker import State


class GatewayMetrics:
    """The gateway's metric families (declared in the catalogue), created once per process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.latency = catalogue.SCORE_LATENCY.create(registry)
        self.decisions = catalogue.DECISIONS.create(registry)
        self.scores = catalogue.SCORE.create(registry)
        self.dependency_errors = catalogue.DEPENDENCY_ERRORS.create(registry)
        self.invalid = catalogue.INVALID_REQUESTS.create(registry)

        self.breaker_state = catalogue.BREAKER_STATE.create(registry)
        self.breaker_transitions = catalogue.BREAKER_TRANSITIONS.create(registry)
        self.shed = catalogue.SHED.create(registry)
        self.outcomes = catalogue.OUTCOMES.create(registry)
        self.emit_errors = catalogue.EVENT_EMIT_ERRORS.create(registry)
        self.journal_sync_late = catalogue.JOURNAL_SYNC_LATE.create(registry)
        self.in_flight = catalogue.IN_FLIGHT.create(registry)

        self.model_answers = catalogue.MODEL_ANSWERS.create(registry)
        self.small_model_answers = catalogue.SMALL_MODEL_ANSWERS.create(registry)
        self.model_reasons = catalogue.MODEL_REASONS.create(registry)
        self.routing_generation = catalogue.ROUTING_GENERATION.create(registry)
        self.canary_percent = catalogue.CANARY_PERCENT.create(registry)
        self.canary_breaches = catalogue.CANARY_BREACHES.create(registry)
        self.canary_rollbacks = catalogue.CANARY_ROLLBACKS.create(registry)
        self.shadow_latency = catalogue.SHADOW_LATENCY.create(registry)
        self.shadow_score_diff = catalogue.SHADOW_SCORE_DIFF.create(registry)
        self.shadow_decisions = catalogue.SHADOW_DECISIONS.create(registry)
        self.shadow_errors = catalogue.SHADOW_ERRORS.create(registry)
        self.shadow_dropped = catalogue.SHADOW_DROPPED.create(registry)

        self.stream_open = catalogue.STREAM_OPEN.create(registry)
        self.stream_reconnects = catalogue.STREAM_RECONNECTS.create(registry)
        self.stream_resets = catalogue.STREAM_RESETS.create(registry)
        self.stream_late_replies = catalogue.STREAM_LATE_REPLIES.create(registry)
        self.stream_batch_rows = catalogue.STREAM_BATCH_ROWS.create(registry)
        self.stream_holds = catalogue.STREAM_HOLDS.create(registry)

    def breaker_transition(self, dependency: str, old: State, new: State) -> None:
        """Records a breaker state change."""
        self.breaker_state.labels(dependency).set(_STATE_VALUE.get(new, 2))
        self.breaker_transitions.labels(dependency, new.value).inc()

    def dependency_error(self, dependency: str, reason: str) -> None:
        """Counts one failed or skipped downstream call."""
        self.dependency_errors.labels(dependency, reason).inc()


_STATE_VALUE = {State.CLOSED: 0, State.DISABLED: 0, State.HALF_OPEN: 1, State.OPEN: 2}
