"""The producer: a cheap, never-blocking append on the caller's thread; the I/O on a sender thread.

``append`` serializes the envelope and puts it in a bounded in-memory buffer; that is all
the caller pays (no lock, no system call when the sender is busy). A sender thread writes
batches to the backend in order. When the backend fails or is too slow, the sender moves
the events to a local spill file and, once the backend answers again, delivers the spill
file first and then the buffer, so per-key order holds across an outage. Spill files of
producers that are gone are adopted and delivered first. An event is dropped only when the
spill file cannot take it (disk full or the configured cap), counted and logged.

``close`` delivers what it can within its timeout and leaves the rest in the spill file,
which the next producer on the same spill folder delivers: SIGTERM loses nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fraud.v1 import events_pb2
from services.eventlog.metrics import EventLogMetrics
from services.eventlog.records import BackendUnavailable, EventLogError, KeyValue, LogWriter
from services.eventlog.settings import EventLogSettings
from services.eventlog.spill import SpillFile

log = logging.getLogger(__name__)

_CHORE_INTERVAL_S = 0.5
_ACTIVE_S = 0.25
_REPORT_INTERVAL_S = 0.25
_ORPHAN_SCAN_S = 10.0
_DROP_LOG_INTERVAL_S = 10.0


class ProducerClosedError(EventLogError):
    """``append`` after ``close``."""


@dataclass(frozen=True)
class ProducerStats:
    """Counts of one producer since it started."""

    appended: int
    """Events handed to ``append``."""
    delivered: int
    """This producer's events stored by the backend (directly or from its spill file)."""
    spilled: int
    """Events written to the spill file."""
    dropped: int
    """Events lost because the spill file could not take them."""
    buffered: int
    """Events in memory now."""
    spill_pending: int
    """Events in spill files (this producer's and adopted ones) not yet delivered."""
    replayed: int
    """Events of adopted spill files (producers that are gone) delivered."""
    backend_up: bool
    """Whether the last backend write succeeded."""


