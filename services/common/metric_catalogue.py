"""Every Prometheus metric fraudmesh exports, declared once: name, type, help, label names
and, for histograms, the buckets.

The services build their families from these declarations (``DECISIONS.create(registry)``)
and the benchmarks and tests name metrics by the same constants, so a metric's name is
written once; alert rules and dashboards can be generated from it. ``CATALOGUE`` lists every
metric, ``of_component`` those of one exporter, ``by_name`` finds one.

Names are as queried: a counter's ends in ``_total`` (the exposition's family name drops it,
see ``MetricSpec.family``); a histogram's samples add ``_bucket``, ``_count`` and ``_sum``.

Who exports what: the gateway its own families and the event log producer's; the updater and
the decision sink theirs; every process with a metrics port the client library's process and
garbage-collector families (the feature service and the scorer export only those so far).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

Component = Literal[
    "gateway", "features", "eventlog", "decisionlog", "updater", "monitor", "server", "process"
]
"""Who exports a metric: a service, the event log producer (inside each process that emits
events), every gRPC server process (the shared runtime's own families), or every process
(the client library's own collectors)."""
Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.00175, 0.002,
                   0.0025, 0.003, 0.0035, 0.004, 0.0045, 0.005, 0.006, 0.007, 0.008, 0.009,
                   0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.042, 0.05, 0.075,
                   0.1, 0.25, 0.5, 1.0)  # fmt: skip
"""Seconds; steps of at most 25 % between 1 and 50 ms, so ``histogram_quantile(0.999, …)``
interpolates inside a narrow bucket wherever a hop's tail lives; 42 ms (the budget) is a
bound, so the share of on-time answers is one bucket's count."""
GC_PAUSE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                    0.1, 0.25)  # fmt: skip
"""Seconds one garbage collection held the interpreter."""
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Seconds the event loop started a timer late."""
ROW_AGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400,
                   604800)  # fmt: skip
"""Seconds from a feature row's event time to the lookup that used it: live rows are
sub-second, materialized ones hours or days."""
SCORE_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
"""Scores in 0..1."""
SCORE_DIFF_BUCKETS = (-0.5, -0.2, -0.1, -0.05, -0.02, -0.01, -0.001, 0.001, 0.01, 0.02, 0.05,
                      0.1, 0.2, 0.5)  # fmt: skip
"""Shadow score minus the answer's score: fine near zero, where agreeing versions land."""
BATCH_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32)
"""Requests carried by one stream message."""
FRESHNESS_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.06,
                     0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)  # fmt: skip
"""Seconds; fine steps up to the 50 ms freshness target, coarse beyond it."""
FLUSH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Seconds one decision-log flush takes."""
WRITE_DELAY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 30, 60, 300, 3600)
"""Seconds from an event to its durable row."""
DEFAULT_BUCKETS = tuple(b for b in Histogram.DEFAULT_BUCKETS if b != float("inf"))
"""The client library's default buckets (seconds, 5 ms to 10 s)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what it is called, what it means, how it is labelled, who exports it."""

    name: str
    """The name as queried (a counter's ends in ``_total``)."""
    help: str
    component: Component
    labels: tuple[str, ...] = ()

    @property
    def kind(self) -> Kind:
        """Counter, gauge or histogram."""
        raise NotImplementedError

    @property
    def family(self) -> str:
        """The family name a parsed exposition gives (a counter's without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


@dataclass(frozen=True)
class CounterSpec(MetricSpec):
    """A counter."""

    @property
    def kind(self) -> Kind:
        """Always ``counter``."""
        return "counter"

    def create(self, registry: CollectorRegistry) -> Counter:
        """The counter, registered on ``registry``."""
        return Counter(self.name, self.help, self.labels, registry=registry)


@dataclass(frozen=True)
class GaugeSpec(MetricSpec):
    """A gauge."""

    @property
    def kind(self) -> Kind:
        """Always ``gauge``."""
        return "gauge"

    def create(self, registry: CollectorRegistry) -> Gauge:
        """The gauge, registered on ``registry``."""
        return Gauge(self.name, self.help, self.labels, registry=registry)


@dataclass(frozen=True)
class HistogramSpec(MetricSpec):
    """A histogram with classic buckets (upper bounds; +Inf is implied)."""

    buckets: tuple[float, ...] = DEFAULT_BUCKETS

    @property
    def kind(self) -> Kind:
        """Always ``histogram``."""
        return "histogram"

    @property
    def bucket(self) -> str:
        """The sample name of its buckets."""
        return f"{self.name}_bucket"

    @property
    def count(self) -> str:
        """The sample name of its observation count."""
        return f"{self.name}_count"

    @property
    def sum(self) -> str:
        """The sample name of its observations' sum."""
        return f"{self.name}_sum"

    def create(self, registry: CollectorRegistry) -> Histogram:
        """The histogram, registered on ``registry``."""
        return Histogram(self.name, self.help, self.labels, buckets=self.buckets, registry=registry)


