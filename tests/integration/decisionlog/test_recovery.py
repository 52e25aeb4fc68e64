"""The sink's crash windows, made to happen on purpose on the real file log: parts written but
the position not committed, and a flush that wrote one part of two. A restarted sink writes
every event once."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import Self

from prometheus_client import CollectorRegistry

from services.decisionlog import layout, writer
from services.decisionlog.metrics import SinkMetrics
from services.decisionlog.settings import DecisionLogSettings
from services.decisionlog.sink import DecisionSink
from services.eventlog import (
    BackendUnavailable,
    Consumer,
    EventLogSettings,
    Record,
    open_consumer,
    open_producer,
)
from tests.integration.decisionlog.conftest import written_ids
from tests.integration.decisionlog.sample import decision, outcome


class CommitRefused:
    """The real file-log consumer, except that ``commit`` fails (the backend went away just
    then) until ``refuse`` is cleared."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner
        self.group = inner.group
        self.refuse = True

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        return self.inner.poll(max_records, timeout_s)

    def commit(self) -> None:
        if self.refuse:
            raise BackendUnavailable("commit refused by the test")
        self.inner.commit()

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def fill(settings: EventLogSettings, decisions: int, outcomes: int) -> None:
    producer = open_producer(settings)
    for i in range(decisions):
        producer.append(decision(i))
    for i in range(outcomes):
        producer.append(outcome(i))
    producer.close()


def sink_on(
    tmp_path: Path,
    log: EventLogSettings,
    refusing: list[CommitRefused] | None = None,
    flush_interval_s: float = 0.01,
) -> DecisionSink:
    settings = DecisionLogSettings(root=tmp_path / "decisions", flush_interval_s=flush_interval_s)

    def consumer() -> Consumer:
        inner = open_consumer(log, settings.group)
        if refusing is None:
            return inner
        wrapped = CommitRefused(inner)
        refusing.append(wrapped)
        return wrapped

    return DecisionSink(settings, log, SinkMetrics(CollectorRegistry()), consumer)


def crash(sink: DecisionSink, consumer: Consumer) -> None:
    """What a kill leaves: the consumer's group lock and the folder lock released, nothing
    committed, nothing flushed."""
    consumer.close()
    sink.release()


def finish(tmp_path: Path, log: EventLogSettings) -> DecisionSink:
    """A fresh sink that runs until it has caught up, then stops in order."""
    sink = sink_on(tmp_path, log)
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,))
    thread.start()
    assert sink.caught_up.wait(60)
    stop.set()
    thread.join(60)
    return sink


def test_parts_written_and_not_committed_are_not_written_again(tmp_path: Path) -> None:
    log = EventLogSettings(backend="file", var_dir=tmp_path, topic="t", groups=())
    fill(log, 300, 50)
    refusing: list[CommitRefused] = []
    sink = sink_on(tmp_path, log, refusing)
    sink.recover()
    consumer = sink.open_consumer()
    while not sink.stats.written:
        sink.step(consumer)
    assert sink.stats.flushes == 0
    root = tmp_path / "decisions"
    assert len(written_ids(root)) == 300 and len(written_ids(root, "outcomes")) == 50
    crash(sink, consumer)

    restarted = finish(tmp_path, log)
    assert restarted.stats.read == {"duplicate": 350}
    assert written_ids(root) == {f"d{i}": 1 for i in range(300)}
    assert written_ids(root, "outcomes") == {f"o{i}": 1 for i in range(50)}


def test_a_flush_cut_between_two_parts_is_completed_once(tmp_path: Path) -> None:
    log = EventLogSettings(backend="file", var_dir=tmp_path, topic="t", groups=())
    fill(log, 200, 40)
    root = tmp_path / "decisions"
    sink = sink_on(tmp_path, log, flush_interval_s=300)
    sink.recover()
    consumer = sink.open_consumer()
    while sink.batch.rows < 240:
        sink.step(consumer)
    # The outcomes' part cannot be created: a folder sits where its temporary file goes.
    ((_, day),) = [key for key in sink.batch.buffers if key[0] == "outcomes"]
    blocked = layout.tmp_path(sink.part_path(("outcomes", day), sink.next_flush))
    blocked.mkdir(parents=True)
    assert not sink.flush(consumer)
    assert len(written_ids(root)) == 200 and not written_ids(root, "outcomes")
    crash(sink, consumer)
    blocked.rmdir()

    restarted = finish(tmp_path, log)
    assert restarted.stats.read == {"duplicate": 200, "outcome": 40}
    assert written_ids(root) == {f"d{i}": 1 for i in range(200)}
    assert written_ids(root, "outcomes") == {f"o{i}": 1 for i in range(40)}
    entry = writer.Journal(root).read()
    assert entry is not None and entry.flush >= 2
