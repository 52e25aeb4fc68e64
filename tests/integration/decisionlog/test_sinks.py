"""Several decision sinks in one consumer group, on a Kafka topic of 6 partitions and on a
Redis stream: each writes its own parts into one log, which reads as the log one sink
writes; a sink killed mid-stream hands its share to the other, and nothing is lost."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from loadtest.brokers import wait_until
from services.decisionlog import layout
from services.eventlog import EventLogSettings
from services.pipelines import decisions as reader
from tests.integration.decisionlog.conftest import Sink, wait_written, written_ids
from tests.integration.decisionlog.sample import outcome
from tests.integration.decisionlog.test_sink import Feeder, producer_on
from tests.integration.eventlog.conftest import settings_factory

pytestmark = pytest.mark.integration

SinkFactory = Callable[..., Sink]
PARTITIONS = 6


@pytest.fixture(params=("kafka", "redis"))
def topic(request: pytest.FixtureRequest, tmp_path: Path) -> EventLogSettings:
    """A fresh Kafka topic of 6 partitions, or a fresh Redis stream."""
    return settings_factory(request, request.param, tmp_path)(kafka_partitions=PARTITIONS)


def named(settings: EventLogSettings, name: str) -> EventLogSettings:
    return settings.model_copy(update={"consumer_name": name})


def sinks_of(root: Path) -> set[str | None]:
    """The sinks whose parts are in the log under ``root``."""
    return {
        layout.part_sink(part.name)
        for kind in layout.KINDS
        for _, day_dir in layout.day_dirs(root, kind)
        for part in layout.parts(day_dir)
    }


def exported(root: Path) -> list[dict[str, object]]:
    """``fraudmesh decisions export``'s rows (decisions with their outcomes), by transaction."""
    table, _ = reader.joined(root)
    assert isinstance(table, pa.Table)
    return sorted(table.to_pylist(), key=lambda row: str(row["transaction_id"]))


def test_two_sinks_write_the_rows_one_sink_writes(
    topic: EventLogSettings, sink_factory: SinkFactory
) -> None:
    one = sink_factory(topic, root="one")
    two = [sink_factory(named(topic, f"sink-{n}"), root="two", group="two") for n in "ab"]
    for sink in (one, *two):
        sink.start(wait=False)
    for sink in (one, *two):
        assert sink.process is not None
        sink.process.wait_ready(120)
    # A steady stream until the group has split the partitions and both members wrote.
    producer = producer_on(topic)
    feeder = Feeder(producer, 300)
    feeder.start()
    try:
        assert wait_until(lambda: sinks_of(two[0].root) == {"sink-a", "sink-b"}, 120)
    finally:
        feeder.done.set()
        feeder.join(30)
    sent = feeder.sent
    for i in range(0, sent, 4):
        producer.append(outcome(i))
    assert producer.flush(60)
    producer.close()
    decisions = {f"d{i}" for i in range(sent)}
    outcomes = {f"o{i}" for i in range(0, sent, 4)}
    for root in (one.root, two[0].root):
        wait_written(root, decisions)
        wait_written(root, outcomes, "outcomes")
    for sink in (one, *two):
        assert sink.stop() == 0

    assert sinks_of(one.root) == {layout.DEFAULT_SINK}
    assert set(written_ids(two[0].root)) == decisions
    rows_one, rows_two = exported(one.root), exported(two[0].root)
    assert len(rows_one) == sent
    assert sum(r["outcome"] is not None for r in rows_one) == len(outcomes)
    assert rows_two == rows_one


def test_a_sink_killed_mid_stream_hands_its_partitions_over(
    topic: EventLogSettings, sink_factory: SinkFactory
) -> None:
    a, b = (sink_factory(named(topic, f"sink-{n}"), group="g", flush_interval_s=0.2) for n in "ab")
    a.start()
    b.start()
    producer = producer_on(topic)
    feeder = Feeder(producer, 200)
    feeder.start()
    try:
        # Both members own partitions and have written some of them.
        assert wait_until(lambda: sinks_of(a.root) == {"sink-a", "sink-b"}, 120)
        b.kill()
        # The killed member's partitions go to the other once its session expires (Kafka,
        # 10 s); its unacknowledged entries once they are idle long enough (Redis).
        sent = feeder.sent
        wait_written(a.root, {f"d{i}" for i in range(sent + 100)}, timeout_s=150)
    finally:
        feeder.done.set()
        feeder.join(30)
    assert producer.flush(60)
    producer.close()
    everything = {f"d{i}" for i in range(feeder.sent)}
    wait_written(a.root, everything)
    assert a.stop() == 0
    assert sinks_of(a.root) == {"sink-a", "sink-b"}
    # A record read by the killed sink but not committed is read again by the other: a
    # duplicate in the parts, never in what the readers give.
    assert set(written_ids(a.root)) == everything
    rows = exported(a.root)
    assert [r["event_id"] for r in rows] == sorted(everything, key=lambda e: f"tx-{e[1:]}")
