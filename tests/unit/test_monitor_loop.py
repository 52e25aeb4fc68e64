"""The monitor's consume loop reads the log in batches while it keeps up: polls at least
``poll_linger_s`` apart unless the last one was full (a backlog is read at once)."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from services.monitor.advice import Advisor
from services.monitor.loop import MonitorLoop
from services.monitor.metrics import MonitorMetrics
from services.monitor.settings import MonitorSettings


class _Engine:
    uncheckpointed = 0

    def apply(self, records: list[Any]) -> SimpleNamespace:
        return SimpleNamespace(
            decisions=len(records), duplicates=0, outcomes=0, unmatched=0, invalid=0,
            newest_us=int(time.time() * 1e6),
        )  # fmt: skip

    def prune(self) -> None:
        pass

    def checkpoint(self) -> int:
        return 0


def _polls(tmp_path: Path, batch: int, seconds: float) -> list[float]:
    """Runs the loop for ``seconds`` on a log whose every poll returns ``batch`` records."""
    settings = MonitorSettings(
        poll_max_records=10, poll_timeout_s=0.05, poll_linger_s=0.25, checkpoint_interval_s=3600
    )
    polls: list[float] = []

    class Consumer:
        def poll(self, max_records: int, timeout_s: float) -> list[object]:
            polls.append(time.monotonic())
            return [object()] * batch

        def commit(self) -> None:
            pass

        def close(self) -> None:
            pass

    loop = MonitorLoop(
        settings,
        Consumer,  # type: ignore[arg-type]
        _Engine(),  # type: ignore[arg-type]
        Advisor(tmp_path / "advice.jsonl"),
        MonitorMetrics(CollectorRegistry()),
    )
    loop.publish = lambda: None  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    return polls


def test_polls_that_keep_up_are_a_linger_apart(tmp_path: Path) -> None:
    polls = _polls(tmp_path, batch=2, seconds=1.0)
    assert len(polls) >= 2, len(polls)
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    assert min(gaps) >= 0.24, gaps


def test_a_backlog_is_read_without_waiting(tmp_path: Path) -> None:
    polls = _polls(tmp_path, batch=10, seconds=0.5)
    assert len(polls) >= 20, len(polls)