@dataclass(frozen=True)
class ProvidedSpec(MetricSpec):
    """A metric the client library's default collectors export in every process (declared
    here so rules and dashboards can name it; nothing of ours creates it)."""

    provided_kind: Kind = "gauge"

    @property
    def kind(self) -> Kind:
        """What the library exports it as."""
        return self.provided_kind


_declared: list[MetricSpec] = []


def _counter(
    name: str, help: str, component: Component, labels: tuple[str, ...] = ()
) -> CounterSpec:
    spec = CounterSpec(name, help, component, labels)
    _declared.append(spec)
    return spec


def _gauge(name: str, help: str, component: Component, labels: tuple[str, ...] = ()) -> GaugeSpec:
    spec = GaugeSpec(name, help, component, labels)
    _declared.append(spec)
    return spec


def _histogram(
    name: str,
    help: str,
    component: Component,
    labels: tuple[str, ...] = (),
    *,
    buckets: tuple[float, ...] = DEFAULT_BUCKETS,
) -> HistogramSpec:
    spec = HistogramSpec(name, help, component, labels, buckets)
    _declared.append(spec)
    return spec


def _provided(
    name: str, help: str, labels: tuple[str, ...] = (), kind: Kind = "gauge"
) -> ProvidedSpec:
    spec = ProvidedSpec(name, help, "process", labels, kind)
    _declared.append(spec)
    return spec


# The gateway: answers, their latency and sources, dependencies, the model lifecycle, streams.
SCORE_LATENCY = _histogram(
    "fraudmesh_score_latency_seconds", "Time from request to answer inside the gateway.",
    "gateway", buckets=LATENCY_BUCKETS,
)  # fmt: skip
DECISIONS = _counter(
    "fraudmesh_decisions_total",
    "Answers by decision, engine (model, first_stage, small_model, rules) and feature source.",
    "gateway", ("decision", "scored_by", "feature_source"),
)  # fmt: skip
SCORE = _histogram(
    "fraudmesh_score", "Distribution of returned scores (drift watch).",
    "gateway", ("scored_by",), buckets=SCORE_BUCKETS,
)  # fmt: skip
DEPENDENCY_ERRORS = _counter(
    "fraudmesh_dependency_errors_total",
    "Downstream calls that failed or were skipped, by dependency and reason.",
    "gateway", ("dependency", "reason"),
)  # fmt: skip
INVALID_REQUESTS = _counter(
    "fraudmesh_invalid_requests_total", "Requests rejected as invalid, by field.",
    "gateway", ("field",),
)  # fmt: skip
BREAKER_STATE = _gauge(
    "fraudmesh_breaker_state",
    "Circuit breaker state per dependency: 0 closed, 1 half-open, 2 open.",
    "gateway", ("dependency",),
)  # fmt: skip
BREAKER_TRANSITIONS = _counter(
    "fraudmesh_breaker_transitions_total",
    "Circuit breaker state changes, by dependency and new state.",
    "gateway", ("dependency", "to"),
)  # fmt: skip
SHED = _counter(
    "fraudmesh_shed_total",
    "Score calls rejected with RESOURCE_EXHAUSTED at the concurrency limit.",
    "gateway",
)  # fmt: skip
OUTCOMES = _counter(
    "fraudmesh_outcomes_total", "Outcome reports accepted, by outcome and source.",
    "gateway", ("outcome", "source"),
)  # fmt: skip
EVENT_EMIT_ERRORS = _counter(
    "fraudmesh_event_emit_errors_total",
    "Decision or outcome events that could not be handed to the event log, by kind.",
    "gateway", ("kind",),
)  # fmt: skip
JOURNAL_SYNC_LATE = _counter(
    "fraudmesh_journal_sync_late_total",
    "Score answers sent before the fsync of their decision event completed "
    "(FRAUD_GATEWAY_JOURNAL=fsync): the budget ran out first.",
    "gateway",
)  # fmt: skip
IN_FLIGHT = _gauge(
    "fraudmesh_in_flight", "Score calls being handled now.", "gateway",
)  # fmt: skip
MODEL_ANSWERS = _counter(
    "fraudmesh_model_answers_total",
    "Answers given by a model, by route (live, canary) and model version.",
    "gateway", ("route", "model_version"),
)  # fmt: skip
SMALL_MODEL_ANSWERS = _counter(
    "fraudmesh_small_model_answers_total",
    "Answers given by a version's small model, by route, model version and role "
    "(first_stage: a clear approval of the cascade; fallback: the full model could not answer).",
    "gateway", ("route", "model_version", "role"),
)  # fmt: skip
MODEL_REASONS = _counter("fraudmesh_model_reasons_total", "The model's own reasons for "
    "REVIEW and DECLINE answers by outcome: given, or no_budget/busy/timeout/error/mismatch.",
    "gateway", ("outcome",))  # fmt: skip
