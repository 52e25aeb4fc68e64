"""``fraudmesh decisions export`` and ``tail`` as commands, on what a running sink wrote."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fraud.v1 import outcomes_pb2
from services.eventlog import EventLogSettings, open_producer
from tests.integration.decisionlog.conftest import Sink, wait_written
from tests.integration.decisionlog.sample import decision, outcome

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def fraudmesh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_export_joins_the_latest_outcome_and_drops_retries(
    tmp_path: Path, sink_factory: Callable[..., Sink]
) -> None:
    log = EventLogSettings(backend="file", var_dir=tmp_path, topic="cli", groups=())
    sink = sink_factory(log, flush_interval_s=0.2)
    sink.start()
    producer = open_producer(log)
    producer.append(outcome(12, outcomes_pb2.OUTCOME_FRAUD))  # before its decision
    for i in range(13):
        producer.append(decision(i))
    producer.append(decision(3, event_id="d3-retry"))  # a retried Score of tx-3
    producer.append(decision(4))  # the same event delivered twice
    # A dispute reported after the fraud verdict, but known earlier at its source.
    producer.append(outcome(1, outcomes_pb2.OUTCOME_FRAUD, event_id="o1-fraud"))
    producer.append(
        outcome(1, outcomes_pb2.OUTCOME_DISPUTED, event_id="o1-dispute", reported_offset_s=-60)
    )
    producer.close()
    wait_written(sink.root, {f"d{i}" for i in range(13)} | {"d3-retry"})
    wait_written(sink.root, {"o12", "o1-fraud", "o1-dispute"}, "outcomes")

    out = tmp_path / "export.parquet"
    result = fraudmesh("decisions", "export", "--out", str(out), "--root", str(sink.root))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "retried transactions dropped" in result.stdout
    rows = {r["transaction_id"]: r for r in pq.read_table(out).to_pylist()}
    assert sorted(rows) == sorted(f"tx-{i}" for i in range(13))
    assert rows["tx-3"]["event_id"] == "d3"
    assert rows["tx-12"]["outcome"] == "fraud"
    assert rows["tx-1"]["outcome"] == "fraud" and rows["tx-1"]["outcome_reports"] == 2
    assert rows["tx-0"]["outcome"] is None

    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86_400))
    result = fraudmesh(
        "decisions", "export", "--out", str(out), "--root", str(sink.root), "--since", tomorrow
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert pq.read_table(out).num_rows == 0


def test_tail_prints_events_as_they_land_and_stops_on_ctrl_c(
    tmp_path: Path, sink_factory: Callable[..., Sink]
) -> None:
    log = EventLogSettings(backend="file", var_dir=tmp_path, topic="tail", groups=())
    sink = sink_factory(log, flush_interval_s=0.2)
    sink.start()
    producer = open_producer(log)
    producer.append(decision(0))
    producer.flush(30)
    wait_written(sink.root, {"d0"})

    argv = ["decisions", "tail", "--json", "--last", "1", "--interval-s", "0.1"]
    tail = subprocess.Popen(
        [sys.executable, "-m", "services.cli", *argv, "--root", str(sink.root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert tail.stdout is not None
        for line in tail.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        first = json.loads(lines.get(timeout=60))
        assert first["event_id"] == "d0" and first["kind"] == "decision"
        for i in range(1, 6):
            producer.append(decision(i))
        producer.append(outcome(2))
        producer.flush(30)
        want = {f"d{i}" for i in range(1, 6)} | {"o2"}
        seen: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while set(seen) < want and time.monotonic() < deadline:
            try:
                event = json.loads(lines.get(timeout=1))
            except queue.Empty:
                continue
            seen[event["event_id"]] = event["kind"]
        assert set(seen) == want
        assert seen["o2"] == "outcome"
    finally:
        tail.send_signal(signal.SIGINT)
        assert tail.wait(30) == 0
    producer.close()
