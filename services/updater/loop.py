"""The updater's consume loop (``eventlog.consume.ConsumeLoop``): poll, apply, write the
online rows, checkpoint, commit.

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

from fraud.v1 import events_pb2
from services.common.errors import Unavailable
from services.eventlog import BackendUnavailable, Consumer, EventLogError, Record
from services.eventlog.consume import Backoff, ConsumeLoop
from services.featurestore.writer import Row
from services.updater.engine import LiveAggregator, View
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


def event_of(envelope: events_pb2.EventEnvelope) -> tuple[str, float | None]:
    """An event's kind and its creation at the mesh (None for a list change, the lists'
    audit: no feature moves with it). Raises ValueError for an envelope without an event."""
    kind = envelope.WhichOneof("event")
    if kind == "decision":
        return kind, _seconds(envelope.decision.decided_at)
    if kind == "outcome":
        return kind, _seconds(envelope.outcome.received_at)
    if kind == "list_change":
        return kind, None
    raise ValueError("the envelope carries no event")


def lag_after(polled: int, last_created: float, now: float, s: UpdaterSettings) -> float | None:
    """How far behind the log a poll of ``polled`` records leaves the loop: None when caught
    up; behind is a full batch, or records older than one poll wait (a backlog)."""
    age = max(0.0, now - last_created) if last_created else 0.0
    behind = polled >= s.poll_max_records or age >= max(1.0, 4 * s.poll_timeout_s)
    return age if behind else None


class UpdaterLoop(ConsumeLoop):
    """What every updater loop shares (the single updater's and a partitioned group
    member's): its settings, row writer and metrics, readiness, and which errors are whose."""

    def __init__(
        self,
        settings: UpdaterSettings,
        open_consumer: Callable[[], Consumer],
        writer: RowWriter,
        metrics: UpdaterMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            "updater",
            open_consumer,
            lambda what: metrics.store_errors.labels(what).inc(),
            Backoff(settings.retry_backoff_s),
        )
        self._settings = settings
        self._writer = writer
        self._metrics = metrics
        self._clock = clock
        self._store_ok = True
        self._caught_up = False
        self._unwritten: list[tuple[View, float]] = []

    def ready(self) -> bool:
        """Connected to the log and the store, and caught up with the log's end."""
        return self._connected and self._store_ok and self._caught_up

    # --- the loop ----------------------------------------------------------------------

    def turn(self, stop: threading.Event) -> float:
        """One step, and the next at once."""
        self.step()
        return 0.0

    def step(self) -> None:
        """One iteration."""
        raise NotImplementedError

    def failure_of(self, error: Exception) -> str | None:
        """The log's errors, the online store's and the state file's."""
        if isinstance(error, (BackendUnavailable, EventLogError)):
            self._connected = False
            return "log"
        if isinstance(error, Unavailable):
            self._store_ok = False
            return "online_store"
        return "state" if isinstance(error, sqlite3.Error) else None

    def on_failure(self, what: str) -> None:
        """Not ready while anything fails."""
        self._metrics.ready.set(0)


class UpdateLoop(UpdaterLoop):
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
        super().__init__(settings, open_consumer, writer, metrics, clock)
        self._agg = aggregator

    def step(self) -> None:
        """One iteration: retry unwritten rows, checkpoint if due, poll, apply, write."""
        if self._agg.rows_pending:
            self._write_rows()
        s = self._settings
        applied = self._agg.applied_since_checkpoint
        if self.checkpoint_due(s.checkpoint_interval_s, applied, s.checkpoint_max_events):
            self.checkpoint()
        records = self.poll(s.poll_max_records, s.poll_timeout_s)
        if records:
            last_created = self._apply(records)
            self._write_rows()
            lag = lag_after(len(records), last_created, self._clock(), s)
            self._caught_up = lag is None
            self._metrics.lag.set(lag or 0.0)
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
                kind, created = event_of(envelope)
                if created is None:
                    m.records.labels(kind).inc()
                    continue
                applied = self._agg.apply(envelope, record.value)
            except (DecodeError, ValueError) as error:
                m.records.labels("invalid").inc()
                log.error(
                    "skipped an invalid event log record",
                    extra={"position": record.position, "error": str(error)},
                )
                continue
            m.records.labels(kind).inc()
            m.count(applied)
            for view in {v for v, _ in applied.changes}:
                self._unwritten.append((view, created))
            last = max(last, created)
        dropped = self._agg.labels_dropped
        if dropped:
            m.labels_dropped.inc(dropped)
            self._agg.labels_dropped = 0
        return last

    def _write_rows(self) -> None:
        rows = self._agg.rows()
        self._writer.write(rows.cards, rows.merchants, rows.terminals)
        self._agg.rows_written()
        self._store_ok = True
        self._failures.recovered("online_store")
        self._metrics.written(self._unwritten, self._clock())
        self._unwritten.clear()

    def checkpoint(self) -> None:
        """Saves the changed states, then commits the log position (rows already written)."""
        if self._agg.rows_pending or self._consumer is None:
            return
        self._metrics.checkpoint.observe(self.commit_after(self._agg.checkpoint))
        for view, size in self._agg.sizes().items():
            self._metrics.cached.labels(view.value).set(size)
        self._metrics.journal.set(self._agg.journal_events)

    def finish(self) -> None:
        """On stop: the last rows, a last checkpoint and commit, then leave the group."""
        try:
            if self._agg.rows_pending:
                self._write_rows()
            if self.uncommitted and self._consumer is not None:
                # Every state snapshotted: the next start has no journal to apply.
                self.commit_after(self._agg.snapshot_all)
        except Exception:
            log.exception("final checkpoint failed; the log gives the rest again on restart")
        self.close_consumer()
        self._metrics.ready.set(0)
