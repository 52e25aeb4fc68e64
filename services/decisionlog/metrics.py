"""Prometheus metrics of the decision sink."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


class SinkMetrics:
    """The sink's metric families (on the default registry unless told otherwise)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.events = Counter(
            "fraudmesh_decisionlog_events_total",
            "Records the sink read from the event log, by what it did with them: "
            "decision / outcome (gathered for writing), duplicate (already written), "
            "invalid (not a decodable event; logged and skipped).",
            ["result"],
            registry=registry,
        )
        self.written = Counter(
            "fraudmesh_decisionlog_events_written_total",
            "Events durably written to Parquet parts, by table.",
            ["table"],
            registry=registry,
        )
        self.parts = Counter(
            "fraudmesh_decisionlog_parts_written_total",
            "Parquet parts written, by table.",
            ["table"],
            registry=registry,
        )
        self.bytes = Counter(
            "fraudmesh_decisionlog_bytes_written_total",
            "Bytes of Parquet parts written.",
            registry=registry,
        )
        self.flush_seconds = Histogram(
            "fraudmesh_decisionlog_flush_seconds",
            "Time to write one flush's parts durably (fsync, rename) and commit the log position.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.write_delay = Histogram(
            "fraudmesh_decisionlog_write_delay_seconds",
            "Per flush: from the event time (decided_at / received_at) of its oldest event to "
            "the moment that event was durable.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 30, 60, 300, 3600),
            registry=registry,
        )
        self.errors = Counter(
            "fraudmesh_decisionlog_errors_total",
            "Failures the sink retried, by operation (poll, commit, write, connect).",
            ["operation"],
            registry=registry,
        )
        self.lag = Gauge(
            "fraudmesh_decisionlog_lag_seconds",
            "Age of the newest event the last poll returned (0 after a poll found nothing new): "
            "how far behind the head of the log the sink reads.",
            registry=registry,
        )
        self.pending = Gauge(
            "fraudmesh_decisionlog_pending_events",
            "Events read from the log and not yet durable in a part.",
            registry=registry,
        )
        self.backend_up = Gauge(
            "fraudmesh_decisionlog_backend_up",
            "1 while the last call to the event log backend succeeded, else 0.",
            registry=registry,
        )
        self.caught_up = Gauge(
            "fraudmesh_decisionlog_caught_up",
            "1 once a poll returned less than it asked for (the sink reads at the head of "
            "the log), else 0.",
            registry=registry,
        )
        self.last_flush = Gauge(
            "fraudmesh_decisionlog_last_flush_timestamp_seconds",
            "Unix time of the last completed flush (parts durable and position committed).",
            registry=registry,
        )
        self._last_flush_at = time.time()
        self.last_flush_age = Gauge(
            "fraudmesh_decisionlog_last_flush_age_seconds",
            "Seconds since the last completed flush (since start before the first one). It also "
            "grows while no events come: alert on it together with pending_events > 0.",
            registry=registry,
        )
        self.last_flush_age.set_function(lambda: time.time() - self._last_flush_at)

    def flushed(self, at: float) -> None:
        """Records a completed flush at Unix time ``at``."""
        self._last_flush_at = at
        self.last_flush.set(at)
