"""The file log: durability across kill -9, torn tails, several writer processes, retention."""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from services.eventlog import (
    CorruptLogError,
    EventLogMetrics,
    EventLogSettings,
    GroupBusyError,
    framing,
    open_consumer,
    open_producer,
)
from services.eventlog.filelog import FileLogConsumer, FileLogWriter, list_segments, watch_head
from services.eventlog.records import Record
from tests.integration.eventlog.conftest import drain, read_json_lines, start_worker
from tests.integration.eventlog.sample import decision, event_id

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(tmp_path: Path) -> EventLogSettings:
    return EventLogSettings(
        backend="file", var_dir=tmp_path, groups=(), file_poll_interval_ms=2, file_fsync="batch"
    )


def active_segment(settings: EventLogSettings) -> Path:
    return settings.file_path / f"{list_segments(settings.file_path)[-1]:020d}.seg"


def test_acknowledged_appends_survive_kill_9_and_a_torn_tail_is_cut(
    settings: EventLogSettings, tmp_path: Path
) -> None:
    worker = start_worker(
        settings, "produce", "--count", "1000000", "--ack-every", "100",
        log_path=tmp_path / "producer.log",
    )  # fmt: skip
    try:
        acked = read_json_lines(worker, lambda m: m.get("acked", 0) >= 3000)["acked"]
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)

    # A write torn by the kill, made certain: half a frame after the last complete one.
    segment = active_segment(settings)
    frame = framing.encode(b"card-x", decision(10**9).SerializeToString())
    with segment.open("ab") as f:
        f.write(frame[: len(frame) // 2])
    size_with_tail = segment.stat().st_size

    writer = FileLogWriter(settings)
    assert writer.recovered_bytes >= len(frame) // 2
    assert segment.stat().st_size < size_with_tail
    writer.write([(b"card-after", decision(-1).SerializeToString())])
    writer.close()

    with open_consumer(settings, "g") as consumer:
        records = drain(consumer, acked + 1, timeout_s=30)
        records += consumer.poll(100_000, 0.5)
    ids = [event_id(r) for r in records]
    assert ids[-1] == "e-1", "an append after the repair follows the last intact record"
    got = set(ids[:-1])
    assert {f"e{i}" for i in range(acked)} <= got, "every acknowledged append is there"
    assert ids[:-1] == [f"e{i}" for i in range(len(ids) - 1)], "in order, no gaps, no damage"


def test_writers_in_several_processes_interleave_safely(
    settings: EventLogSettings, tmp_path: Path
) -> None:
    small = settings.model_copy(update={"file_segment_bytes": 64 * 1024})
    workers = []
    for n in range(3):
        args = ["produce", "--start", str(n * 100_000), "--count", "3000"]
        workers.append(start_worker(small, *args, log_path=tmp_path / f"producer-{n}.log"))
    for worker in workers:
        read_json_lines(worker, lambda m: "done" in m)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)  # close() flushes
        assert worker.wait(60) == 0
    assert len(list_segments(small.file_path)) > 3, "segments rolled while writers raced"
    with open_consumer(small, "g") as consumer:
        records = drain(consumer, 9000)
        assert consumer.poll(1000, 0.3) == []
    per_writer: dict[int, list[int]] = collections.defaultdict(list)
    for record in records:
        amount = record.envelope().decision.amount_minor
        per_writer[amount // 100_000].append(amount)
    for n in range(3):
        assert per_writer[n] == list(range(n * 100_000, n * 100_000 + 3000))


def test_retention_waits_for_every_known_group(tmp_path: Path) -> None:
    settings = EventLogSettings(
        backend="file",
        var_dir=tmp_path,
        groups=("fast", "slow"),
        file_segment_bytes=16 * 1024,
        batch_max_events=20,
        file_retention_check_s=0,
        file_poll_interval_ms=2,
    )
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    for i in range(2000):
        producer.append(decision(i))
    producer.close()
    segments = len(list_segments(settings.file_path))
    assert segments > 10

    with open_consumer(settings, "fast") as fast:
        assert len(drain(fast, 2000)) == 2000
        fast.commit()
    assert len(list_segments(settings.file_path)) == segments, "slow has not consumed yet"

    with open_consumer(settings, "slow") as slow:
        first = drain(slow, 1000)
        slow.commit()
        kept = list_segments(settings.file_path)
        assert len(kept) < segments
        assert kept[0] <= slow.committed
        rest = drain(slow, 2000 - len(first))
        slow.commit()
    ids = [event_id(r) for r in first + rest]
    assert ids == [f"e{i}" for i in range(2000)], "nothing unconsumed was deleted"
    assert len(list_segments(settings.file_path)) == 1


def test_one_live_consumer_per_group(settings: EventLogSettings) -> None:
    with open_consumer(settings, "g"), pytest.raises(GroupBusyError):
        open_consumer(settings, "g")
    open_consumer(settings, "g").close()


def test_damage_below_the_acknowledged_end_is_reported(settings: EventLogSettings) -> None:
    writer = FileLogWriter(settings)
    writer.write([(b"k", decision(i).SerializeToString()) for i in range(10)])
    writer.close()
    segment = active_segment(settings)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    with open_consumer(settings, "g") as consumer:
        good = consumer.poll(100, 1.0)
        assert 0 < len(good) < 10
        with pytest.raises(CorruptLogError):
            consumer.poll(100, 1.0)


@pytest.mark.parametrize("watch", [True, False])
def test_an_idle_consumer_waits_for_the_head_to_move_instead_of_looking(
    settings: EventLogSettings, watch: bool
) -> None:
    """With the head watched, a poll that finds nothing sleeps until a writer acknowledges a
    batch: over a quiet second it reads the head at most twice (the writer's opening moved
    the head once before the poll), and wakes for the batch another thread writes;
    unwatched, it looks every interval (2 ms here), hundreds of times."""
    settings = settings.model_copy(update={"file_watch_head": watch})
    with open_consumer(settings, "g") as consumer:
        assert isinstance(consumer, FileLogConsumer)
        assert (consumer._watch_fd >= 0) == watch
        reads = 0
        read = consumer._read

        def counted(max_records: int) -> list[Record]:
            nonlocal reads
            reads += 1
            return read(max_records)

        consumer._read = counted  # type: ignore[method-assign]
        writer = FileLogWriter(settings)
        late = threading.Timer(1.0, writer.write, [[(b"k", decision(1).SerializeToString())]])
        late.start()
        try:
            started = time.monotonic()
            records = consumer.poll(10, 30.0)
            waited = time.monotonic() - started
        finally:
            late.join()
            writer.close()
        assert [r.key for r in records] == [b"k"]
        assert 0.9 < waited < 20.0  # the batch ended the wait, not the timeout
        if watch:
            assert reads <= 3, reads
        else:
            assert reads > 50, reads


def test_a_head_that_cannot_be_watched_is_polled_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the watch is refused (here: no such file; in production, the user's inotify
    limits), ``watch_head`` says why and the consumer polls instead."""
    with caplog.at_level(logging.WARNING, logger="services.eventlog.filelog"):
        assert watch_head(tmp_path / "missing" / "HEAD") is None
    assert "polling instead" in caplog.text
    assert "No such file" in caplog.text
