"""The consume loop the monitor, the updater and the decision sink share: failures are
retried after the backoff and logged once per outage, the position is committed only after
the save, and an error that is no part's failure ends the loop without committing."""

from __future__ import annotations

import logging
import threading

import pytest

from services.eventlog import BackendUnavailable, Record
from services.eventlog.consume import Backoff, ConsumeLoop


class Log:
    """A consumer over a list of records whose polls fail while ``down`` is set."""

    def __init__(self, records: int) -> None:
        self.records = [Record(key=b"k", value=b"v", position=str(i)) for i in range(records)]
        self.down = 0
        self.read = 0
        self.committed = 0
        self.closed = False

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        if self.down:
            self.down -= 1
            raise BackendUnavailable("down")
        batch = self.records[self.read : self.read + max_records]
        self.read += len(batch)
        return batch

    def commit(self) -> None:
        self.committed = self.read

    def close(self) -> None:
        self.closed = True


class Counter(ConsumeLoop):
    """Counts records; saves the count before each commit."""

    def __init__(self, log: Log, stop: threading.Event, boom_at: int | None = None) -> None:
        self.errors: list[str] = []
        super().__init__("counter", lambda: log, self.errors.append, Backoff(0.001, 0.004))
        self.log, self.stop, self.boom_at = log, stop, boom_at
        self.applied = self.saved = 0

    def turn(self, stop: threading.Event) -> float:
        if self.checkpoint_due(60.0, self.applied - self.saved, 3):
            self.commit_after(self._save)
        records = self.poll(2, 0.0)
        self.applied += len(records)
        if self.boom_at is not None and self.applied >= self.boom_at:
            raise RuntimeError("a bug")
        if not records:
            stop.set()
        return 0.0

    def _save(self) -> None:
        assert self.log.committed <= self.saved  # never committed past what was saved
        self.saved = self.applied

    def failure_of(self, error: Exception) -> str | None:
        return "log" if isinstance(error, BackendUnavailable) else None

    def finish(self) -> None:
        if self.uncommitted:
            self.commit_after(self._save)
        self.close_consumer()


def test_every_record_is_saved_before_its_commit_and_the_stop_commits_the_rest() -> None:
    log, stop = Log(7), threading.Event()
    loop = Counter(log, stop)
    loop.run(stop)
    assert (loop.applied, loop.saved, log.committed, log.closed) == (7, 7, 7, True)


def test_an_outage_is_retried_counted_each_time_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, stop = Log(5), threading.Event()
    log.down = 4
    loop = Counter(log, stop)
    with caplog.at_level(logging.INFO, logger="services.eventlog.consume"):
        loop.run(stop)
    assert loop.errors == ["log"] * 4
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "failed" in m] == ["counter: log failed; retrying every 0.0 s"]
    assert messages[-1] == "counter: log is back"
    assert log.committed == 5


def test_an_error_of_no_part_ends_the_loop_without_a_commit() -> None:
    log, stop = Log(8), threading.Event()
    loop = Counter(log, stop, boom_at=4)
    with pytest.raises(RuntimeError, match="a bug"):
        loop.run(stop)
    assert log.committed < 4 and not log.closed


def test_the_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.take() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.take() == 0.5
    fixed = Backoff(0.5)
    assert [fixed.take() for _ in range(3)] == [0.5, 0.5, 0.5]
