"""Prometheus metrics of the event log's producers (one set per process)."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


class EventLogMetrics:
    """The producer's metric families; ``default()`` gives the process-wide set."""

    _default: EventLogMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.appended = Counter(
            "fraudmesh_eventlog_appended_total",
            "Events handed to the event log producer.",
            registry=registry,
        )
        self.delivered = Counter(
            "fraudmesh_eventlog_delivered_total",
            "Events stored by the event log backend (replays from spill files included).",
            registry=registry,
        )
        self.buffered = Gauge(
            "fraudmesh_eventlog_buffered",
            "Events held in the producer's memory buffer, not yet delivered or spilled.",
            registry=registry,
        )
        self.spilled = Counter(
            "fraudmesh_eventlog_spilled_total",
            "Events written to a local spill file because the backend was down or slow.",
            registry=registry,
        )
        self.spill_pending = Gauge(
            "fraudmesh_eventlog_spill_pending",
            "Events in spill files waiting to be delivered.",
            registry=registry,
        )
        self.dropped = Counter(
            "fraudmesh_eventlog_dropped_total",
            "Events lost because the spill disk was full (or the spill cap reached).",
            registry=registry,
        )
        self.backend_up = Gauge(
            "fraudmesh_eventlog_backend_up",
            "1 while the last write to the event log backend succeeded, else 0.",
            registry=registry,
        )

    @classmethod
    def default(cls) -> EventLogMetrics:
        """The metrics on the default registry, created on first use."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default
