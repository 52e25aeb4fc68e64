"""The updater's consume loop: poll, apply, write the online rows, checkpoint, commit.

Runs on its own thread (every call it makes blocks). The commit comes after both the store
write and the state save: at least once plus idempotent apply, so after a crash nothing is
lost and nothing counts twice. The iteration, its failures and recovery: ``docs/liveloop.md``,
"The feature updater".
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from google.protobuf.message import DecodeError

from services.common.errors import Unavailable
from services.eventlog import BackendUnavailable, Consumer, EventLogError, Record
from services.featurestore.writer import Row
from services.updater.engine import Applied, LiveAggregator, View
from services.updater.metrics import UpdaterMetrics
from services.updater.settings import UpdaterSettings

log = logging.getLogger(__name__)

_NANOS = 1e9


class RowWriter(Protocol):
    """Where rows go: the online store (``featurestore.writer.OnlineFeatureWriter``)."""

    def write(
        self, cards: Sequence[Row], merchants: Sequence[Row], terminals: Sequence[Row]
    ) -> None:
        """Stores the rows or raises ``Unavailable``."""
        ...


def _seconds(stamp: object) -> float:
    return stamp.seconds + stamp.nanos / _NANOS  # type: ignore[attr-defined]


class UpdateLoop:
    """Consumes the event log into the online store (poll, apply, write, checkpoint, commit)."""

    def __init__(
        self,
        settings: UpdaterSettings,
        open_consumer: Callable[[], Consumer],
        writer: RowWriter,
        aggregator: LiveAggregator,
        metrics: UpdaterMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._open_consumer = open_consumer
        self._writer = writer
        self._agg = aggregator
        self._metrics = metrics
        self._clock = clock
        self._consumer: Consumer | None = None
        self._connected = False
        self._store_ok = True
        self._caught_up = False
        self._uncommitted_since: float | None = None
        self._unwritten: list[tuple[View, float]] = []
        self._failing: set[str] = set()

    def ready(self) -> bool:
        """Connected to the log and the store, and caught up with the log's end."""
        return self._connected and self._store_ok and self._caught_up

    # --- the loop ----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Loops until ``stop`` is set, then writes, checkpoints and commits what it has."""
        while not stop.is_set():
            try:
                self.step()
            except (BackendUnavailable, EventLogError) as error:
                self._connected = False
                self._failed("log", error)
            except Unavailable as error:
                self._store_ok = False
                self._failed("online_store", error)
            except sqlite3.Error as error:
                self._failed("state", error)
            else:
                continue
            self._metrics.ready.set(0)
            stop.wait(self._settings.retry_backoff_s)
        self._finish()

    def step(self) -> None:
        """One iteration: retry unwritten rows, checkpoint if due, poll, apply, write."""
        if self._agg.rows_pending:
            self._write_rows()
        if self._checkpoint_due():
            self.checkpoint()
        if self._consumer is None:
            self._consumer = self._open_consumer()
        s = self._settings
        records = self._consumer.poll(s.poll_max_records, s.poll_timeout_s)
        self._connected = True
        self._recovered("log")
        if records:
            if self._uncommitted_since is None:
                self._uncommitted_since = time.monotonic()
            last_created = self._apply(records)
            self._write_rows()
            full = len(records) >= s.poll_max_records
            age = max(0.0, self._clock() - last_created) if last_created else 0.0
            # Behind: a full batch, or records older than one poll wait (a backlog).
            self._caught_up = not full and age < max(1.0, 4 * s.poll_timeout_s)
            self._metrics.lag.set(age if not self._caught_up else 0.0)
        else:
            self._caught_up = True
            self._metrics.lag.set(0.0)
        self._metrics.ready.set(1 if self.ready() else 0)
        self._metrics.pending_labels.set(self._agg.pending_labels)

    def _apply(self, records: list[Record]) -> float:
        """Applies the records; returns the creation time of the newest one (0 if none)."""
        m = self._metrics
        last = 0.0
        for record in records:
            try:
                envelope = record.envelope()
                kind = envelope.WhichOneof("event")
                if kind == "decision":
                    created = _seconds(envelope.decision.decided_at)
                elif kind == "outcome":
                    created = _seconds(envelope.outcome.received_at)
                else:
                    raise ValueError("the envelope carries no event")
                applied = self._agg.apply(envelope, record.value)
            except (DecodeError, ValueError) as error:
                m.records.labels("invalid").inc()
                log.error(
                    "skipped an invalid event log record",
                    extra={"position": record.position, "error": str(error)},
                )
                continue
            m.records.labels(kind).inc()
            self._count(applied)
            for view in {v for v, _ in applied.changes}:
                self._unwritten.append((view, created))
            last = max(last, created)
        dropped = self._agg.labels_dropped
        if dropped:
            m.labels_dropped.inc(dropped)
            self._agg.labels_dropped = 0
        return last

    def _count(self, applied: Applied) -> None:
        m = self._metrics
        for view, change in applied.changes:
            m.changes.labels(view.value, change.value).inc()
        for view, evicted in applied.evicted_by_cap:
            m.evicted_by_cap.labels(view.value).inc(evicted)

    def _write_rows(self) -> None:
        rows = self._agg.rows()
        self._writer.write(rows.cards, rows.merchants, rows.terminals)
        self._agg.rows_written()
        self._store_ok = True
        self._recovered("online_store")
        done = self._clock()
        m = self._metrics
        for view, created in self._unwritten:
            m.event_to_store.observe(max(0.0, done - created))
            m.applied(view.value, created)
        self._unwritten.clear()

    def _checkpoint_due(self) -> bool:
        since = self._uncommitted_since
        if since is None:
            return False
        return (
            time.monotonic() - since >= self._settings.checkpoint_interval_s
            or self._agg.applied_since_checkpoint >= self._settings.checkpoint_max_events
        )

    def checkpoint(self) -> None:
        """Saves the changed states, then commits the log position (rows already written)."""
        if self._agg.rows_pending or self._consumer is None:
            return
        start = time.perf_counter()
        self._agg.checkpoint()
        self._recovered("state")
        self._consumer.commit()
        self._uncommitted_since = None
        self._metrics.checkpoint.observe(time.perf_counter() - start)
        for view, size in self._agg.sizes().items():
            self._metrics.cached.labels(view.value).set(size)
        self._metrics.journal.set(self._agg.journal_events)

    def _finish(self) -> None:
        """On stop: the last rows, a last checkpoint and commit, then leave the group."""
        try:
            if self._agg.rows_pending:
                self._write_rows()
            if self._uncommitted_since is not None and self._consumer is not None:
                # Every state snapshotted: the next start has no journal to apply.
                self._agg.snapshot_all()
                self._consumer.commit()
                self._uncommitted_since = None
        except Exception:
            log.exception("final checkpoint failed; the log gives the rest again on restart")
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.exception("closing the event log consumer failed")
            self._consumer = None
        self._metrics.ready.set(0)

    # --- failure bookkeeping -----------------------------------------------------------

    def _failed(self, what: str, error: Exception) -> None:
        self._metrics.store_errors.labels(what).inc()
        if what not in self._failing:
            self._failing.add(what)
            log.warning(
                "updater: %s failed; retrying every %.1f s",
                what,
                self._settings.retry_backoff_s,
                extra={"error": f"{type(error).__name__}: {error}"},
            )

    def _recovered(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.info("updater: %s is back", what)
