"""The decision sink's loop: poll the event log, gather rows, write parts, then commit.

Exactly once in effect, on top of an at-least-once log:

1. Records are polled and gathered in memory (``rows.Batch``), per table and UTC day.
2. A flush (every ``flush_interval_s`` of waiting, at ``max_part_rows``, and on stop)
   first names its parts in the journal, then writes each part durably (fsync + rename).
3. Only then is the log position committed. The sink polls nothing new until the commit
   succeeded, so at most one flush is ever uncommitted: the one the journal names.

A crash before step 3 means the log delivers the flush's records again; on start the sink
reads the event ids of the journal's parts and skips them (``rows.RecentIds``). Events the
producer delivered twice are skipped the same way within ``dedupe_window``, and readers
deduplicate by event id as a last line. A backend that is down only delays polls and
commits (retried with backoff); a disk that refuses a part is retried the same way, and
nothing is committed meanwhile. Nothing here imports the transport: the gRPC process
around it is ``app.py``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from services.common import filecommit
from services.decisionlog import layout, writer
from services.decisionlog.metrics import SinkMetrics
from services.decisionlog.rows import AddResult, Batch, RecentIds
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import (
    BackendUnavailable,
    Consumer,
    EventLogSettings,
    GroupBusyError,
    Record,
    open_consumer,
)
from services.eventlog.consume import Backoff, ConsumeLoop

log = logging.getLogger(__name__)

_RETENTION_CHECK_S = 3600.0


@dataclass
class SinkStats:
    """What this sink did since it started (the metrics' figures, readable in-process)."""

    read: dict[str, int] = field(default_factory=dict)
    """Records read, by ``AddResult`` (decision, outcome, duplicate, invalid)."""
    written: int = 0
    """Events durably written."""
    parts: int = 0
    """Parts written."""
    flushes: int = 0
    """Flushes completed (parts durable and the position committed)."""


ConsumerFactory = Callable[[], Consumer]
"""Opens the sink's consumer (raises ``BackendUnavailable`` while the backend is down)."""


class DecisionSink(ConsumeLoop):
    """Writes every decision and outcome on the event log to the Parquet decision log."""

    def __init__(
        self,
        settings: DecisionLogSettings,
        log_settings: EventLogSettings,
        metrics: SinkMetrics | None = None,
        consumer_factory: ConsumerFactory | None = None,
    ) -> None:
        self.settings = settings
        self.root = settings.root_path
        self.name = log_settings.consumer_name
        """This sink's name among the sinks of the log: its consumer name, which its parts,
        journal and lock carry (``layout``)."""
        if not layout.SINK_NAME.match(self.name):
            raise ValueError(
                f"the decision sink's consumer name {self.name!r} cannot name its files: "
                "use letters, digits, '.', '_' and '-', not starting with '.'"
            )
        self.metrics = metrics or SinkMetrics()
        super().__init__(
            "decision sink",
            consumer_factory or (lambda: open_consumer(log_settings, settings.group)),
            self._count_failure,
            Backoff(settings.retry_backoff_s, settings.retry_backoff_max_s),
        )
        self.connected = threading.Event()
        """Set once the consumer is open and a first poll succeeded."""
        self.caught_up = threading.Event()
        """Set once a poll returned less than it asked for: the sink reads at the log's head."""
        self.stats = SinkStats()
        self.journal = writer.Journal(self.root, self.name)
        self.batch = Batch(RecentIds(settings.dedupe_window))
        self._next_flush = 1
        self._flush_in_progress: writer.JournalEntry | None = None
        self._commit_pending = False
        self._flush_started = 0.0
        self._last_retention = float("-inf")
        self._lock: writer.RootLock | None = None

    # -- start -----------------------------------------------------------------------------

    def recover(self) -> int:
        """Takes the folder's lock and learns what the last flush may have left uncommitted;
        returns how many event ids it will skip if the log delivers them again."""
        writer.ensure_dir(self.root)
        self._lock = writer.RootLock(self.root, self.name)
        entry = self.journal.read()
        if entry is None and self.name != layout.DEFAULT_SINK:
            entry = self._adopt_default_journal()
        if entry is None:
            self._next_flush = writer.last_flush_on_disk(self.root, self.name) + 1
            return 0
        self._next_flush = entry.flush + 1
        ids = self.journal.written_ids(entry)
        # The window must hold them all, however small it is configured.
        self.batch.recent.capacity = max(self.batch.recent.capacity, len(ids))
        for event_id in ids:
            self.batch.recent.add(event_id)
        log.info(
            "decision log recovered",
            extra={"flush": entry.flush, "parts": len(entry.parts), "ids": len(ids)},
        )
        return len(ids)

    def _adopt_default_journal(self) -> writer.JournalEntry | None:
        """Takes over the journal of the default names, when no sink of that name runs: a
        sink that wrote under them before sinks were named by their consumer names (a
        Kubernetes pod, named by its pod) keeps its last flush's ids after the upgrade."""
        legacy = writer.Journal(self.root)
        if not legacy.path.exists():
            return None
        try:
            lock = writer.RootLock(self.root)
        except writer.RootBusyError:
            return None  # a live sink of the default name: the journal is its own
        try:
            entry = legacy.read()
            if entry is not None:
                self.journal.begin(entry)
            legacy.path.unlink()
            filecommit.fsync_dir(legacy.path.parent)
        finally:
            lock.release()
        if entry is not None:
            log.info("took over the journal of the default names", extra={"flush": entry.flush})
        return entry

    def open_consumer(self) -> Consumer:
        """Opens the sink's consumer on the log (``BackendUnavailable`` while it is down)."""
        return self._open_consumer()

    def release(self) -> None:
        """Releases the folder's lock (``run`` does so when it ends)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def next_flush(self) -> int:
        """The number the next flush will write its parts under."""
        return self._next_flush

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consumes until ``stop`` is set, then reads what is left on the log (up to
        ``close_timeout_s``), writes it and commits."""
        if self._lock is None:
            self.recover()
        try:
            super().run(stop)
        finally:
            self.close_consumer()
            self.release()

    def turn(self, stop: threading.Event) -> float:
        """Opens the consumer (retried while the backend is down), then one step."""
        if self._consumer is None:
            self.consumer()
            self._backoff.reset()
        self.step(self.consumer(), stop)
        return 0.0

    def failure_of(self, error: Exception) -> str | None:
        """Only opening the consumer fails a turn: a step retries its own failures."""
        return "connect" if isinstance(error, (BackendUnavailable, GroupBusyError)) else None

    def finish(self) -> None:
        """Reads, writes and commits what is left (bounded); ``run`` then leaves the group
        and releases the folder's lock."""
        if self._consumer is not None:
            self._close(self._consumer)

    def step(self, consumer: Consumer, stop: threading.Event | None = None) -> None:
        """One turn: finish a failed flush or commit, else poll, gather and maybe flush."""
        if self._flush_in_progress is not None or self._commit_pending:
            if not self._finish(consumer):
                self._wait(stop)
            return
        want = max(1, min(self.settings.poll_max_records, self.settings.max_part_rows))
        timeout = self.settings.poll_timeout_s
        if self._uncommitted_since is not None:
            due_in = self._uncommitted_since + self.settings.flush_interval_s - time.monotonic()
            timeout = min(timeout, max(due_in, 0.0))
        try:
            records = consumer.poll(want, timeout)
        except BackendUnavailable as exc:
            self._failed("poll", exc)
            if self._due():
                # Write what was gathered: the commit will wait for the backend.
                self.flush(consumer)
            self._wait(stop)
            return
        self._up()
        self.connected.set()
        self._take(records)
        drained = len(records) < want
        if drained:
            self.caught_up.set()
        self.metrics.caught_up.set(1 if drained else 0)
        if self._due():
            self.flush(consumer)
        self._retention()
        if drained and records and stop is not None:
            self._linger(stop)

    def _linger(self, stop: threading.Event) -> None:
        """Waits ``poll_linger_s`` (or until the next flush is due) before polling again."""
        wait = self.settings.poll_linger_s
        if self._uncommitted_since is not None:
            due_in = self._uncommitted_since + self.settings.flush_interval_s - time.monotonic()
            wait = min(wait, max(due_in, 0.0))
        if wait > 0:
            stop.wait(wait)

    def _take(self, records: list[Record]) -> None:
        if not records:
            self.metrics.lag.set(0)
            return
        if self._uncommitted_since is None:
            self._uncommitted_since = time.monotonic()
        counts: dict[AddResult, int] = {}
        for record in records:
            result = self.batch.add(record)
            counts[result] = counts.get(result, 0) + 1
        for result, count in counts.items():
            self.metrics.events.labels(result.value).inc(count)
            self.stats.read[result.value] = self.stats.read.get(result.value, 0) + count
        if counts.get(AddResult.INVALID):
            log.warning(
                "decision sink skipped %d record(s) that are not events (last at %s)",
                counts[AddResult.INVALID],
                records[-1].position,
            )
        newest = self._newest_event_us(records[-1])
        if newest is not None:
            self.metrics.lag.set(max(time.time() - newest / 1e6, 0.0))
        self.metrics.pending.set(self.batch.rows)

    @staticmethod
    def _newest_event_us(record: Record) -> int | None:
        try:
            envelope = record.envelope()
        except Exception:
            return None
        if envelope.HasField("decision"):
            ts = envelope.decision.decided_at
        elif envelope.HasField("outcome"):
            ts = envelope.outcome.received_at
        else:
            return None
        return ts.seconds * 1_000_000 + ts.nanos // 1000 if ts.seconds else None

    def _due(self) -> bool:
        if self._uncommitted_since is None:
            return False
        if self.batch.rows >= self.settings.max_part_rows:
            return True
        return time.monotonic() - self._uncommitted_since >= self.settings.flush_interval_s

    # -- flush and commit ------------------------------------------------------------------

    def flush(self, consumer: Consumer) -> bool:
        """Writes the gathered rows as parts and commits; False if either must be retried."""
        if self.batch.rows and self._flush_in_progress is None:
            flush = self._next_flush
            parts = tuple(
                str(self.part_path(key, flush).relative_to(self.root))
                for key in sorted(self.batch.buffers)
            )
            entry = writer.JournalEntry(flush, parts)
            try:
                self.journal.begin(entry)
            except OSError as exc:
                self._failed("write", exc)
                return False
            self._next_flush = flush + 1
            self._flush_in_progress = entry
            self._flush_started = time.monotonic()
        elif self._flush_in_progress is None:
            self._commit_pending = self._uncommitted_since is not None
            self._flush_started = time.monotonic()
        return self._finish(consumer)

    def part_path(self, key: tuple[layout.Kind, int], flush: int) -> Path:
        """Where flush number ``flush`` writes the part of one table and day."""
        kind, day = key
        day_dir = layout.table_path(self.root, kind) / layout.day_name(layout.day_of_index(day))
        return day_dir / layout.part_name(flush, self.name)

    def _finish(self, consumer: Consumer) -> bool:
        entry = self._flush_in_progress
        if entry is not None:
            oldest = self.batch.oldest_event_us
            try:
                for key in sorted(self.batch.buffers):
                    self._write(key, entry.flush)
            except OSError as exc:
                self._failed("write", exc)
                return False
            self._failures.recovered("write")
            if oldest is not None:
                self.metrics.write_delay.observe(max(time.time() - oldest / 1e6, 0.0))
            self._flush_in_progress = None
            self._commit_pending = True
            self.metrics.pending.set(self.batch.rows)
        if self._commit_pending:
            try:
                consumer.commit()
            except BackendUnavailable as exc:
                self._failed("commit", exc)
                return False
            self._up()
            self._commit_pending = False
            self._uncommitted_since = None
            now = time.time()
            self.stats.flushes += 1
            self.metrics.flushed(now)
            self.metrics.flush_seconds.observe(time.monotonic() - self._flush_started)
        return True

    def _write(self, key: tuple[layout.Kind, int], flush: int) -> None:
        buffer = self.batch.buffers[key]
        final = self.part_path(key, flush)
        size = writer.write_part(buffer.to_table(), final, self.settings.compression)
        kind = key[0]
        self.metrics.written.labels(kind).inc(buffer.rows)
        self.metrics.parts.labels(kind).inc()
        self.metrics.bytes.inc(size)
        self.stats.written += buffer.rows
        self.stats.parts += 1
        self.batch.take(key)

    def _close(self, consumer: Consumer) -> None:
        """On stop: read what is on the log already, write it, commit; bounded in time."""
        deadline = time.monotonic() + self.settings.close_timeout_s
        want = max(1, min(self.settings.poll_max_records, self.settings.max_part_rows))
        while time.monotonic() < deadline:
            if self._flush_in_progress is not None or self._commit_pending:
                if self._finish(consumer):
                    continue
                time.sleep(min(self._backoff.current_s, max(deadline - time.monotonic(), 0.0)))
                continue
            try:
                records = consumer.poll(want, min(0.2, max(deadline - time.monotonic(), 0.0)))
            except BackendUnavailable as exc:
                self._failed("poll", exc)
                break
            self._take(records)
            if self.batch.rows >= self.settings.max_part_rows:
                self.flush(consumer)
            elif len(records) < want:
                break
        while time.monotonic() < deadline and not self.flush(consumer):
            time.sleep(min(self._backoff.current_s, max(deadline - time.monotonic(), 0.0)))
        if self.batch.rows or self._commit_pending or self._flush_in_progress:
            log.warning(
                "decision sink stopped with %d event(s) not written or not committed: "
                "they are read again on the next start",
                self.batch.rows,
            )

    # -- helpers ---------------------------------------------------------------------------

    def _count_failure(self, operation: str) -> None:
        self.metrics.errors.labels(operation).inc()
        if operation in ("poll", "commit", "connect"):
            self.metrics.backend_up.set(0)

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._failures.failed(operation, exc)

    def _up(self) -> None:
        self.metrics.backend_up.set(1)
        self._backoff.reset()
        for operation in ("connect", "poll", "commit"):
            self._failures.recovered(operation)

    def _wait(self, stop: threading.Event | None) -> None:
        delay = self._backoff.take()
        if stop is None:
            time.sleep(delay)
        else:
            stop.wait(delay)

    def _retention(self) -> None:
        days = self.settings.retention_days
        now = time.monotonic()
        if days is None or now - self._last_retention < _RETENTION_CHECK_S:
            return
        self._last_retention = now
        delete_before(self.root, datetime.now(UTC).date() - timedelta(days=days))


def delete_before(root: Path, first_kept: date) -> list[Path]:
    """Deletes the day partitions of both tables older than ``first_kept``; returns them."""
    deleted = []
    for kind in layout.KINDS:
        for day, day_dir in layout.day_dirs(root, kind):
            if day >= first_kept:
                break
            shutil.rmtree(day_dir, ignore_errors=True)
            deleted.append(day_dir)
    if deleted:
        log.info("decision log retention deleted %d day partition(s)", len(deleted))
    return deleted
