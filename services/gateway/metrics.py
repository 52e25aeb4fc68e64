"""Prometheus metrics of the gateway: latency, decisions, fallbacks, dependency errors, and
the model lifecycle (answers by version and route, canary rollbacks, shadow comparisons)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from services.gateway.breaker import State

# Buckets resolve the 42 ms budget finely where the p99 lives.
_LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.042,
    0.05,
    0.1,
    0.25,
)
_SCORE_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
# Shadow score minus the answer's score: fine near zero, where agreeing versions land.
_DIFF_BUCKETS = (
    -0.5,
    -0.2,
    -0.1,
    -0.05,
    -0.02,
    -0.01,
    -0.001,
    0.001,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
)


class GatewayMetrics:
    """The gateway's metric families, created once per process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.latency = Histogram(
            "fraudmesh_score_latency_seconds",
            "Time from request to answer inside the gateway.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            "fraudmesh_decisions_total",
            "Answers by decision, engine and feature source.",
            ["decision", "scored_by", "feature_source"],
            registry=registry,
        )
        self.scores = Histogram(
            "fraudmesh_score",
            "Distribution of returned scores (drift watch).",
            ["scored_by"],
            buckets=_SCORE_BUCKETS,
            registry=registry,
        )
        self.dependency_errors = Counter(
            "fraudmesh_dependency_errors_total",
            "Downstream calls that failed or were skipped, by dependency and reason.",
            ["dependency", "reason"],
            registry=registry,
        )
        self.invalid = Counter(
            "fraudmesh_invalid_requests_total",
            "Requests rejected as invalid, by field.",
            ["field"],
            registry=registry,
        )

        self.breaker_state = Gauge(
            "fraudmesh_breaker_state",
            "Circuit breaker state per dependency: 0 closed, 1 half-open, 2 open.",
            ["dependency"],
            registry=registry,
        )
        self.breaker_transitions = Counter(
            "fraudmesh_breaker_transitions_total",
            "Circuit breaker state changes, by dependency and new state.",
            ["dependency", "to"],
            registry=registry,
        )
        self.shed = Counter(
            "fraudmesh_shed_total",
            "Score calls rejected with RESOURCE_EXHAUSTED at the concurrency limit.",
            registry=registry,
        )
        self.outcomes = Counter(
            "fraudmesh_outcomes_total",
            "Outcome reports accepted, by outcome and source.",
            ["outcome", "source"],
            registry=registry,
        )
        self.emit_errors = Counter(
            "fraudmesh_event_emit_errors_total",
            "Decision or outcome events that could not be handed to the event log, by kind.",
            ["kind"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "fraudmesh_in_flight", "Score calls being handled now.", registry=registry
        )

        self.model_answers = Counter(
            "fraudmesh_model_answers_total",
            "Answers given by a model, by route (live, canary) and model version.",
            ["route", "model_version"],
            registry=registry,
        )
        self.routing_generation = Gauge(
            "fraudmesh_routing_generation",
            "Generation of the lifecycle file the gateway routes by.",
            registry=registry,
        )
        self.canary_percent = Gauge(
            "fraudmesh_canary_percent",
            "Share of cards routed to the canary (0 without a canary).",
            registry=registry,
        )
        self.canary_breaches = Counter(
            "fraudmesh_canary_breaches_total",
            "Canaries this gateway found beyond their limits, by version.",
            ["model_version"],
            registry=registry,
        )
        self.canary_rollbacks = Counter(
            "fraudmesh_canary_rollbacks_total",
            "Automatic rollbacks this gateway wrote (at most one gateway writes each).",
            ["model_version"],
            registry=registry,
        )
        self.shadow_latency = Histogram(
            "fraudmesh_shadow_latency_seconds",
            "Time the shadow version took to score, by version.",
            ["model_version"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.shadow_score_diff = Histogram(
            "fraudmesh_shadow_score_diff",
            "Shadow score minus the answer's score, by shadow version.",
            ["model_version"],
            buckets=_DIFF_BUCKETS,
            registry=registry,
        )
        self.shadow_decisions = Counter(
            "fraudmesh_shadow_decisions_total",
            "Shadow comparisons by shadow version, the answer's decision and the shadow's.",
            ["model_version", "answer", "shadow"],
            registry=registry,
        )
        self.shadow_errors = Counter(
            "fraudmesh_shadow_errors_total",
            "Shadow scorings that failed, by version and reason.",
            ["model_version", "reason"],
            registry=registry,
        )
        self.shadow_dropped = Counter(
            "fraudmesh_shadow_dropped_total",
            "Shadow scorings dropped because the shadow queue was full.",
            registry=registry,
        )

        self.stream_open = Gauge(
            "fraudmesh_stream_open",
            "Persistent streams open to a dependency now.",
            ["dependency"],
            registry=registry,
        )
        self.stream_reconnects = Counter(
            "fraudmesh_stream_reconnects_total",
            "Persistent streams that ended and were reopened, by why they ended.",
            ["dependency", "reason"],
            registry=registry,
        )
        self.stream_resets = Counter(
            "fraudmesh_stream_resets_total",
            "Persistent streams the gateway reset itself (e.g. stalled: no replies).",
            ["dependency", "reason"],
            registry=registry,
        )
        self.stream_late_replies = Counter(
            "fraudmesh_stream_late_replies_total",
            "Stream replies that came after their request's deadline, dropped.",
            ["dependency"],
            registry=registry,
        )
        self.stream_batch_rows = Histogram(
            "fraudmesh_stream_batch_rows",
            "Requests carried by one stream message (1 unless batching coalesced several).",
            ["dependency"],
            buckets=(1, 2, 4, 8, 16, 32),
            registry=registry,
        )
        self.stream_holds = Counter(
            "fraudmesh_stream_holds_total",
            "Stream messages held back for others to join (the max queue delay applied).",
            ["dependency"],
            registry=registry,
        )

    def breaker_transition(self, dependency: str, old: State, new: State) -> None:
        """Records a breaker state change."""
        self.breaker_state.labels(dependency).set(_STATE_VALUE.get(new, 2))
        self.breaker_transitions.labels(dependency, new.value).inc()

    def dependency_error(self, dependency: str, reason: str) -> None:
        """Counts one failed or skipped downstream call."""
        self.dependency_errors.labels(dependency, reason).inc()


_STATE_VALUE = {State.CLOSED: 0, State.DISABLED: 0, State.HALF_OPEN: 1, State.OPEN: 2}