ROUTING_GENERATION = _gauge("fraudmesh_routing_generation",
    "Generation of the lifecycle file the gateway routes by.", "gateway")  # fmt: skip
CANARY_PERCENT = _gauge("fraudmesh_canary_percent",
    "Share of cards routed to the canary (0 without a canary).", "gateway")  # fmt: skip
CANARY_BREACHES = _counter(
    "fraudmesh_canary_breaches_total",
    "Canaries this gateway found beyond their limits, by version.",
    "gateway", ("model_version",),
)  # fmt: skip
CANARY_ROLLBACKS = _counter(
    "fraudmesh_canary_rollbacks_total",
    "Automatic rollbacks this gateway wrote (at most one gateway writes each).",
    "gateway", ("model_version",),
)  # fmt: skip
SHADOW_LATENCY = _histogram(
    "fraudmesh_shadow_latency_seconds", "Time the shadow version took to score, by version.",
    "gateway", ("model_version",), buckets=LATENCY_BUCKETS,
)  # fmt: skip
SHADOW_SCORE_DIFF = _histogram(
    "fraudmesh_shadow_score_diff", "Shadow score minus the answer's score, by shadow version.",
    "gateway", ("model_version",), buckets=SCORE_DIFF_BUCKETS,
)  # fmt: skip
SHADOW_DECISIONS = _counter(
    "fraudmesh_shadow_decisions_total",
    "Shadow comparisons by shadow version, the answer's decision and the shadow's.",
    "gateway", ("model_version", "answer", "shadow"),
)  # fmt: skip
SHADOW_ERRORS = _counter(
    "fraudmesh_shadow_errors_total", "Shadow scorings that failed, by version and reason.",
    "gateway", ("model_version", "reason"),
)  # fmt: skip
SHADOW_DROPPED = _counter(
    "fraudmesh_shadow_dropped_total",
    "Shadow scorings dropped because the shadow queue was full.",
    "gateway",
)  # fmt: skip
STREAM_OPEN = _gauge(
    "fraudmesh_stream_open", "Persistent streams open to a dependency now.",
    "gateway", ("dependency",),
)  # fmt: skip
STREAM_RECONNECTS = _counter(
    "fraudmesh_stream_reconnects_total",
    "Persistent streams that ended and were reopened, by why they ended.",
    "gateway", ("dependency", "reason"),
)  # fmt: skip
STREAM_RESETS = _counter(
    "fraudmesh_stream_resets_total",
    "Persistent streams the gateway reset itself (e.g. stalled: no replies).",
    "gateway", ("dependency", "reason"),
)  # fmt: skip
STREAM_LATE_REPLIES = _counter(
    "fraudmesh_stream_late_replies_total",
    "Stream replies that came after their request's deadline, dropped.",
    "gateway", ("dependency",),
)  # fmt: skip
STREAM_BATCH_ROWS = _histogram(
    "fraudmesh_stream_batch_rows",
    "Requests carried by one stream message (1 unless batching coalesced several).",
    "gateway", ("dependency",), buckets=BATCH_ROWS_BUCKETS,
)  # fmt: skip
STREAM_HOLDS = _counter(
    "fraudmesh_stream_holds_total",
    "Stream messages held back for others to join (the max queue delay applied).",
    "gateway", ("dependency",),
)  # fmt: skip