class Producer:
    """Appends events to the log without blocking; see the module docstring."""

    def __init__(
        self,
        settings: EventLogSettings,
        writer_factory: Callable[[], LogWriter],
        metrics: EventLogMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._writer_factory = writer_factory
        self._writer: LogWriter | None = None
        self._metrics = metrics or EventLogMetrics.default()
        self._mem: deque[KeyValue] = deque()
        self._max = settings.buffer_max_events
        self._batch_max = settings.batch_max_events
        self._linger_s = settings.linger_ms / 1e3
        self._seq = itertools.count(1)
        self._appended = 0
        self._idle = False
        self._wake = threading.Event()
        self._closing = False
        self._close_deadline = 0.0
        self._closed = False
        self._settled = 0
        self._settled_cv = threading.Condition()
        self._stats_lock = threading.Lock()
        self._delivered = 0
        self._spilled = 0
        self._dropped = 0
        self._replayed = 0
        self._reported = (0, 0, 0, 0, 0)
        self._last_report = 0.0
        self._last_busy = 0.0
        self._unsynced = False
        self._last_drop_log = 0.0
        self._spill_lock = threading.Lock()
        self._own_spill: SpillFile | None = None
        self._orphans: list[SpillFile] = SpillFile.adopt_orphans(
            settings.spill_path, settings.spill_max_bytes
        )
        self._last_orphan_scan = time.monotonic()
        self._down_until = 0.0
        self._backoff = settings.retry_backoff_s
        self._up = True
        self._thread = threading.Thread(target=self._run, name="eventlog-producer", daemon=True)
        self._thread.start()

    # --- the caller's side -------------------------------------------------------------

    def append(self, envelope: events_pb2.EventEnvelope) -> None:
        """Queues one event, keyed by its card (decision) or transaction (outcome).
        Never blocks and never raises for backend trouble."""
        kind = envelope.WhichOneof("event")
        if kind == "decision":
            key = envelope.decision.card_id
        elif kind == "outcome":
            key = envelope.outcome.transaction_id
        else:
            raise ValueError("the envelope carries no event")
        self.append_record(key.encode(), envelope.SerializeToString())

    def append_record(self, key: bytes, value: bytes) -> None:
        """Queues one already serialized record under ``key``."""
        if self._closing:
            raise ProducerClosedError("the event log producer is closed")
        self._appended = next(self._seq)
        if len(self._mem) >= self._max:
            # The sender is stuck (a slow write within its timeout) and memory is full:
            # rather than block or drop, write to the spill file from here.
            self._spill([(key, value)])
            return
        self._mem.append((key, value))
        if self._idle:
            self._idle = False
            self._wake.set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Waits until every event appended so far is delivered (or dropped); False on timeout.
        Spilled events count once the backend has them."""
        target = self._appended
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wake.set()
        with self._settled_cv:
            while self._settled < target:
                if not self._thread.is_alive():
                    return False
                remaining = _CHORE_INTERVAL_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._settled_cv.wait(min(remaining, _CHORE_INTERVAL_S))
        return True

    def close(self, timeout_s: float | None = None) -> None:
        """Stops taking events, delivers for up to ``timeout_s`` (default: the settings'),
        leaves the rest in the spill file for the next producer, and closes the backend.
        Returns at once while the backend is known to be down."""
        if self._closed:
            return
        timeout = self._settings.close_timeout_s if timeout_s is None else timeout_s
        self._close_deadline = time.monotonic() + timeout
        self._closing = True
        self._wake.set()
        self._thread.join()
        self._closed = True

    async def aflush(self, timeout_s: float | None = None) -> bool:
        """``flush`` from asyncio, off the event loop."""
        return await asyncio.to_thread(self.flush, timeout_s)

    async def aclose(self, timeout_s: float | None = None) -> None:
        """``close`` from asyncio, off the event loop."""
        await asyncio.to_thread(self.close, timeout_s)

    @property
    def stats(self) -> ProducerStats:
        """A snapshot of the counts."""
        with self._stats_lock:
            return ProducerStats(
                appended=self._appended,
                delivered=self._delivered,
                spilled=self._spilled,
                dropped=self._dropped,
                buffered=len(self._mem),
                spill_pending=self._spill_pending(),
                replayed=self._replayed,
                backend_up=self._up,
            )

    # --- the sender thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                worked = self._step()
            except Exception:  # a bug must not stop delivery for good
                log.exception("eventlog producer: unexpected error; retrying")
                worked = False
                time.sleep(self._settings.retry_backoff_s)
            self._report()
            if self._closing:
                now = time.monotonic()
                # While the backend is known to be down, waiting out the timeout gains nothing:
                # what is left goes to the spill file at once.
                if self._drained() or now >= self._close_deadline or now < self._down_until:
                    break
                continue
            if not worked:
                self._idle_wait()
        self._shutdown()

    def _step(self) -> bool:
        """One unit of work; False when there was nothing it could do now."""
        self._scan_orphans()
        spill = self._next_spill()
        if spill is not None:
            self._mem_to_spill()  # memory stays behind the spill files: per-key order
            if time.monotonic() < self._down_until:
                return False
            records, nbytes = spill.peek(self._batch_max)
            if not records:
                self._retire(spill)
                return True
            self._last_busy = time.monotonic()
            if self._send(records) is not None:
                return False
            spill.consume(len(records), nbytes)
            with self._stats_lock:
                if spill.adopted:
                    self._replayed += len(records)
                else:
                    self._delivered += len(records)
            if not spill.adopted:
                self._settle(len(records))
            return True
        if not self._mem:
            return False
        if time.monotonic() < self._down_until:
            self._mem_to_spill()
            return False
        batch = self._take(self._batch_max)
        self._last_busy = time.monotonic()
        failed = self._send(batch)
        if failed is None:
            with self._stats_lock:
                self._delivered += len(batch)
            self._settle(len(batch))
            return True
        kept = [batch[i] for i in sorted(failed)]
        delivered = len(batch) - len(kept)
        if delivered:
            with self._stats_lock:
                self._delivered += delivered
            self._settle(delivered)
        self._spill(kept)
        self._mem_to_spill()
        return False

    def _send(self, batch: Sequence[KeyValue]) -> Sequence[int] | None:
        """Writes a batch; None on success, else the indexes that were not stored."""
        try:
            if self._writer is None:
                self._writer = self._writer_factory()
            self._writer.write(batch)
        except BackendUnavailable as exc:
            self._mark_down(str(exc))
            return exc.failed if exc.failed is not None else range(len(batch))
        except Exception as exc:
            log.exception("eventlog producer: backend write failed")
            self._mark_down(repr(exc))
            return range(len(batch))
        if not self._up:
            log.info("eventlog backend %s is back", self._settings.backend)
        self._unsynced = True
        self._up = True
        self._backoff = self._settings.retry_backoff_s
        self._down_until = 0.0
        return None

    def _mark_down(self, reason: str) -> None:
        if self._up:
            log.warning(
                "eventlog backend %s unavailable (%s); spilling to %s",
                self._settings.backend,
                reason,
                self._settings.spill_path,
            )
        self._up = False
        self._down_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._settings.retry_backoff_max_s)

    def _take(self, n: int) -> list[KeyValue]:
        mem = self._mem
        return [mem.popleft() for _ in range(min(n, len(mem)))]

    def _mem_to_spill(self) -> None:
        while self._mem:
            self._spill(self._take(self._batch_max))

    def _spill(self, records: list[KeyValue]) -> None:
        """Writes this producer's records to its spill file; drops what it cannot take."""
        if not records:
            return
        taken, error = 0, "the spill cap is reached or the disk is full"
        try:
            with self._spill_lock:
                if self._own_spill is None:
                    self._own_spill = SpillFile.create(
                        self._settings.spill_path, self._settings.spill_max_bytes
                    )
                taken = self._own_spill.append(records)
        except OSError as exc:
            error = str(exc)
        with self._stats_lock:
            self._spilled += taken
            self._dropped += len(records) - taken
        if taken == len(records):
            return
        self._settle(len(records) - taken)
        now = time.monotonic()
        if now - self._last_drop_log >= _DROP_LOG_INTERVAL_S:
            self._last_drop_log = now
            log.error(
                "eventlog producer: dropped %d event(s), %d in total: %s",
                len(records) - taken,
                self._dropped,
                error,
            )

    def _next_spill(self) -> SpillFile | None:
        """The spill file to deliver from next: adopted ones (older) first, then our own."""
        if self._orphans:
            return self._orphans[0]
        own = self._own_spill
        if own is not None and own.pending_bytes > 0:
            return own
        return None

    def _retire(self, spill: SpillFile) -> None:
        if spill.adopted:
            spill.remove()
            self._orphans.remove(spill)

    def _scan_orphans(self) -> None:
        now = time.monotonic()
        if now - self._last_orphan_scan < _ORPHAN_SCAN_S or self._closing:
            return
        self._last_orphan_scan = now
        mine = {s.path for s in self._orphans}
        if self._own_spill is not None:
            mine.add(self._own_spill.path)
        found = SpillFile.adopt_orphans(self._settings.spill_path, self._settings.spill_max_bytes)
        self._orphans.extend(s for s in found if s.path not in mine)

    def _settle(self, n: int) -> None:
        with self._settled_cv:
            self._settled += n
            self._settled_cv.notify_all()

    def _drained(self) -> bool:
        return not self._mem and self._next_spill() is None

    def _spill_pending(self) -> int:
        pending = sum(s.pending_count for s in self._orphans)
        if self._own_spill is not None:
            pending += self._own_spill.pending_count
        return pending

    def _idle_wait(self) -> None:
        """Waits for events to send. While events keep coming, the sender polls every
        ``linger_ms``, so that ``append`` never has to wake it (waking a thread costs the
        caller far more than the append itself) and each poll sends one batch. After
        ``_ACTIVE_S`` without events it sleeps until an append wakes it, a retry is due, or
        the chore interval passes."""
        now = time.monotonic()
        until_retry = self._down_until - now
        if now - self._last_busy < _ACTIVE_S:
            time.sleep(min(self._linger_s, until_retry) if until_retry > 0 else self._linger_s)
            return
        if self._unsynced and self._writer is not None:
            self._unsynced = False
            try:
                self._writer.sync()
            except Exception:
                log.exception("eventlog producer: syncing the backend failed")
        self._wake.clear()
        self._idle = True
        if self._mem and until_retry <= 0:
            self._idle = False
            return
        timeout = _CHORE_INTERVAL_S
        if until_retry > 0:
            timeout = min(timeout, until_retry)
        woken = self._wake.wait(timeout)
        self._idle = False
        if woken and self._linger_s > 0 and not self._closing:
            time.sleep(self._linger_s)

    def _report(self, force: bool = False) -> None:
        """Brings the Prometheus metrics up to date, from the sender thread, not per append,
        and at most every ``_REPORT_INTERVAL_S``."""
        now_s = time.monotonic()
        if not force and now_s - self._last_report < _REPORT_INTERVAL_S:
            return
        self._last_report = now_s
        m = self._metrics
        with self._stats_lock:
            now = (
                self._appended,
                self._delivered + self._replayed,
                self._spilled,
                self._dropped,
                0,
            )
        last = self._reported
        for counter, new, old in zip(
            (m.appended, m.delivered, m.spilled, m.dropped), now[:4], last[:4], strict=True
        ):
            if new > old:
                counter.inc(new - old)
        self._reported = now
        m.buffered.set(len(self._mem))
        m.spill_pending.set(self._spill_pending())
        m.backend_up.set(1 if self._up else 0)

    def _shutdown(self) -> None:
        """Leaves undelivered events in spill files for the next producer; closes the backend."""
        self._mem_to_spill()
        with self._spill_lock:
            own, self._own_spill = self._own_spill, None
        if own is not None:
            if own.pending_bytes > 0:
                log.warning(
                    "eventlog producer closing with %d event(s) undelivered; kept in %s",
                    own.pending_count,
                    own.path,
                )
                own.release()
            else:
                own.remove()
        for orphan in self._orphans:
            orphan.release()
        self._orphans = []
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                log.exception("eventlog producer: closing the backend failed")
        self._report(force=True)
        # Events kept in a spill file are safe but not delivered: wake waiting flushes.
        with self._settled_cv:
            self._settled_cv.notify_all()
