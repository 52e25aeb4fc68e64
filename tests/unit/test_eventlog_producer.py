"""The producer's buffering and spilling, against an in-memory writer that can be switched off."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2
from services.eventlog import (
    BackendUnavailable,
    EventLogMetrics,
    EventLogSettings,
    KeyValue,
    Producer,
    ProducerClosedError,
)
from services.eventlog.spill import SpillFile


class MemoryWriter:
    """A backend in memory: ``down`` makes every write fail, ``fail_odd`` fails odd positions."""

    def __init__(self) -> None:
        self.stored: list[KeyValue] = []
        self.down = False
        self.fail_odd = False
        self.writes = 0
        self.closed = False
        self.lock = threading.Lock()

    def write(self, batch: Sequence[KeyValue]) -> None:
        with self.lock:
            self.writes += 1
            if self.down:
                raise BackendUnavailable("down")
            if self.fail_odd:
                self.fail_odd = False
                self.stored.extend(r for i, r in enumerate(batch) if i % 2 == 0)
                raise BackendUnavailable("partly", failed=range(1, len(batch), 2))
            self.stored.extend(batch)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def settings(tmp_path: Path) -> EventLogSettings:
    return EventLogSettings(
        var_dir=tmp_path, retry_backoff_s=0.01, retry_backoff_max_s=0.05, close_timeout_s=5
    )


def producer(settings: EventLogSettings, writer: MemoryWriter) -> Producer:
    return Producer(settings, lambda: writer, EventLogMetrics(CollectorRegistry()))


@pytest.fixture
def writer() -> Iterator[MemoryWriter]:
    yield MemoryWriter()


def records(n: int, start: int = 0) -> list[KeyValue]:
    return [(b"card-%d" % (i % 3), b"%06d" % i) for i in range(start, start + n)]


def test_appends_are_delivered_in_order(settings: EventLogSettings, writer: MemoryWriter) -> None:
    p = producer(settings, writer)
    for key, value in records(500):
        p.append_record(key, value)
    assert p.flush(10)
    p.close()
    assert writer.stored == records(500)
    assert writer.closed
    assert p.stats.delivered == 500 and p.stats.spilled == 0


def test_append_keys_decisions_by_card_and_outcomes_by_transaction(
    settings: EventLogSettings, writer: MemoryWriter
) -> None:
    p = producer(settings, writer)
    decision = events_pb2.EventEnvelope()
    decision.decision.card_id = "card-9"
    decision.decision.transaction_id = "tx-1"
    outcome = events_pb2.EventEnvelope()
    outcome.outcome.transaction_id = "tx-1"
    p.append(decision)
    p.append(outcome)
    with pytest.raises(ValueError):
        p.append(events_pb2.EventEnvelope())
    p.close()
    assert [k for k, _ in writer.stored] == [b"card-9", b"tx-1"]
    assert events_pb2.EventEnvelope.FromString(writer.stored[0][1]) == decision


def test_outage_spills_then_delivers_everything_in_order(
    settings: EventLogSettings, writer: MemoryWriter
) -> None:
    p = producer(settings, writer)
    for key, value in records(100):
        p.append_record(key, value)
    assert p.flush(10)
    writer.down = True
    for key, value in records(300, 100):
        p.append_record(key, value)
    wait_for(lambda: p.stats.spilled == 300)
    assert not p.flush(0.2)
    assert not p.stats.backend_up
    writer.down = False
    for key, value in records(100, 400):
        p.append_record(key, value)
    assert p.flush(20)
    p.close()
    assert writer.stored == records(500)
    assert p.stats.dropped == 0
    assert not list(settings.spill_path.glob("*.log"))


def test_partial_failure_spills_only_what_was_not_stored(
    settings: EventLogSettings, writer: MemoryWriter
) -> None:
    writer.fail_odd = True
    p = producer(settings, writer)
    for key, value in records(10):
        p.append_record(key, value)
    assert p.flush(10)
    p.close()
    assert sorted(writer.stored) == sorted(records(10))
    assert len(writer.stored) == 10


def test_close_with_backend_down_keeps_events_for_the_next_producer(
    settings: EventLogSettings, writer: MemoryWriter
) -> None:
    writer.down = True
    p = producer(settings, writer)
    for key, value in records(50):
        p.append_record(key, value)
    p.close()
    with pytest.raises(ProducerClosedError):
        p.append_record(b"k", b"v")
    assert writer.stored == []
    assert len(list(settings.spill_path.glob("spill-*.log"))) == 1

    later = MemoryWriter()
    q = producer(settings, later)
    for key, value in records(10, 50):
        q.append_record(key, value)
    assert q.flush(10)
    q.close()
    assert later.stored == records(60)
    assert q.stats.replayed == 50
    assert not list(settings.spill_path.glob("spill-*.log"))


def test_partly_replayed_spill_is_not_delivered_twice(
    settings: EventLogSettings, writer: MemoryWriter, tmp_path: Path
) -> None:
    spill = SpillFile.create(settings.spill_path, settings.spill_max_bytes)
    spill.append(records(20))
    got, nbytes = spill.peek(5)
    spill.consume(len(got), nbytes)
    spill.release()
    p = producer(settings, writer)
    p.close()
    assert writer.stored == records(15, 5)


def test_torn_spill_tail_is_cut_on_adoption(
    settings: EventLogSettings, writer: MemoryWriter
) -> None:
    spill = SpillFile.create(settings.spill_path, settings.spill_max_bytes)
    spill.append(records(3))
    path = spill.path
    spill.release()
    with path.open("ab") as f:
        f.write(b"\x10\x00\x00\x00garbage")
    p = producer(settings, writer)
    p.close()
    assert writer.stored == records(3)


def test_full_spill_drops_counts_and_never_blocks(tmp_path: Path, writer: MemoryWriter) -> None:
    settings = EventLogSettings(
        var_dir=tmp_path, spill_max_bytes=4096, retry_backoff_s=0.01, close_timeout_s=1
    )
    writer.down = True
    p = producer(settings, writer)
    for key, value in records(500):
        p.append_record(key, value)
    wait_for(lambda: p.stats.spilled + p.stats.dropped == 500)
    stats = p.stats
    assert stats.dropped > 0 and stats.spilled > 0
    writer.down = False
    assert p.flush(10)
    p.close()
    assert len(writer.stored) == stats.spilled
    assert writer.stored == records(500)[: stats.spilled]


def test_full_memory_overflows_to_the_spill_file(tmp_path: Path) -> None:
    settings = EventLogSettings(var_dir=tmp_path, buffer_max_events=10, retry_backoff_s=0.01)
    gate = threading.Event()

    class SlowWriter(MemoryWriter):
        def write(self, batch: Sequence[KeyValue]) -> None:
            gate.wait(20)
            super().write(batch)

    writer = SlowWriter()
    p = producer(settings, writer)
    for key, value in records(100):
        p.append_record(key, value)  # must not block while the writer is stuck
    assert p.stats.spilled >= 80
    gate.set()
    assert p.flush(10)
    p.close()
    assert sorted(writer.stored) == sorted(records(100))
    assert p.stats.dropped == 0


def test_a_second_producer_leaves_a_live_producers_spill_alone(
    settings: EventLogSettings, writer: MemoryWriter
) -> None:
    writer.down = True
    p = producer(settings, writer)
    p.append_record(b"k", b"v")
    wait_for(lambda: p.stats.spilled == 1)
    other = MemoryWriter()
    q = producer(settings, other)
    q.close()
    assert other.stored == []
    writer.down = False
    assert p.flush(10)
    p.close()
    assert writer.stored == [(b"k", b"v")]


async def test_async_flush_and_close(settings: EventLogSettings, writer: MemoryWriter) -> None:
    p = producer(settings, writer)
    p.append_record(b"k", b"v")
    assert await p.aflush(10)
    await p.aclose()
    assert writer.stored == [(b"k", b"v")]