# The feature service: the age of what a Score's lookup used.
FEATURE_ROW_AGE = _histogram(
    "fraudmesh_feature_row_age_seconds",
    "Per lookup: the lookup's point in time minus the event time of the oldest stored row "
    "it returned (lookups that found nothing are not observed).",
    "features", buckets=ROW_AGE_BUCKETS,
)  # fmt: skip
FEATURE_LOOKUPS_EMPTY = _counter(
    "fraudmesh_feature_lookups_empty_total",
    "Lookups for which the store held no row at all (every feature missing).",
    "features",
)  # fmt: skip

# Every gRPC server (the shared runtime): per-call latency, garbage collection, the loop.
RPC_SERVER_DURATION = _histogram(
    "fraudmesh_rpc_server_duration_seconds",
    "Server-side time of each call, by service, method and gRPC status; for a streamed "
    "method, each request message from its arrival to its reply.",
    "server", ("rpc_service", "rpc_method", "grpc_code"), buckets=LATENCY_BUCKETS,
)  # fmt: skip
GC_PAUSE = _histogram(
    "fraudmesh_gc_pause_seconds",
    "Time each garbage collection held the interpreter, by generation.",
    "server", ("generation",), buckets=GC_PAUSE_BUCKETS,
)  # fmt: skip
EVENT_LOOP_LAG = _histogram(
    "fraudmesh_event_loop_lag_seconds",
    "How late the event loop ran a periodic timer: time that every call waiting on the "
    "loop also waited.",
    "server", buckets=LOOP_LAG_BUCKETS,
)  # fmt: skip

# The event log producer, in every process that emits events (the gateway).
EVENTLOG_APPENDED = _counter(
    "fraudmesh_eventlog_appended_total", "Events handed to the event log producer.", "eventlog",
)  # fmt: skip
EVENTLOG_DELIVERED = _counter(
    "fraudmesh_eventlog_delivered_total",
    "Events stored by the event log backend (replays from spill files included).",
    "eventlog",
)  # fmt: skip
EVENTLOG_BUFFERED = _gauge(
    "fraudmesh_eventlog_buffered",
    "Events held in the producer's memory buffer, not yet delivered or spilled.",
    "eventlog",
)  # fmt: skip
EVENTLOG_SPILLED = _counter(
    "fraudmesh_eventlog_spilled_total",
    "Events written to a local spill file because the backend was down or slow.",
    "eventlog",
)  # fmt: skip
EVENTLOG_SPILL_PENDING = _gauge(
    "fraudmesh_eventlog_spill_pending", "Events in spill files waiting to be delivered.",
    "eventlog",
)  # fmt: skip
EVENTLOG_DROPPED = _counter(
    "fraudmesh_eventlog_dropped_total",
    "Events lost because the spill disk was full (or the spill cap reached).",
    "eventlog",
)  # fmt: skip
EVENTLOG_BACKEND_UP = _gauge(
    "fraudmesh_eventlog_backend_up",
    "1 while the last write to the event log backend succeeded, else 0.",
    "eventlog",
)  # fmt: skip

