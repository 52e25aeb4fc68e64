"""Prometheus metrics of the live feature updater."""

from __future__ import annotations

import functools
import threading
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from services.updater.engine import View

# Fine steps up to the 50 ms freshness target, coarse beyond it.
_FRESHNESS_BUCKETS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.045,
    0.05,
    0.06,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
_VIEWS = tuple(view.value for view in View)
"""card, merchant, terminal: each has its freshness from the start (NaN until an event)."""


class UpdaterMetrics:
    """The updater's metric families, created once per process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.records = Counter(
            "fraudmesh_updater_records_total",
            "Records consumed from the event log, by kind (decision, outcome, invalid).",
            ["kind"],
            registry=registry,
        )
        self.changes = Counter(
            "fraudmesh_updater_changes_total",
            "What events did to entity states, by view and change (applied, late, duplicate, "
            "too_old, pending).",
            ["view", "change"],
            registry=registry,
        )
        self.evicted_by_cap = Counter(
            "fraudmesh_updater_evicted_by_cap_total",
            "Events evicted from an entity state by its size cap (its windows undercount).",
            ["view"],
            registry=registry,
        )
        self.labels_dropped = Counter(
            "fraudmesh_updater_labels_dropped_total",
            "Held outcomes dropped: too many held, or too old to change any window.",
            registry=registry,
        )
        self.event_to_store = Histogram(
            "fraudmesh_updater_event_to_store_seconds",
            "From an event's creation at the gateway (decided_at / received_at) to its rows "
            "written to the online store.",
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.freshness = Gauge(
            "fraudmesh_feature_freshness_seconds",
            "Age of the newest event applied to each view's online rows (now - its creation).",
            ["view"],
            registry=registry,
        )
        self.lag = Gauge(
            "fraudmesh_updater_consumer_lag_seconds",
            "How far behind the log the updater is: age of the last record of the latest poll "
            "when it returned a full batch or its records were old, 0 once a poll found the end.",
            registry=registry,
        )
        self.store_errors = Counter(
            "fraudmesh_updater_errors_total",
            "Failures by what failed (log, online_store, state), each retried.",
            ["what"],
            registry=registry,
        )
        self.checkpoint = Histogram(
            "fraudmesh_updater_checkpoint_seconds",
            "Duration of a checkpoint (states saved, then the log position committed).",
            registry=registry,
        )
        self.cached = Gauge(
            "fraudmesh_updater_cached_entities",
            "Entity states held in memory, by view.",
            ["view"],
            registry=registry,
        )
        self.journal = Gauge(
            "fraudmesh_updater_journal_events",
            "Events in the state file's journal not yet covered by entity snapshots (applied "
            "again at start).",
            registry=registry,
        )
        self.pending_labels = Gauge(
            "fraudmesh_updater_pending_labels",
            "Outcomes held for transactions whose decision has not been consumed yet.",
            registry=registry,
        )
        self.ready = Gauge(
            "fraudmesh_updater_ready",
            "1 while connected to the log and the store and caught up with the log.",
            registry=registry,
        )
        self._lock = threading.Lock()
        self._newest: dict[str, float | None] = dict.fromkeys(_VIEWS)
        for view in _VIEWS:
            self.freshness.labels(view).set_function(functools.partial(self._age, view))

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
