"""Prometheus metrics of the decision sink."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY, CollectorRegistry

from services.common import metric_catalogue as catalogue


class SinkMetrics:
    """The sink's metric families (declared in the catalogue; on the default registry unless
    told otherwise)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.events = catalogue.DECISIONLOG_EVENTS.create(registry)
        self.written = catalogue.DECISIONLOG_EVENTS_WRITTEN.create(registry)
        self.parts = catalogue.DECISIONLOG_PARTS_WRITTEN.create(registry)
        self.bytes = catalogue.DECISIONLOG_BYTES_WRITTEN.create(registry)
        self.flush_seconds = catalogue.DECISIONLOG_FLUSH_SECONDS.create(registry)
        self.write_delay = catalogue.DECISIONLOG_WRITE_DELAY.create(registry)
        self.errors = catalogue.DECISIONLOG_ERRORS.create(registry)
        self.lag = catalogue.DECISIONLOG_LAG.create(registry)
        self.pending = catalogue.DECISIONLOG_PENDING.create(registry)
        self.backend_up = catalogue.DECISIONLOG_BACKEND_UP.create(registry)
        self.caught_up = catalogue.DECISIONLOG_CAUGHT_UP.create(registry)
        self.last_flush = catalogue.DECISIONLOG_LAST_FLUSH.create(registry)
        self._last_flush_at = time.time()
        self.last_flush_age = catalogue.DECISIONLOG_LAST_FLUSH_AGE.create(registry)
        self.last_flush_age.set_function(lambda: time.time() - self._last_flush_at)

    def flushed(self, at: float) -> None:
        """Records a completed flush at Unix time ``at``."""
        self._last_flush_at = at
        self.last_flush.set(at)
