"""Prometheus metrics of the live feature updater."""

from __future__ import annotations

import functools
import threading
import time

from prometheus_client import REGISTRY, CollectorRegistry

from services.common import metric_catalogue as catalogue
from services.updater.engine import Applied, View

_VIEWS = tuple(view.value for view in View)
"""card, merchant, terminal: each has its freshness from the start (NaN until an event)."""


class UpdaterMetrics:
    """The updater's metric families (declared in the catalogue), created once per process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.records = catalogue.UPDATER_RECORDS.create(registry)
        self.changes = catalogue.UPDATER_CHANGES.create(registry)
        self.evicted_by_cap = catalogue.UPDATER_EVICTED_BY_CAP.create(registry)
        self.labels_dropped = catalogue.UPDATER_LABELS_DROPPED.create(registry)
        self.event_to_store = catalogue.UPDATER_EVENT_TO_STORE.create(registry)
        self.freshness = catalogue.FEATURE_FRESHNESS.create(registry)
        self.lag = catalogue.UPDATER_CONSUMER_LAG.create(registry)
        self.store_errors = catalogue.UPDATER_ERRORS.create(registry)
        self.checkpoint = catalogue.UPDATER_CHECKPOINT.create(registry)
        self.cached = catalogue.UPDATER_CACHED_ENTITIES.create(registry)
        self.journal = catalogue.UPDATER_JOURNAL_EVENTS.create(registry)
        self.pending_labels = catalogue.UPDATER_PENDING_LABELS.create(registry)
        self.ready = catalogue.UPDATER_READY.create(registry)
        self.partitions = catalogue.UPDATER_PARTITIONS.create(registry)
        self._lock = threading.Lock()
        self._newest: dict[str, float | None] = dict.fromkeys(_VIEWS)
        for view in _VIEWS:
            self.freshness.labels(view).set_function(functools.partial(self._age, view))

    def count(self, applied: Applied) -> None:
        """Counts what one event did to each view, and its evictions by the state caps."""
        for view, change in applied.changes:
            self.changes.labels(view.value, change.value).inc()
        for view, evicted in applied.evicted_by_cap:
            self.evicted_by_cap.labels(view.value).inc(evicted)

    def written(self, unwritten: list[tuple[View, float]], done_s: float) -> None:
        """The rows of events created at these times (per view) were written at ``done_s``."""
        for view, created in unwritten:
            self.event_to_store.observe(max(0.0, done_s - created))
            self.applied(view.value, created)

    def applied(self, view: str, created_s: float) -> None:
        """Records that an event created at ``created_s`` reached ``view``'s online rows."""
        with self._lock:
            newest = self._newest[view]
            if newest is None or created_s > newest:
                self._newest[view] = created_s

    def _age(self, view: str) -> float:
        with self._lock:
            newest = self._newest[view]
        return float("nan") if newest is None else max(0.0, time.time() - newest)
