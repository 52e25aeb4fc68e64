"""The monitor's consume loop (``eventlog.consume.ConsumeLoop``): poll, apply, checkpoint,
commit; publish the gauges and the advice on the way.

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
from services.eventlog.consume import Backoff, ConsumeLoop
from services.monitor import snapshot
from services.monitor.advice import Advisor
from services.monitor.engine import MonitorEngine
from services.monitor.metrics import MonitorMetrics
from services.monitor.settings import MonitorSettings

log = logging.getLogger(__name__)

_PRUNE_INTERVAL_S = 600.0


class MonitorLoop(ConsumeLoop):
    """Consumes the event log into the engine."""

    def __init__(
        self,
        settings: MonitorSettings,
        open_consumer: Callable[[], Consumer],
        engine: MonitorEngine,
        advisor: Advisor,
        metrics: MonitorMetrics,
    ) -> None:
        super().__init__(
            "monitor",
            open_consumer,
            lambda what: metrics.errors.labels(what).inc(),
            Backoff(settings.retry_backoff_s),
        )
        self._settings = settings
        self.engine = engine
        self.advisor = advisor
        self._metrics = metrics
        self._caught_up = False
        self._next_publish = 0.0
        self._next_prune = 0.0

    def ready(self) -> bool:
        """Connected to the log and caught up with its end."""
        return self._connected and self._caught_up

    def turn(self, stop: threading.Event) -> float:
        """One step; while it keeps up, polls are at least ``poll_linger_s`` apart (a full
        poll, a backlog, is followed by the next at once)."""
        started = time.monotonic()
        if self.step():
            return 0.0
        return self._settings.poll_linger_s - (time.monotonic() - started)

    def failure_of(self, error: Exception) -> str | None:
        """The log's errors and the state file's."""
        if isinstance(error, (BackendUnavailable, EventLogError)):
            self._connected = False
            return "log"
        return "state" if isinstance(error, sqlite3.Error) else None

    def on_failure(self, what: str) -> None:
        """Not ready while anything fails."""
        self._metrics.ready.set(0)

    def step(self) -> bool:
        """One iteration: checkpoint if due, poll, apply, publish if due; True when the poll
        was full (more is waiting)."""
        s = self._settings
        if self.checkpoint_due(
            s.checkpoint_interval_s, self.engine.uncheckpointed, s.checkpoint_max_events
        ):
            self.checkpoint()
        records = self.poll(s.poll_max_records, s.poll_timeout_s)
        full = len(records) >= s.poll_max_records
        if records:
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

    def checkpoint(self) -> None:
        """Writes the state, then commits the log position."""
        if self._consumer is None:
            return
        self._metrics.checkpoint.observe(self.commit_after(self.engine.checkpoint))

    def finish(self) -> None:
        """On stop: a last checkpoint and commit, then leave the group."""
        try:
            if self.uncommitted:
                self.checkpoint()
        except Exception:
            log.exception("final checkpoint failed; the log gives the rest again on restart")
        self.close_consumer()
        self._metrics.ready.set(0)
