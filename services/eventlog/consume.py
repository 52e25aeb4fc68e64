"""The consume loop every reader of the event log runs: poll, apply, checkpoint, commit, on
one thread, until stopped; a failing part is retried after a backoff and logged once per
outage.

The monitor, the feature updater and the decision sink each subclass ``ConsumeLoop`` and
write only what is theirs: what one turn does (``turn``), which errors are whose
(``failure_of``) and what a stop leaves behind (``finish``). The order that makes them
exactly-once in effect is the same for all three and lives here: the position is committed
only after what was applied is saved (``commit_after``), so after a crash the log gives
again what followed the last commit and the reader skips what its checkpoint holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from services.eventlog.records import Consumer, Record

log = logging.getLogger(__name__)


class Failures:
    """Which parts of a loop are failing: each failure counted, each outage logged once,
    each recovery logged."""

    def __init__(self, owner: str, count: Callable[[str], None], retry_s: Callable[[], float]):
        self._owner = owner
        self._count = count
        self._retry_s = retry_s
        self._failing: set[str] = set()

    def failed(self, what: str, error: BaseException) -> None:
        """``what`` failed with ``error``; the loop retries it."""
        self._count(what)
        if what not in self._failing:
            self._failing.add(what)
            log.warning(
                "%s: %s failed; retrying every %.1f s",
                self._owner,
                what,
                self._retry_s(),
                extra={"error": f"{type(error).__name__}: {error}"},
            )

    def recovered(self, what: str) -> None:
        """``what`` works again."""
        if what in self._failing:
            self._failing.discard(what)
            log.info("%s: %s is back", self._owner, what)

    @property
    def failing(self) -> frozenset[str]:
        """The parts failing now."""
        return frozenset(self._failing)


class Backoff:
    """The wait before a retry: ``first_s``, doubled after each failure up to ``max_s``
    (no doubling without it), back to ``first_s`` once something worked."""

    def __init__(self, first_s: float, max_s: float | None = None) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._next_s = first_s

    @property
    def current_s(self) -> float:
        """The wait the next retry would take."""
        return self._next_s

    def take(self) -> float:
        """The wait of this retry; the next one's grows."""
        delay = self._next_s
        if self._max_s is not None:
            self._next_s = min(self._next_s * 2, self._max_s)
        return delay

    def reset(self) -> None:
        """Something worked: the next retry waits ``first_s`` again."""
        self._next_s = self._first_s


class ConsumeLoop:
    """Poll, apply, checkpoint and commit until stopped, with retries and their bookkeeping."""

    def __init__(
        self,
        name: str,
        open_consumer: Callable[[], Consumer],
        count_error: Callable[[str], None],
        backoff: Backoff,
    ) -> None:
        self._open_consumer = open_consumer
        self._consumer: Consumer | None = None
        self._backoff = backoff
        self._failures = Failures(name, count_error, lambda: self._backoff.current_s)
        self._uncommitted_since: float | None = None
        self._connected = False

    # -- what a subclass writes

    def turn(self, stop: threading.Event) -> float:
        """One turn of the loop; returns how long to wait before the next one."""
        raise NotImplementedError

    def failure_of(self, error: Exception) -> str | None:
        """The part ``error`` is a failure of (retried), or None to let it end the loop."""
        return None

    def on_failure(self, what: str) -> None:
        """Called after each failure of ``what`` (gauges, flags)."""

    def finish(self) -> None:
        """On stop: what was applied is saved and committed if it can be; the consumer is
        closed."""
        self.close_consumer()

    # -- the loop

    def run(self, stop: threading.Event) -> None:
        """Turns until ``stop`` is set, then ``finish``es. An error that is no part's
        failure ends the loop without ``finish``: nothing half applied is committed."""
        while not stop.is_set():
            try:
                wait = self.turn(stop)
            except Exception as error:
                what = self.failure_of(error)
                if what is None:
                    raise
                self._failures.failed(what, error)
                self.on_failure(what)
                stop.wait(self._backoff.take())
                continue
            if wait > 0:
                stop.wait(wait)
        self.finish()

    def consumer(self) -> Consumer:
        """The consumer, opened on first use (and again after a failure closed it)."""
        if self._consumer is None:
            self._consumer = self._open_consumer()
        return self._consumer

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Polls the log; a poll that answers is the log working again."""
        records = self.consumer().poll(max_records, timeout_s)
        self._connected = True
        self._failures.recovered("log")
        if records and self._uncommitted_since is None:
            self._uncommitted_since = time.monotonic()
        return records

    def checkpoint_due(self, interval_s: float, applied: int, max_events: int) -> bool:
        """Whether work applied but not committed is due a checkpoint: older than
        ``interval_s``, or ``applied`` events reached ``max_events``."""
        since = self._uncommitted_since
        if since is None:
            return False
        return time.monotonic() - since >= interval_s or applied >= max_events

    def commit_after(self, save: Callable[[], object], what: str = "state") -> float:
        """Saves what was applied (``save``: a failure of ``what``), then commits the log
        position; returns the seconds it took."""
        start = time.perf_counter()
        save()
        self._failures.recovered(what)
        self.consumer().commit()
        self._uncommitted_since = None
        return time.perf_counter() - start

    @property
    def uncommitted(self) -> bool:
        """Whether records were applied since the last commit."""
        return self._uncommitted_since is not None

    def close_consumer(self) -> None:
        """Leaves the group (errors logged: the log gives the rest again on restart)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.exception("closing the event log consumer failed")
            self._consumer = None
