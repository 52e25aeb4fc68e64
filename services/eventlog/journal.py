"""The journal: a producer that makes every event durable on local disk before it returns.

``JournalProducer`` has the ``Producer``'s API, but ``append`` writes the event to this
process's journal file (``journal-<pid>-<random>.log`` under ``journal_path``, ``flock``ed
while the process lives) before it returns, so the caller can answer knowing the event
survives its own crash: the gateway appends a decision before it sends the answer. A sender
thread delivers the journal to the backend in order, from a cursor kept in the file's
header, and never from memory: while the backend is down the journal simply grows, and it
is emptied once everything in it has been delivered.

Durability: with ``sync="write"`` an event is in the page cache when ``append`` returns: it
survives any crash of the process (SIGKILL, OOM), not a crash of the machine. With
``sync="fsync"`` the caller may also await ``durable``: a sync thread runs ``fdatasync``
whenever there is something to sync and wakes every caller its sync covered (group
commit), so the event then survives a power loss on a disk that honours flushes.

Exactly once: a journal nobody holds belongs to a process that is gone; the next producer
on the same folder (a restarted gateway, or another replica within ``_ORPHAN_SCAN_S``)
adopts it and delivers what follows its cursor. The dead process may have delivered some
of that already (it died between a write and the cursor's update), so before delivering
the adopter reads the log from the position the header names (where the dead process's
next records would go) and leaves out every event whose id is already there. The same
check follows a write that failed or timed out, whose records may have been stored. It
needs a backend that can be read back (``PositionedWriter``: the file log, Redis); on
Kafka such events are delivered again, and consumers drop the repeat by event id.

Records: a frame (``framing``) whose value starts with a kind byte. ``D``: an event.
``P`` + token: an event whose final form follows later (a decision whose shadow score is
still being computed when the answer goes out); ``C`` + token: that final form. The sender
delivers a ``P`` in its final form, holding the journal up to ``_HOLD_S`` for it, else as
it was written; an adopter does the same with the ``C`` records it finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

from fraud.v1 import events_pb2
from services.eventlog.events import event_id_of, key_of
from services.eventlog.journal_file import (
    KIND_EVENT,
    KIND_FINAL,
    KIND_PENDING,
    Doubt,
    JournalEntry,
    JournalFile,
    record_frame,
)
from services.eventlog.metrics import EventLogMetrics
from services.eventlog.producer import ProducerClosedError, ProducerStats
from services.eventlog.records import (
    BackendUnavailable,
    KeyValue,
    LogWriter,
    PositionedWriter,
)
from services.eventlog.settings import EventLogSettings
from services.eventlog.spill import SpillFile

log = logging.getLogger(__name__)

SyncMode = Literal["write", "fsync"]
"""How durable an appended event is when ``append`` returns (``durable`` awaited with fsync)."""

_RESET_BYTES = 1024 * 1024
"""Once everything is delivered, a journal at least this large is emptied."""
_HOLD_S = 1.0
"""Longest the sender waits for the final form of a pending event before it sends it as is."""
_ORPHAN_SCAN_S = 5.0
_IDLE_S = 0.5
_ACTIVE_S = 0.25


@dataclass
class _Waiter:
    """A caller waiting for its bytes to be synced."""

    written: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None] = field(repr=False)


class JournalProducer:
    """Writes each event to the journal before returning; delivers the journal in order."""

    def __init__(
        self,
        settings: EventLogSettings,
        writer_factory: Callable[[], LogWriter],
        metrics: EventLogMetrics | None = None,
        sync: SyncMode = "write",
    ) -> None:
        self._settings = settings
        self._writer_factory = writer_factory
        self._writer: LogWriter | None = None
        self._positioned = False
        """Whether the writer is a ``PositionedWriter``: asked once, as a runtime protocol check
        costs tens of microseconds and the question came twice a delivery."""
        self._metrics = metrics or EventLogMetrics.default()
        self._sync_mode: SyncMode = sync
        self._batch_max = settings.batch_max_events
        self._linger_s = settings.linger_ms / 1e3
        self._own = JournalFile.create(settings.journal_path)
        self._orphans = JournalFile.adopt_orphans(settings.journal_path, {self._own.path})
        # Spill files a memory-buffered producer left behind (delivered at least once).
        self._spills = SpillFile.adopt_orphans(settings.spill_path, settings.spill_max_bytes)
        self._tokens = itertools.count(1)
        self._pending_lock = threading.Lock()
        self._pending_since: dict[int, float] = {}
        self._appended = 0
        self._settled = 0
        self._settled_cv = threading.Condition()
        self._stats_lock = threading.Lock()
        self._delivered = 0
        self._replayed = 0
        self._dropped = 0
        self._reported = (0, 0, 0)
        self._last_report = 0.0
        self._last_drop_log = 0.0
        self._last_orphan_scan = time.monotonic()
        self._up = True
        self._down_until = 0.0
        self._backoff = settings.retry_backoff_s
        self._closing = False
        self._closed = False
        self._close_deadline = 0.0
        self._wake = threading.Event()
        self._idle = False
        self._holding = False
        self._last_busy = 0.0
        self._unsynced = False
        self._synced = 0
        self._sync_cv = threading.Condition()
        self._waiters: list[_Waiter] = []
        self._thread = threading.Thread(target=self._run, name="eventlog-journal", daemon=True)
        self._thread.start()
        self._sync_thread: threading.Thread | None = None
        if sync == "fsync":
            self._sync_thread = threading.Thread(
                target=self._sync_loop, name="eventlog-journal-sync", daemon=True
            )
            self._sync_thread.start()

    # --- the caller's side -------------------------------------------------------------

    @property
    def sync_mode(self) -> SyncMode:
        """Whether ``durable`` waits for an fsync (``fsync``) or returns at once (``write``)."""
        return self._sync_mode

    def append(self, envelope: events_pb2.EventEnvelope) -> int:
        """Writes one event to the journal; returns the journal's written bytes after it (for
        ``durable``), or -1 when the disk could not take it (counted and logged)."""
        return self.append_record(key_of(envelope), envelope.SerializeToString())

    def append_record(self, key: bytes, value: bytes) -> int:
        """``append`` of an already serialized event."""
        return self._write(record_frame(key, KIND_EVENT, value), counted=True)

    def append_pending(self, envelope: events_pb2.EventEnvelope) -> tuple[int, int]:
        """Writes an event whose final form ``complete`` gives later; returns (token, written
        bytes). Delivered as written if the final form does not come within ``_HOLD_S``."""
        token = next(self._tokens)
        with self._pending_lock:
            self._pending_since[token] = time.monotonic()
        frame = record_frame(key_of(envelope), KIND_PENDING, envelope.SerializeToString(), token)
        return token, self._write(frame, counted=True)

    def complete(self, token: int, envelope: events_pb2.EventEnvelope) -> None:
        """The final form of a pending event (too late once it was sent as written)."""
        value = envelope.SerializeToString()
        with self._pending_lock:
            if token not in self._pending_since:
                return
            self._own.completions[token] = value
        self._write(record_frame(key_of(envelope), KIND_FINAL, value, token), counted=False)

    def _write(self, frame: bytes, counted: bool) -> int:
        if self._closing:
            raise ProducerClosedError("the event log producer is closed")
        try:
            written = self._own.append(frame)
        except OSError as exc:
            if counted:
                # Counted as appended and settled at once, so that flushes still wait for
                # what was appended after it.
                self._appended += 1
                with self._stats_lock:
                    self._dropped += 1
                self._settle(1)
            now = time.monotonic()
            if now - self._last_drop_log >= 10.0:
                self._last_drop_log = now
                log.error("eventlog journal: an event could not be written: %s", exc)
            return -1
        if counted:
            self._appended += 1
        if self._idle:
            # Only after a quiet spell: while events flow the sender polls by itself.
            self._idle = False
            self._wake.set()
        return written

    async def durable(self, written: int, timeout_s: float) -> bool:
        """Waits until the journal is synced past ``written`` (``append``'s return); True at
        once with ``sync="write"``. False on timeout or when the event was not written."""
        if written < 0:
            return False
        if self._sync_mode == "write" or self._synced >= written:
            return True
        loop = asyncio.get_running_loop()
        waiter = _Waiter(written, loop, loop.create_future())
        with self._sync_cv:
            if self._synced >= written:
                return True
            self._waiters.append(waiter)
            self._sync_cv.notify()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except TimeoutError:
            return False
        return True

    def flush(self, timeout_s: float | None = None) -> bool:
        """Waits until every event appended so far is delivered (or dropped); False on timeout."""
        target = self._appended
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wake.set()
        with self._settled_cv:
            while self._settled < target:
                if not self._thread.is_alive():
                    return False
                remaining = _IDLE_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._settled_cv.wait(min(remaining, _IDLE_S))
        return True

    def close(self, timeout_s: float | None = None) -> None:
        """Stops taking events, delivers for up to ``timeout_s`` (default: the settings'), and
        leaves the rest in the journal for the next producer."""
        if self._closed:
            return
        timeout = self._settings.close_timeout_s if timeout_s is None else timeout_s
        self._close_deadline = time.monotonic() + timeout
        self._closing = True
        self._wake.set()
        self._thread.join()
        if self._sync_thread is not None:
            with self._sync_cv:
                self._sync_cv.notify_all()
            self._sync_thread.join()
        self._closed = True

    async def aflush(self, timeout_s: float | None = None) -> bool:
        """``flush`` from asyncio, off the event loop."""
        return await asyncio.to_thread(self.flush, timeout_s)

    async def aclose(self, timeout_s: float | None = None) -> None:
        """``close`` from asyncio, off the event loop."""
        await asyncio.to_thread(self.close, timeout_s)

    @property
    def stats(self) -> ProducerStats:
        """A snapshot of the counts (``buffered``: events in the journal not yet delivered)."""
        with self._stats_lock:
            return ProducerStats(
                appended=self._appended,
                delivered=self._delivered,
                spilled=0,
                dropped=self._dropped,
                buffered=max(0, self._appended - self._settled),
                spill_pending=self._orphan_records(),
                replayed=self._replayed,
                backend_up=self._up,
            )

    # --- the sync thread ---------------------------------------------------------------

    def _sync_loop(self) -> None:
        """Group commit: one fdatasync covers every append made before it started."""
        while True:
            with self._sync_cv:
                while self._own.written <= self._synced and not self._closed_for_sync():
                    self._sync_cv.wait(_IDLE_S)
                if self._closed_for_sync():
                    # Closing released (synced) or removed (delivered) the journal.
                    self._synced = self._own.written
                    done, self._waiters = self._waiters, []
                    target = None
                else:
                    target = self._own.written
            if target is not None:
                try:
                    self._own.sync()
                except OSError:
                    log.exception("eventlog journal: fsync failed")
                    time.sleep(0.1)
                    continue
                with self._sync_cv:
                    self._synced = max(self._synced, target)
                    done = [w for w in self._waiters if w.written <= target]
                    self._waiters = [w for w in self._waiters if w.written > target]
            for waiter in done:
                with contextlib.suppress(RuntimeError):  # its loop has closed
                    waiter.loop.call_soon_threadsafe(_resolve, waiter.future)
            if target is None:
                return

    def _closed_for_sync(self) -> bool:
        return self._closing and not self._thread.is_alive()

    # --- the sender thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                worked = self._step()
            except Exception:  # a bug must not stop delivery for good
                log.exception("eventlog journal: unexpected error; retrying")
                worked = False
                time.sleep(self._settings.retry_backoff_s)
            self._report()
            if self._closing:
                now = time.monotonic()
                drained = self._own.cursor >= self._own.end and not self._orphans
                if drained or now >= self._close_deadline or now < self._down_until:
                    break
                if not worked:
                    time.sleep(min(self._linger_s, 0.01))
                continue
            if not worked:
                self._idle_wait()
        self._shutdown()

    def _idle_wait(self) -> None:
        """Waits for records to send. While events keep coming (or a pending record is held)
        the sender polls every ``linger_ms``, so an append never has to wake it; after
        ``_ACTIVE_S`` without events it syncs the backend and sleeps until an append wakes
        it, a retry is due, or ``_IDLE_S`` passes."""
        now = time.monotonic()
        until_retry = self._down_until - now
        if until_retry > 0:
            time.sleep(min(until_retry, self._linger_s))
            return
        if self._holding or now - self._last_busy < _ACTIVE_S:
            time.sleep(self._linger_s)
            return
        if self._unsynced and self._writer is not None:
            self._unsynced = False
            try:
                self._writer.sync()
            except Exception:
                log.exception("eventlog journal: syncing the backend failed")
        self._wake.clear()
        self._idle = True
        if self._own.cursor < self._own.end or self._orphans or self._spills:
            self._idle = False
            return
        woken = self._wake.wait(_IDLE_S)
        self._idle = False
        if woken and not self._closing:
            time.sleep(self._linger_s)

    def _step(self) -> bool:
        """One unit of work; False when there was nothing it could do now."""
        self._scan_orphans()
        if time.monotonic() < self._down_until:
            return False
        if self._spills:
            return self._deliver_spill(self._spills[0])
        journal = self._orphans[0] if self._orphans else self._own
        worked = self._deliver(journal)
        if journal.adopted and journal.cursor >= journal.end:
            journal.remove()
            self._orphans.remove(journal)
            return True
        if not journal.adopted and journal.end >= _RESET_BYTES and not worked:
            journal.reset()
        return worked

    def _deliver(self, journal: JournalFile) -> bool:
        """Sends the next batch of ``journal``; False when there was none (or it failed)."""
        self._holding = False
        doubt = journal.doubt
        if doubt is not None and doubt.stored is None and not self._read_back(journal, doubt):
            return False
        entries = journal.read(journal.cursor, self._batch_max)
        if not entries:
            return False
        batch, upto, settled = self._resolve(journal, entries)
        if upto == journal.cursor:
            self._holding = True  # a pending record waits for its final form
            return False
        self._open_writer()
        if self._positioned and not journal.adopted and not journal.position:
            # Where this producer's first records will go, before any is written.
            position = self._writer_position()
            if not position:
                return False  # the backend cannot be reached: later
            journal.commit(journal.cursor, position)
        if batch:
            self._last_busy = time.monotonic()
            if self._send([kv for kv, _ in batch]):
                # Some or all may be stored: the next attempt reads the log back first.
                if doubt is None or upto > doubt.end:
                    journal.doubt = Doubt(upto)
                else:
                    doubt.stored = None
                return False
        # While records in doubt remain, keep the position they were checked from: the
        # next reader of this journal must look there too.
        done = journal.doubt is None or upto >= journal.doubt.end
        journal.commit(upto, self._writer_position() if done else journal.position)
        if done:
            journal.doubt = None
        with self._stats_lock:
            if journal.adopted:
                self._replayed += len(batch)
            else:
                self._delivered += len(batch)
        if journal.adopted:
            journal.pending_records = max(0, journal.pending_records - settled)
        else:
            self._settle(settled)
        return True

    def _resolve(
        self, journal: JournalFile, entries: Sequence[JournalEntry]
    ) -> tuple[list[tuple[KeyValue, int]], int, int]:
        """The batch to send from ``entries``: each pending record in its final form (or
        as written, once held long enough), final forms left out (sent in their pending
        record's place), records the log already holds left out. Returns the batch, the
        offset it reaches and how many appended events it settles."""
        batch: list[tuple[KeyValue, int]] = []
        upto, settled = journal.cursor, 0
        doubt = journal.doubt
        now = time.monotonic()
        for entry in entries:
            value = entry.value
            if entry.kind == KIND_FINAL:
                upto = entry.end
                continue
            if entry.kind == KIND_PENDING:
                with self._pending_lock:
                    final = journal.completions.pop(entry.token, None)
                    since = self._pending_since.get(entry.token) if not journal.adopted else None
                    waiting = since is not None and now - since < _HOLD_S and not self._closing
                    if final is None and waiting:
                        break  # its final form is still to come
                    self._pending_since.pop(entry.token, None)
                if final is not None:
                    value = final
            upto = entry.end
            settled += 1
            stored = doubt.stored if doubt is not None and entry.end <= doubt.end else None
            if stored and event_id_of(value) in stored:
                continue
            batch.append(((entry.key, value), entry.end))
        return batch, upto, settled

    def _read_back(self, journal: JournalFile, doubt: Doubt) -> bool:
        """Finds which of the records in doubt the log already holds, reading it from the
        journal's position (none on a backend that cannot be read back: they are sent
        again). False when the backend could not be read."""
        ids: set[str] = set()
        pos = journal.cursor
        while pos < doubt.end:
            entries = [e for e in journal.read(pos, self._batch_max) if e.end <= doubt.end]
            if not entries:
                break
            for entry in entries:
                if entry.kind == KIND_FINAL and journal.adopted:
                    journal.completions[entry.token] = entry.value
                ids.add(event_id_of(entry.value))
            pos = entries[-1].end
        ids.discard("")
        try:
            writer = self._open_writer()
        except Exception as exc:
            self._mark_down(repr(exc))
            return False
        if not isinstance(writer, PositionedWriter):
            log.warning(
                "eventlog journal: %d event(s) of %s may be in the log already; the %s log "
                "cannot be read back, so they are sent again (consumers drop repeats by id)",
                len(ids),
                journal.path.name,
                self._settings.backend,
            )
            doubt.stored = set()
            return True
        found: set[str] = set()
        try:
            for value in writer.values_since(journal.position):
                event_id = event_id_of(value)
                if event_id in ids:
                    found.add(event_id)
                    if len(found) == len(ids):
                        break
        except BackendUnavailable as exc:
            self._mark_down(str(exc))
            return False
        doubt.stored = found
        if found:
            log.info(
                "eventlog journal: %d of %d event(s) in doubt in %s were in the log already",
                len(found),
                len(ids),
                journal.path.name,
            )
        return True

    def _deliver_spill(self, spill: SpillFile) -> bool:
        """Delivers an adopted spill file of a memory-buffered producer (at least once)."""
        records, nbytes = spill.peek(self._batch_max)
        if not records:
            spill.remove()
            self._spills.remove(spill)
            return True
        if self._send(records):
            return False
        spill.consume(len(records), nbytes)
        with self._stats_lock:
            self._replayed += len(records)
        return True

    def _open_writer(self) -> LogWriter:
        if self._writer is None:
            self._writer = self._writer_factory()
            self._positioned = isinstance(self._writer, PositionedWriter)
        return self._writer

    def _writer_position(self) -> str:
        """Where the writer's next records go ('' when it cannot say or be reached)."""
        writer = self._writer
        if self._positioned:
            try:
                return cast(PositionedWriter, writer).position()
            except BackendUnavailable as exc:
                self._mark_down(str(exc))
        return ""

    def _send(self, batch: Sequence[KeyValue]) -> bool:
        """Writes a batch; True when it failed (some or all records may be stored)."""
        try:
            self._open_writer().write(batch)
        except BackendUnavailable as exc:
            self._mark_down(str(exc))
            return True
        except Exception as exc:
            log.exception("eventlog journal: backend write failed")
            self._mark_down(repr(exc))
            return True
        if not self._up:
            log.info("eventlog backend %s is back", self._settings.backend)
        self._unsynced = True
        self._up = True
        self._backoff = self._settings.retry_backoff_s
        self._down_until = 0.0
        return False

    def _mark_down(self, reason: str) -> None:
        if self._up:
            log.warning(
                "eventlog backend %s unavailable (%s); events wait in %s",
                self._settings.backend,
                reason,
                self._own.path,
            )
        self._up = False
        self._down_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._settings.retry_backoff_max_s)

    def _scan_orphans(self) -> None:
        now = time.monotonic()
        if now - self._last_orphan_scan < _ORPHAN_SCAN_S or self._closing:
            return
        self._last_orphan_scan = now
        mine = {j.path for j in self._orphans} | {self._own.path}
        self._orphans.extend(JournalFile.adopt_orphans(self._settings.journal_path, mine))
        held = {s.path for s in self._spills}
        found = SpillFile.adopt_orphans(self._settings.spill_path, self._settings.spill_max_bytes)
        self._spills.extend(s for s in found if s.path not in held)

    def _orphan_records(self) -> int:
        """Events of adopted journals and spill files not yet delivered."""
        return sum(j.pending_records for j in self._orphans) + sum(
            s.pending_count for s in self._spills
        )

    def _settle(self, n: int) -> None:
        with self._settled_cv:
            self._settled += n
            self._settled_cv.notify_all()

    def _report(self, force: bool = False) -> None:
        """Brings the Prometheus metrics up to date, at most every 250 ms."""
        now = time.monotonic()
        if not force and now - self._last_report < 0.25:
            return
        self._last_report = now
        m = self._metrics
        with self._stats_lock:
            counts = (self._appended, self._delivered + self._replayed, self._dropped)
        for counter, new, old in zip(
            (m.appended, m.delivered, m.dropped), counts, self._reported, strict=True
        ):
            if new > old:
                counter.inc(new - old)
        self._reported = counts
        m.buffered.set(max(0, self._appended - self._settled))
        m.spill_pending.set(self._orphan_records())
        m.backend_up.set(1 if self._up else 0)

    def _shutdown(self) -> None:
        """Removes a fully delivered journal; leaves an undelivered one for the next producer."""
        own = self._own
        if own.cursor >= own.end:
            own.remove()
        else:
            log.warning(
                "eventlog journal closing with %d byte(s) undelivered; kept in %s",
                own.pending_bytes,
                own.path,
            )
            own.release()
        for orphan in self._orphans:
            orphan.release()
        self._orphans = []
        for spill in self._spills:
            spill.release()
        self._spills = []
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                log.exception("eventlog journal: closing the backend failed")
        self._report(force=True)
        with self._settled_cv:
            self._settled_cv.notify_all()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