# The decision sink: events read, Parquet parts written, lag and flushes.
DECISIONLOG_EVENTS = _counter(
    "fraudmesh_decisionlog_events_total",
    "Records the sink read from the event log, by what it did with them: "
    "decision / outcome (gathered for writing), duplicate (already written), "
    "invalid (not a decodable event; logged and skipped).",
    "decisionlog", ("result",),
)  # fmt: skip
DECISIONLOG_EVENTS_WRITTEN = _counter(
    "fraudmesh_decisionlog_events_written_total",
    "Events durably written to Parquet parts, by table.",
    "decisionlog", ("table",),
)  # fmt: skip
DECISIONLOG_PARTS_WRITTEN = _counter(
    "fraudmesh_decisionlog_parts_written_total", "Parquet parts written, by table.",
    "decisionlog", ("table",),
)  # fmt: skip
DECISIONLOG_BYTES_WRITTEN = _counter(
    "fraudmesh_decisionlog_bytes_written_total", "Bytes of Parquet parts written.",
    "decisionlog",
)  # fmt: skip
DECISIONLOG_FLUSH_SECONDS = _histogram(
    "fraudmesh_decisionlog_flush_seconds",
    "Time to write one flush's parts durably (fsync, rename) and commit the log position.",
    "decisionlog", buckets=FLUSH_BUCKETS,
)  # fmt: skip
DECISIONLOG_WRITE_DELAY = _histogram(
    "fraudmesh_decisionlog_write_delay_seconds",
    "Per flush: from the event time (decided_at / received_at) of its oldest event to "
    "the moment that event was durable.",
    "decisionlog", buckets=WRITE_DELAY_BUCKETS,
)  # fmt: skip
DECISIONLOG_ERRORS = _counter(
    "fraudmesh_decisionlog_errors_total",
    "Failures the sink retried, by operation (poll, commit, write, connect).",
    "decisionlog", ("operation",),
)  # fmt: skip
DECISIONLOG_LAG = _gauge(
    "fraudmesh_decisionlog_lag_seconds",
    "Age of the newest event the last poll returned (0 after a poll found nothing new): "
    "how far behind the head of the log the sink reads.",
    "decisionlog",
)  # fmt: skip
DECISIONLOG_PENDING = _gauge(
    "fraudmesh_decisionlog_pending_events",
    "Events read from the log and not yet durable in a part.",
    "decisionlog",
)  # fmt: skip
DECISIONLOG_BACKEND_UP = _gauge(
    "fraudmesh_decisionlog_backend_up",
    "1 while the last call to the event log backend succeeded, else 0.",
    "decisionlog",
)  # fmt: skip
DECISIONLOG_CAUGHT_UP = _gauge(
    "fraudmesh_decisionlog_caught_up",
    "1 once a poll returned less than it asked for (the sink reads at the head of "
    "the log), else 0.",
    "decisionlog",
)  # fmt: skip
DECISIONLOG_LAST_FLUSH = _gauge(
    "fraudmesh_decisionlog_last_flush_timestamp_seconds",
    "Unix time of the last completed flush (parts durable and position committed).",
    "decisionlog",
)  # fmt: skip
DECISIONLOG_LAST_FLUSH_AGE = _gauge(
    "fraudmesh_decisionlog_last_flush_age_seconds",
    "Seconds since the last completed flush (since start before the first one). It also "
    "grows while no events come: alert on it together with pending_events > 0.",
    "decisionlog",
)  # fmt: skip

# The feature updater: records consumed, what they did to entity states, freshness, lag.
UPDATER_RECORDS = _counter(
    "fraudmesh_updater_records_total",
    "Records consumed from the event log, by kind (decision, outcome, list_change, invalid).",
    "updater", ("kind",),
)  # fmt: skip
UPDATER_CHANGES = _counter(
    "fraudmesh_updater_changes_total",
    "What events did to entity states, by view and change (applied, late, duplicate, "
    "too_old, pending).",
    "updater", ("view", "change"),
)  # fmt: skip
UPDATER_EVICTED_BY_CAP = _counter(
    "fraudmesh_updater_evicted_by_cap_total",
    "Events evicted from an entity state by its size cap (its windows undercount).",
    "updater", ("view",),
)  # fmt: skip
UPDATER_LABELS_DROPPED = _counter(
    "fraudmesh_updater_labels_dropped_total",
    "Held outcomes dropped: too many held, or too old to change any window.",
    "updater",
)  # fmt: skip
UPDATER_EVENT_TO_STORE = _histogram(
    "fraudmesh_updater_event_to_store_seconds",
    "From an event's creation at the gateway (decided_at / received_at) to its rows "
    "written to the online store.",
    "updater", buckets=FRESHNESS_BUCKETS,
)  # fmt: skip
FEATURE_FRESHNESS = _gauge(
    "fraudmesh_feature_freshness_seconds",
    "Age of the newest event applied to each view's online rows (now - its creation).",
    "updater", ("view",),
)  # fmt: skip
UPDATER_CONSUMER_LAG = _gauge(
    "fraudmesh_updater_consumer_lag_seconds",
    "How far behind the log the updater is: age of the last record of the latest poll "
    "when it returned a full batch or its records were old, 0 once a poll found the end.",
    "updater",
)  # fmt: skip
UPDATER_ERRORS = _counter(
    "fraudmesh_updater_errors_total",
    "Failures by what failed (log, online_store, state), each retried.",
    "updater", ("what",),
)  # fmt: skip
UPDATER_CHECKPOINT = _histogram(
    "fraudmesh_updater_checkpoint_seconds",
    "Duration of a checkpoint (states saved, then the log position committed).",
    "updater",
)  # fmt: skip
UPDATER_CACHED_ENTITIES = _gauge(
    "fraudmesh_updater_cached_entities", "Entity states held in memory, by view.",
    "updater", ("view",),
)  # fmt: skip
UPDATER_JOURNAL_EVENTS = _gauge(
    "fraudmesh_updater_journal_events",
    "Events in the state file's journal not yet covered by entity snapshots (applied "
    "again at start).",
    "updater",
)  # fmt: skip
UPDATER_PENDING_LABELS = _gauge(
    "fraudmesh_updater_pending_labels",
    "Outcomes held for transactions whose decision has not been consumed yet.",
    "updater",
)  # fmt: skip
UPDATER_PARTITIONS = _gauge("fraudmesh_updater_partitions",
    "Partitions a member of a partitioned updater group owns, by kind (cards, merchants).", "updater", ("kind",))  # fmt: skip
