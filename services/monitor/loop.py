"""The monitor's consume loop: poll, apply, checkpoint, commit; publish the gauges and the
advice on the way.

Runs on its own thread (every call it makes blocks). The commit comes after the checkpoint:
after a crash the log gives again what followed the last commit, and the engine skips what
the checkpoint already counted (``engine.py``), so nothing is counted twice and nothing is
lost.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from services.eventlog import BackendUnavailable, Consumer, EventLogError
from services.monitor import snapshot
from services.monitor.advice import Advisor
from services.monitor.engine import MonitorEngine
from services.monitor.metrics import MonitorMetrics
from services.monitor.settings import MonitorSettings

log = logging.getLogger(__name__)

_PRUNE_INTERVAL_S = 600.0


class MonitorLoop:
    """Consumes the event log into the engine."""

    def __init__(
        self,
        settings: MonitorSettings,
        open_consumer: Callable[[], Consumer],
        engine: MonitorEngine,
        advisor: Advisor,
        metrics: MonitorMetrics,
    ) -> None:
        self._settings = settings
        self._open_consumer = open_consumer
        self.engine = engine
        self.advisor = advisor
        self._metrics = metrics
        self._consumer: Consumer | None = None
        self._connected = False
        self._caught_up = False
        self._uncommitted_since: float | None = None
        self._next_publish = 0.0
        self._next_prune = 0.0
        self._failing: set[str] = set()

    def ready(self) -> bool:
        """Connected to the log and caught up with its end."""
        return self._connected and self._caught_up

    def run(self, stop: threading.Event) -> None:
        """Loops until ``stop`` is set, then checkpoints and commits what it applied. While it
        keeps up, polls are at least ``poll_linger_s`` apart (a full poll, a backlog, is
        followed by the next at once)."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                full = self.step()
            except (BackendUnavailable, EventLogError) as error:
                self._connected = False
                self._failed("log", error)
            except sqlite3.Error as error:
                self._failed("state", error)
            else:
                if not full:
                    elapsed = time.monotonic() - started
                    stop.wait(max(0.0, self._settings.poll_linger_s - elapsed))
                continue
            self._metrics.ready.set(0)
            stop.wait(self._settings.retry_backoff_s)
        self._finish()

    def step(self) -> bool:
        """One iteration: checkpoint if due, poll, apply, publish if due; True when the poll
        was full (more is waiting)."""
        if self._checkpoint_due():
            self.checkpoint()
        if self._consumer is None:
            self._consumer = self._open_consumer()
        s = self._settings
        records = self._consumer.poll(s.poll_max_records, s.poll_timeout_s)
        self._connected = True
        self._recovered("log")
        full = len(records) >= s.poll_max_records
        if records:
            if self._uncommitted_since is None:
                self._uncommitted_since = time.monotonic()
            stats = self.engine.apply(records)
            m = self._metrics
            for kind in ("decisions", "duplicates", "outcomes", "unmatched", "invalid"):
                value = getattr(stats, kind)
                if value:
                    m.events.labels(kind.removesuffix("s")).inc(value)
            age = max(0.0, time.time() - stats.newest_us / 1e6) if stats.newest_us else 0.0
            # Behind: a full batch, or decisions older than a few polls (a backlog).
            self._caught_up = not full and age < max(2.0, 4 * s.poll_timeout_s)
            m.lag.set(0.0 if self._caught_up else age)
        else:
            self._caught_up = True
            self._metrics.lag.set(0.0)
        self._metrics.ready.set(1 if self.ready() else 0)
        now = time.monotonic()
        if now >= self._next_publish:
            self._next_publish = now + s.publish_interval_s
            self.publish()
        if now >= self._next_prune:
            self._next_prune = now + _PRUNE_INTERVAL_S
            self.engine.prune()
        return full

    def publish(self) -> None:
        """Recomputes the gauges and records any advice."""
        view = snapshot.take(self.engine)
        for entry in self.advisor.observe(view):
            self._metrics.advice.labels(entry["model_version"], entry["reason"]).inc()
        self._metrics.publish(view, self.advisor.active)

    def _checkpoint_due(self) -> bool:
        since = self._uncommitted_since
        if since is None:
            return False
        return (
            time.monotonic() - since >= self._settings.checkpoint_interval_s
            or self.engine.uncheckpointed >= self._settings.checkpoint_max_events
        )

    def checkpoint(self) -> None:
        """Writes the state, then commits the log position."""
        if self._consumer is None:
            return
        start = time.perf_counter()
        self.engine.checkpoint()
        self._recovered("state")
        self._consumer.commit()
        self._uncommitted_since = None
        self._metrics.checkpoint.observe(time.perf_counter() - start)

    def _finish(self) -> None:
        """On stop: a last checkpoint and commit, then leave the group."""
        try:
            if self._uncommitted_since is not None:
                self.checkpoint()
        except Exception:
            log.exception("final checkpoint failed; the log gives the rest again on restart")
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.exception("closing the event log consumer failed")
            self._consumer = None
        self._metrics.ready.set(0)

    def _failed(self, what: str, error: Exception) -> None:
        self._metrics.errors.labels(what).inc()
        if what not in self._failing:
            self._failing.add(what)
            log.warning(
                "monitor: %s failed; retrying every %.1f s",
                what,
                self._settings.retry_backoff_s,
                extra={"error": f"{type(error).__name__}: {error}"},
            )

    def _recovered(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.info("monitor: %s is back", what)
