"""The event log's contract, run on every backend: the file log, Redis Streams and Kafka."""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from services.eventlog import EventLogMetrics, open_consumer, open_producer
from tests.integration.eventlog.conftest import (
    SettingsFactory,
    drain,
    read_json_lines,
    start_worker,
)
from tests.integration.eventlog.sample import decision, event_id, outcome

pytestmark = pytest.mark.integration


def metrics() -> EventLogMetrics:
    return EventLogMetrics(CollectorRegistry())


def test_append_consume_commit(log_settings: SettingsFactory) -> None:
    settings = log_settings()
    group = f"{settings.topic}-g"
    producer = open_producer(settings, metrics())
    sent = [decision(i) if i % 4 else outcome(i) for i in range(300)]
    for envelope in sent:
        producer.append(envelope)
    assert producer.flush(30)
    producer.close()
    assert producer.stats.delivered == 300

    with open_consumer(settings, group) as consumer:
        records = drain(consumer, 300)
        consumer.commit()
    assert sorted(r.value for r in records) == sorted(e.SerializeToString() for e in sent)
    by_id = {event_id(r): r for r in records}
    assert by_id["e1"].key == b"card-1"
    assert by_id["o4"].key == b"tx-4"
    assert by_id["e7"].envelope() == decision(7)

    with open_consumer(settings, group) as consumer:
        assert consumer.poll(500, 1.0) == []


def test_per_key_order(log_settings: SettingsFactory) -> None:
    settings = log_settings()
    group = f"{settings.topic}-g"
    producer = open_producer(settings, metrics())
    for i in range(600):
        producer.append(decision(i, cards=7))
    producer.close()
    with open_consumer(settings, group) as consumer:
        records = drain(consumer, 600)
    per_card: dict[str, list[int]] = collections.defaultdict(list)
    for record in records:
        d = record.envelope().decision
        per_card[d.card_id].append(d.amount_minor)
    assert len(per_card) == 7
    for card, amounts in per_card.items():
        assert amounts == sorted(amounts), card
        assert len(amounts) == len(set(amounts))
    assert sum(map(len, per_card.values())) == 600


def test_several_groups_each_get_everything(log_settings: SettingsFactory) -> None:
    settings = log_settings()
    groups = (f"{settings.topic}-a", f"{settings.topic}-b")
    settings = settings.model_copy(update={"groups": groups})
    producer = open_producer(settings, metrics())
    for i in range(200):
        producer.append(decision(i))
    producer.close()
    for group in settings.groups:
        with open_consumer(settings, group) as consumer:
            records = drain(consumer, 200)
            consumer.commit()
        assert {event_id(r) for r in records} == {f"e{i}" for i in range(200)}


def test_close_delivers_without_flush(log_settings: SettingsFactory) -> None:
    settings = log_settings()
    group = f"{settings.topic}-g"
    producer = open_producer(settings, metrics())
    for i in range(1000):
        producer.append(decision(i))
    producer.close()
    assert producer.stats.delivered == 1000
    with open_consumer(settings, group) as consumer:
        assert len(drain(consumer, 1000)) == 1000


def test_consumer_killed_mid_stream_resumes_without_loss(
    log_settings: SettingsFactory, tmp_path: Path
) -> None:
    """kill -9 of a consumer that applied a batch but did not commit it: a restarted member of
    the group gets that batch again (duplicates, counted) and everything after it."""
    settings = log_settings()
    group = f"{settings.topic}-g"
    total = 1000
    producer = open_producer(settings, metrics())
    for i in range(total):
        producer.append(decision(i))
    producer.close()

    applied = tmp_path / "applied.txt"
    worker = start_worker(
        settings,
        "consume",
        "--group", group,
        "--out", str(applied),
        "--stop-after", "300",
        log_path=tmp_path / "worker.log",
    )  # fmt: skip
    try:
        read_json_lines(worker, lambda m: "stuck" in m)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)

    first = applied.read_text().split()
    every = {f"e{i}" for i in range(total)}
    with open_consumer(settings, group) as consumer:
        # Until every event came (the uncommitted batch again, then the rest), then whatever
        # else is left; a count would wait out the timeout whenever that batch was short.
        second: list[str] = []
        deadline = time.monotonic() + 60
        while not every <= {*first, *second} and time.monotonic() < deadline:
            second += [event_id(r) for r in consumer.poll(500, 0.5)]
        second += [event_id(r) for r in consumer.poll(500, 1.0)]
        consumer.commit()
    seen = first + second
    duplicates = len(seen) - len(set(seen))
    assert set(seen) == every
    # Exactly the batch that was applied but not committed comes again (at least once).
    assert 0 < duplicates <= 50
    print(f"{settings.backend}: {duplicates} duplicate(s) after kill -9")


def test_a_group_moved_to_another_topic_reads_that_topic(log_settings: SettingsFactory) -> None:
    """An operator who points a consumer at a new topic under the same group and name gets
    the new topic's records, even within the old member's session (Kafka keeps a static
    member's assignment for a consumer that comes back under the same instance id)."""
    first = log_settings()
    second = log_settings(topic=f"{first.topic}-next")
    group = f"{first.topic}-g"
    for settings, base in ((first, 100), (second, 200)):
        producer = open_producer(settings, metrics())
        for i in range(20):
            producer.append(decision(base + i))
        assert producer.flush(30)
        producer.close()
    with open_consumer(first, group) as consumer:
        assert sorted(event_id(r) for r in drain(consumer, 20)) == sorted(
            f"e{100 + i}" for i in range(20)
        )
        consumer.commit()
    with open_consumer(second, group) as consumer:
        records = drain(consumer, 20, timeout_s=90)
        consumer.commit()
    assert sorted(event_id(r) for r in records) == sorted(f"e{200 + i}" for i in range(20))