UPDATER_READY = _gauge(
    "fraudmesh_updater_ready",
    "1 while connected to the log and the store and caught up with the log.",
    "updater",
)  # fmt: skip

# The monitor: drift against each version's reference, live quality from outcomes, advice.
DRIFT_PSI = _gauge(
    "fraudmesh_drift_psi",
    "Population stability index of the rolling window against the version's reference, "
    "per feature and for the score (feature=\"score\"); NaN below the minimum decisions. "
    "Below 0.1 stable, 0.1-0.2 moderate, above 0.2 major.",
    "monitor", ("model_version", "feature"),
)  # fmt: skip
FEATURE_MISSING_RATIO = _gauge(
    "fraudmesh_feature_missing_ratio",
    "Share of the window's decisions in which the feature was missing or stale and took "
    "its default.",
    "monitor", ("model_version", "feature"),
)  # fmt: skip
REFERENCE_MISSING_RATIO = _gauge(
    "fraudmesh_reference_missing_ratio",
    "The feature's missing share in the version's reference period.",
    "monitor", ("model_version", "feature"),
)  # fmt: skip
DECISION_RATIO = _gauge(
    "fraudmesh_decision_ratio", "Share of each decision in the rolling window.",
    "monitor", ("model_version", "decision"),
)  # fmt: skip
REFERENCE_DECISION_RATIO = _gauge(
    "fraudmesh_reference_decision_ratio",
    "Share of each decision the version's thresholds gave in its reference period.",
    "monitor", ("model_version", "decision"),
)  # fmt: skip
WINDOW_DECISIONS = _gauge(
    "fraudmesh_window_decisions",
    "Decisions in the rolling window, by version and arm (live, canary, shadow).",
    "monitor", ("model_version", "arm"),
)  # fmt: skip
LIVE_PRECISION = _gauge(
    "fraudmesh_live_precision",
    "Labelled frauds among labelled decisions flagged at the threshold (review: review or "
    "decline answered), over matured or immature cohorts (never mixed); NaN without any.",
    "monitor", ("model_version", "threshold", "maturity"),
)  # fmt: skip
LIVE_RECALL = _gauge(
    "fraudmesh_live_recall",
    "Labelled frauds flagged at the threshold among labelled frauds, over matured or "
    "immature cohorts; NaN without a fraud.",
    "monitor", ("model_version", "threshold", "maturity"),
)  # fmt: skip
LIVE_AVERAGE_PRECISION = _gauge(
    "fraudmesh_live_average_precision",
    "Average precision of the labelled decisions' scores (on a 0.125 log-odds grid).",
    "monitor", ("model_version", "maturity"),
)  # fmt: skip
LABELLED_RATIO = _gauge(
    "fraudmesh_labelled_ratio",
    "Labelled share of the decisions of matured or immature cohorts (retraining's rule).",
    "monitor", ("model_version", "maturity"),
)  # fmt: skip
LIVE_LABELLED_FRAUDS = _gauge(
    "fraudmesh_live_labelled_frauds",
    "Decisions labelled fraud, over matured or immature cohorts (how much the live figures "
    "stand on).",
    "monitor", ("model_version", "maturity"),
)  # fmt: skip
RULE_FIRES = _gauge("fraudmesh_rule_fires", "Decisions in the rolling window a fraud team's rule fired on (live: it decided; shadow: it would have).", "monitor", ("rule", "mode", "action"))  # fmt: skip
RULE_FIRE_RATIO = _gauge("fraudmesh_rule_fire_ratio", "A fraud team's rule's fires over every decision in the rolling window; NaN without any.", "monitor", ("rule", "mode", "action"))  # fmt: skip
RULE_PRECISION = _gauge("fraudmesh_rule_precision", "Labelled frauds among the labelled decisions a fraud team's rule fired on (evaluation horizon); NaN without any.", "monitor", ("rule", "mode", "action"))  # fmt: skip
REFERENCE_PRECISION = _gauge(
    "fraudmesh_reference_precision",
    "The version's test-period precision at the threshold: estimate and 95 % interval bounds.",
    "monitor", ("model_version", "threshold", "bound"),
)  # fmt: skip
REFERENCE_RECALL = _gauge(
    "fraudmesh_reference_recall",
    "The version's test-period recall at the threshold: estimate and 95 % interval bounds.",
    "monitor", ("model_version", "threshold", "bound"),
)  # fmt: skip
RETRAINING_ADVISED = _gauge(
    "fraudmesh_retraining_advised",
    "1 while the monitor advises retraining the version (drift or live quality past its "
    "threshold; the advice and its figures are in the monitor's advice file).",
    "monitor", ("model_version",),
)  # fmt: skip
RETRAINING_ADVICE = _counter(
    "fraudmesh_retraining_advice_total",
    "Retraining advice recorded, by version and reason.",
    "monitor", ("model_version", "reason"),
)  # fmt: skip
MONITOR_EVENTS = _counter(
    "fraudmesh_monitor_events_total",
    "Events consumed, by what became of them (decision, duplicate, outcome, unmatched, "
    "invalid).",
    "monitor", ("kind",),
)  # fmt: skip
MONITOR_LAG = _gauge(
    "fraudmesh_monitor_lag_seconds",
    "Age of the newest decision of the latest poll when the monitor is behind, 0 at the "
    "log's head.",
    "monitor",
)  # fmt: skip
MONITOR_ERRORS = _counter(
    "fraudmesh_monitor_errors_total",
    "Failures by what failed (log, state), each retried.",
    "monitor", ("what",),
)  # fmt: skip
MONITOR_CHECKPOINT = _histogram(
    "fraudmesh_monitor_checkpoint_seconds",
    "Duration of a checkpoint (state file written, then the log position committed).",
    "monitor",
)  # fmt: skip
MONITOR_READY = _gauge(
    "fraudmesh_monitor_ready",
    "1 while connected to the log and caught up with it.",
    "monitor",
)  # fmt: skip

