"""Backend outages: the producer spills to disk while Redis or the Kafka broker is down and
delivers everything once it is back; SIGTERM during an outage loses nothing."""

from __future__ import annotations

import collections
import signal
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from loadtest.brokers import KafkaBroker, RedisServer, wait_until
from services.eventlog import (
    EventLogMetrics,
    EventLogSettings,
    Producer,
    open_consumer,
    open_producer,
)
from tests.integration.eventlog.conftest import (
    drain,
    read_json_lines,
    settings_factory,
    start_worker,
)
from tests.integration.eventlog.sample import decision, event_id

pytestmark = pytest.mark.integration


def append(producer: Producer, start: int, stop: int) -> None:
    for i in range(start, stop):
        producer.append(decision(i))


def assert_complete(settings: EventLogSettings, total: int) -> None:
    """Every event 0..total-1 is on the log exactly once... or more (at least once), with
    each card's events in order."""
    with open_consumer(settings, f"{settings.topic}-check") as consumer:
        records = drain(consumer, total, timeout_s=60)
        records += consumer.poll(10_000, 0.5)
    assert {event_id(r) for r in records} == {f"e{i}" for i in range(total)}
    per_card: dict[str, list[int]] = collections.defaultdict(list)
    for record in records:
        d = record.envelope().decision
        if d.amount_minor not in per_card[d.card_id]:
            per_card[d.card_id].append(d.amount_minor)
    for card, amounts in per_card.items():
        assert amounts == sorted(amounts), card


def outage(producer: Producer, stop: object, start: object) -> None:
    """Appends 200 before, 300 during and 100 after an outage of the backend."""
    assert callable(stop) and callable(start)
    append(producer, 0, 200)
    assert producer.flush(60)
    stop()
    try:
        append(producer, 200, 500)
        assert wait_until(lambda: producer.stats.spilled >= 300, 60), producer.stats
        assert not producer.stats.backend_up
        assert not producer.flush(0.5)
    finally:
        start()
    append(producer, 500, 600)
    assert producer.flush(120), producer.stats
    producer.close()
    assert producer.stats.dropped == 0
    assert producer.stats.delivered == 600


@pytest.mark.redis
def test_redis_outage_spills_and_delivers_everything(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = settings_factory(request, "redis", tmp_path)(send_timeout_s=1.0)
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    outage(producer, redis_server.stop, redis_server.start)
    assert_complete(settings, 600)


@pytest.mark.redis
def test_sigterm_during_an_outage_loses_nothing(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A producer process gets SIGTERM while Redis is down: its events stay in its spill
    file, and the next producer on the same spill folder delivers them."""
    settings = settings_factory(request, "redis", tmp_path)(send_timeout_s=1.0)
    redis_server.stop()
    try:
        worker = start_worker(settings, "produce", "--count", "1000", log_path=tmp_path / "p.log")
        read_json_lines(worker, lambda m: "done" in m)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        redis_server.start()
    assert list(settings.spill_path.glob("spill-*.log"))
    successor = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    successor.close()
    assert successor.stats.replayed == 1000
    assert not list(settings.spill_path.glob("spill-*.log"))
    assert_complete(settings, 1000)


@pytest.mark.kafka
def test_kafka_outage_spills_and_delivers_everything(
    request: pytest.FixtureRequest, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    settings = settings_factory(request, "kafka", tmp_path)(send_timeout_s=2.0)
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    outage(producer, kafka_broker.stop, kafka_broker.start)
    assert_complete(settings, 600)
