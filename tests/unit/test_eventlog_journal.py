"""The journal producer against an in-memory log that can be read back: every event on disk
when ``append`` returns, delivered in order, exactly once after a failed write or an
adoption, pending events in their final form, group commit in fsync mode."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2
from services.common.metric_catalogue import JOURNAL_SYNC_LATE
from services.eventlog import BackendUnavailable, EventLogMetrics, EventLogSettings, KeyValue
from services.eventlog import journal as journal_mod
from services.eventlog.events import event_id_of
from services.eventlog.journal import JournalProducer
from services.eventlog.journal_file import HEADER_SIZE, JournalFile
from services.gateway.settings import GatewaySettings


class ReadableLog:
    """A log in memory that can be read back from a position (as the file log and Redis can).

    ``down`` fails every write; ``store_then_fail`` stores the next batch and then fails
    (a write whose acknowledgement was lost)."""

    def __init__(self) -> None:
        self.stored: list[KeyValue] = []
        self.down = False
        self.store_then_fail = False
        self.lock = threading.Lock()

    def write(self, batch: Sequence[KeyValue]) -> None:
        with self.lock:
            if self.down:
                raise BackendUnavailable("down")
            self.stored.extend(batch)
            if self.store_then_fail:
                self.store_then_fail = False
                raise BackendUnavailable("timed out after storing")

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def position(self) -> str:
        with self.lock:
            return str(len(self.stored))

    def values_since(self, position: str) -> Iterator[bytes]:
        with self.lock:
            values = [v for _, v in self.stored[int(position or 0) :]]
        yield from values

    def ids(self) -> list[str]:
        with self.lock:
            return [event_id_of(v) for _, v in self.stored]


class UnreadableLog:
    """A log that cannot be read back (as Kafka here)."""

    def __init__(self) -> None:
        self.stored: list[KeyValue] = []
        self.down = False

    def write(self, batch: Sequence[KeyValue]) -> None:
        if self.down:
            raise BackendUnavailable("down")
        self.stored.extend(batch)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def ids(self) -> list[str]:
        return [event_id_of(v) for _, v in self.stored]


def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def settings(tmp_path: Path) -> EventLogSettings:
    return EventLogSettings(
        var_dir=tmp_path,
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
        close_timeout_s=5,
        linger_ms=2,
    )


def producer(
    settings: EventLogSettings,
    log: ReadableLog | UnreadableLog,
    sync: journal_mod.SyncMode = "write",
) -> JournalProducer:
    return JournalProducer(settings, lambda: log, EventLogMetrics(CollectorRegistry()), sync)


def decision(i: int, card: str | None = None) -> events_pb2.EventEnvelope:
    envelope = events_pb2.EventEnvelope()
    envelope.decision.event_id = f"ev-{i:06d}"
    envelope.decision.transaction_id = f"tx-{i}"
    envelope.decision.card_id = card or f"card-{i % 3}"
    envelope.decision.score = i / 1000
    return envelope


def ids(n: int, start: int = 0) -> list[str]:
    return [f"ev-{i:06d}" for i in range(start, start + n)]


def test_each_event_is_in_the_journal_when_append_returns(settings: EventLogSettings) -> None:
    log = ReadableLog()
    log.down = True
    p = producer(settings, log)
    for i in range(50):
        assert p.append(decision(i)) > 0
    # Nothing delivered, everything on disk: a new reader of the file finds all of it.
    journal = next(settings.journal_path.glob("journal-*.log"))
    found = JournalFile(journal, _open(journal), adopted=True).read(HEADER_SIZE, 1000)
    assert [event_id_of(e.value) for e in found] == ids(50)
    log.down = False
    assert p.flush(10)
    p.close()
    assert log.ids() == ids(50)
    assert not list(settings.journal_path.glob("journal-*.log")), "a delivered journal is removed"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR)


def test_a_write_whose_answer_was_lost_is_not_delivered_twice(
    settings: EventLogSettings,
) -> None:
    log = ReadableLog()
    p = producer(settings, log)
    for i in range(10):
        p.append(decision(i))
    assert p.flush(10)
    log.store_then_fail = True
    for i in range(10, 30):
        p.append(decision(i))
    assert p.flush(10)
    for i in range(30, 40):
        p.append(decision(i))
    assert p.flush(10)
    p.close()
    assert log.ids() == ids(40)


def test_an_outage_keeps_events_in_the_journal_and_delivers_them_in_order(
    settings: EventLogSettings,
) -> None:
    log = ReadableLog()
    p = producer(settings, log)
    log.down = True
    for i in range(300):
        p.append(decision(i))
    time.sleep(0.1)
    assert p.stats.buffered == 300 and p.stats.delivered == 0
    log.down = False
    assert p.flush(10)
    p.close()
    assert log.ids() == ids(300)
    assert p.stats.delivered == 300 and p.stats.dropped == 0


def test_an_abandoned_journal_is_adopted_and_what_the_log_has_is_left_out(
    settings: EventLogSettings,
) -> None:
    log = ReadableLog()
    first = producer(settings, log)
    for i in range(20):
        first.append(decision(i))
    assert first.flush(10)
    # The process dies: its sender had stored 5 more events, but the header still says 20.
    log.down = True
    for i in range(20, 40):
        first.append(decision(i))
    _abandon(first)
    log.down = False
    log.stored.extend((b"card", decision(i).SerializeToString()) for i in range(20, 25))
    second = producer(settings, log)
    wait_for(lambda: len(log.stored) >= 40)
    assert second.flush(10)
    second.close()
    assert log.ids() == ids(40)
    assert second.stats.replayed == 15


def test_on_a_log_that_cannot_be_read_back_events_in_doubt_are_sent_again(
    settings: EventLogSettings,
) -> None:
    log = UnreadableLog()
    first = producer(settings, log)
    log.down = True
    for i in range(10):
        first.append(decision(i))
    _abandon(first)
    log.down = False
    log.stored.extend((b"card", decision(i).SerializeToString()) for i in range(3))
    second = producer(settings, log)
    wait_for(lambda: len(log.stored) >= 13)
    second.close()
    assert log.ids() == ids(3) + ids(10), "at least once: repeats carry their event id"


def test_a_pending_event_is_delivered_in_its_final_form(settings: EventLogSettings) -> None:
    log = ReadableLog()
    p = producer(settings, log)
    envelope = decision(0)
    token, written = p.append_pending(envelope)
    assert written > 0
    p.append(decision(1))
    time.sleep(0.1)
    assert log.stored == [], "later events wait behind a pending one"
    final = events_pb2.EventEnvelope()
    final.CopyFrom(envelope)
    final.decision.shadow_score = 0.5
    p.complete(token, final)
    assert p.flush(10)
    p.close()
    delivered = [events_pb2.EventEnvelope.FromString(v).decision for _, v in log.stored]
    assert [d.event_id for d in delivered] == ids(2)
    assert delivered[0].HasField("shadow_score") and delivered[0].shadow_score == 0.5


def test_a_pending_event_whose_final_form_never_comes_is_sent_as_written(
    settings: EventLogSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_mod, "_HOLD_S", 0.05)
    log = ReadableLog()
    p = producer(settings, log)
    token, _ = p.append_pending(decision(0))
    p.append(decision(1))
    assert p.flush(10)
    p.complete(token, decision(0))  # too late: nothing more is written or sent
    p.close()
    assert log.ids() == ids(2)


def test_an_adopter_delivers_final_forms_it_finds_and_pending_ones_without(
    settings: EventLogSettings,
) -> None:
    log = ReadableLog()
    log.down = True
    first = producer(settings, log)
    completed, _ = first.append_pending(decision(0))
    first.append_pending(decision(1))  # its process dies before the shadow scores
    final = decision(0)
    final.decision.shadow_score = 0.25
    first.complete(completed, final)
    _abandon(first)
    log.down = False
    second = producer(settings, log)
    wait_for(lambda: len(log.stored) >= 2)
    second.close()
    delivered = [events_pb2.EventEnvelope.FromString(v).decision for _, v in log.stored]
    assert [d.event_id for d in delivered] == ids(2)
    assert delivered[0].shadow_score == 0.25
    assert not delivered[1].HasField("shadow_score")


def test_fsync_mode_wakes_every_caller_its_sync_covered(settings: EventLogSettings) -> None:
    log = ReadableLog()
    p = producer(settings, log, sync="fsync")

    async def answer_all() -> list[bool]:
        written = [p.append(decision(i)) for i in range(20)]
        return await asyncio.gather(*(p.durable(w, 5.0) for w in written))

    assert all(asyncio.run(answer_all()))
    assert p.flush(10)
    p.close()
    assert log.ids() == ids(20)


def test_fsync_mode_never_waits_past_the_budget_and_the_docs_say_so(
    settings: EventLogSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk whose flush takes longer than the answer's budget: the sync is held open.
    release = threading.Event()
    real_sync = JournalFile.sync

    def slow_sync(self: JournalFile) -> None:
        release.wait(30)
        real_sync(self)

    monkeypatch.setattr(JournalFile, "sync", slow_sync)
    p = producer(settings, ReadableLog(), sync="fsync")
    written = p.append(decision(0))
    # The caller gets False once its budget is spent, and answers without the sync.
    assert not asyncio.run(p.durable(written, 0.05))
    release.set()
    assert asyncio.run(p.durable(written, 30.0)), "the sync covers it once it ends"
    p.close()
    # The docs state that bound, naming the counter of such answers, wherever they speak of
    # fsync and power loss: if the code waited for the sync, or the text promised every
    # answer survives, the two would part.
    late = JOURNAL_SYNC_LATE.name
    docs = Path(__file__).resolve().parents[2] / "docs"
    fsync_row = next(
        line
        for line in (docs / "reliability.md").read_text().splitlines()
        if line.startswith("| `fsync` |")
    )
    assert "never past the answer's budget" in fsync_row and late in fsync_row
    assert "stated bound" in fsync_row
    power_row = next(
        line
        for line in (docs / "liveloop.md").read_text().splitlines()
        if line.startswith("| power loss |")
    )
    assert "budget" in power_row and late in power_row
    assert late in GatewaySettings.model_fields["journal"].description  # type: ignore[operator]


def test_write_mode_is_durable_at_once(settings: EventLogSettings) -> None:
    p = producer(settings, ReadableLog())
    written = p.append(decision(0))
    assert asyncio.run(p.durable(written, 0.0))
    assert not asyncio.run(p.durable(-1, 0.0)), "an event that was not written is not durable"
    p.close()


def test_a_delivered_journal_is_emptied_once_large(
    settings: EventLogSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_mod, "_RESET_BYTES", 4096)
    log = ReadableLog()
    p = producer(settings, log)
    for i in range(100):
        p.append(decision(i))
    assert p.flush(10)
    journal = next(settings.journal_path.glob("journal-*.log"))
    wait_for(lambda: journal.stat().st_size == HEADER_SIZE)
    for i in range(100, 110):
        p.append(decision(i))
    assert p.flush(10)
    p.close()
    assert log.ids() == ids(110)


def test_a_live_producers_journal_is_left_alone(settings: EventLogSettings) -> None:
    log = ReadableLog()
    log.down = True
    first = producer(settings, log)
    first.append(decision(0))
    assert JournalFile.adopt_orphans(settings.journal_path) == []
    log.down = False
    first.close()
    assert log.ids() == ids(1)


def _abandon(p: JournalProducer) -> None:
    """Ends a producer as a killed process would: its sender stops, its journal is unlocked
    as it stands, nothing is delivered or cleaned up."""
    p._closing = True
    p._close_deadline = 0.0
    p._down_until = float("inf")
    p._thread.join()
