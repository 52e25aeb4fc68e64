"""Prometheus metrics of the event log's producers (one set per process)."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry

from services.common import metric_catalogue as catalogue


class EventLogMetrics:
    """The producer's metric families (declared in the catalogue); ``default()`` gives the
    process-wide set."""

    _default: EventLogMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.appended = catalogue.EVENTLOG_APPENDED.create(registry)
        self.delivered = catalogue.EVENTLOG_DELIVERED.create(registry)
        self.buffered = catalogue.EVENTLOG_BUFFERED.create(registry)
        self.spilled = catalogue.EVENTLOG_SPILLED.create(registry)
        self.spill_pending = catalogue.EVENTLOG_SPILL_PENDING.create(registry)
        self.dropped = catalogue.EVENTLOG_DROPPED.create(registry)
        self.backend_up = catalogue.EVENTLOG_BACKEND_UP.create(registry)

    @classmethod
    def default(cls) -> EventLogMetrics:
        """The metrics on the default registry, created on first use."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default