# Every process with a metrics port: the client library's default collectors (Linux).
PROCESS_CPU_SECONDS = _provided(
    "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
    kind="counter",
)  # fmt: skip
PROCESS_RESIDENT_MEMORY = _provided(
    "process_resident_memory_bytes", "Resident memory size in bytes."
)
PROCESS_VIRTUAL_MEMORY = _provided("process_virtual_memory_bytes", "Virtual memory size in bytes.")
PROCESS_START_TIME = _provided(
    "process_start_time_seconds", "Start time of the process since unix epoch in seconds."
)
PROCESS_OPEN_FDS = _provided("process_open_fds", "Number of open file descriptors.")
PROCESS_MAX_FDS = _provided("process_max_fds", "Maximum number of open file descriptors.")
PYTHON_GC_OBJECTS_COLLECTED = _provided(
    "python_gc_objects_collected_total", "Objects collected during gc", ("generation",),
    kind="counter",
)  # fmt: skip
PYTHON_GC_OBJECTS_UNCOLLECTABLE = _provided(
    "python_gc_objects_uncollectable_total", "Uncollectable objects found during GC",
    ("generation",), kind="counter",
)  # fmt: skip
PYTHON_GC_COLLECTIONS = _provided(
    "python_gc_collections_total", "Number of times this generation was collected",
    ("generation",), kind="counter",
)  # fmt: skip
PYTHON_INFO = _provided(
    "python_info", "Python platform information",
    ("implementation", "major", "minor", "patchlevel", "version"),
)  # fmt: skip

CATALOGUE: tuple[MetricSpec, ...] = tuple(_declared)
"""Every metric, in declaration order (by exporter)."""


def of_component(component: Component) -> tuple[MetricSpec, ...]:
    """The metrics one exporter declares."""
    return tuple(spec for spec in CATALOGUE if spec.component == component)


def by_name(name: str) -> MetricSpec:
    """The metric called ``name`` (as queried, or its family name); KeyError if none."""
    for spec in CATALOGUE:
        if name in (spec.name, spec.family):
            return spec
    raise KeyError(f"no metric {name!r} in the catalogue")
