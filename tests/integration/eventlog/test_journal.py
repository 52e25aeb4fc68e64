"""The journal across a real kill -9: a producer process appending through its journal is
killed while its sender delivers; a new producer on the same folder adopts the journal, and
every event the dead process appended is in the log exactly once (file log and Redis, which
can be read back)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from services.eventlog import EventLogMetrics, JournalProducer, open_consumer, open_writer

from .conftest import drain, read_json_lines, settings_factory, start_worker
from .sample import event_id

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("backend", ["file", "redis"])
def test_a_killed_producers_journal_is_delivered_exactly_once(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    # The dead sender sends every 100 ms: at the kill, the journal holds ~150 on average.
    settings = settings_factory(request, backend, tmp_path)(groups=("check",), linger_ms=100.0)
    replayed = 0
    for round_ in range(3):
        worker = start_worker(
            settings,
            "produce",
            "--start", str(round_ * 100_000),
            "--count", "100000",
            "--journal", "write",
            "--rate", "3000",
            "--report-every", "100",
            log_path=tmp_path / f"worker-{round_}.log",
        )  # fmt: skip
        try:
            want = 1500 + 300 * round_
            seen = read_json_lines(worker, lambda m, want=want: m.get("appended", 0) >= want)
        finally:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(10)
        assert seen["appended"] >= 1500
        bound = seen["appended"]
        # Every event appended before the kill is on disk; the next producer delivers it.
        adopter = JournalProducer(
            settings, lambda: open_writer(settings), EventLogMetrics(CollectorRegistry())
        )
        adopter.close(30)
        replayed += adopter.stats.replayed
        assert not list(settings.journal_path.glob("journal-*.log")), "journals left behind"
        with open_consumer(settings, "check") as consumer:
            records = drain(consumer, want=1_000_000, timeout_s=3)
            consumer.commit()
        ids = Counter(event_id(r) for r in records)
        repeated = {k: n for k, n in ids.items() if n > 1}
        assert not repeated, f"delivered more than once: {list(repeated.items())[:5]}"
        mine = sorted(int(k[1:]) - round_ * 100_000 for k in ids)
        assert mine[:bound] == list(range(bound)), "an appended event is missing"
        assert mine == list(range(len(mine))), "the log holds a gap"
    assert replayed > 0, "no kill left anything undelivered: the adoption was not tested"
