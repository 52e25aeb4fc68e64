"""The decision sink as a process on the file log, Redis Streams and Kafka: events land in
Parquet once each, through SIGTERM, kill -9 under a steady stream and a backend outage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from loadtest.brokers import RedisServer, wait_until
from services.common import metric_catalogue as catalogue
from services.eventlog import EventLogMetrics, EventLogSettings, Producer, open_producer
from services.pipelines import decisions as reader
from tests.integration.decisionlog.conftest import LogFactory, Sink, wait_written
from tests.integration.decisionlog.sample import decision, outcome
from tests.integration.eventlog.conftest import settings_factory

pytestmark = pytest.mark.integration

SinkFactory = Callable[..., Sink]


def producer_on(settings: EventLogSettings) -> Producer:
    return open_producer(settings, EventLogMetrics(CollectorRegistry()))


def test_events_land_in_parquet(log_settings: LogFactory, sink_factory: SinkFactory) -> None:
    settings = log_settings()
    sink = sink_factory(settings)
    sink.start()
    producer = producer_on(settings)
    for i in range(300):
        producer.append(decision(i))
        if i % 3 == 0:
            producer.append(outcome(i))
    assert producer.flush(60)
    producer.close()
    wait_written(sink.root, {f"d{i}" for i in range(300)})
    wait_written(sink.root, {f"o{i}" for i in range(0, 300, 3)}, "outcomes")
    assert wait_until(lambda: sink.metric(catalogue.DECISIONLOG_PENDING) == 0, 30)
    assert sink.metric(catalogue.DECISIONLOG_EVENTS_WRITTEN) == 400
    assert sink.metric(catalogue.DECISIONLOG_PARTS_WRITTEN) >= 2
    assert sink.stop() == 0
    assert max(sink.written().values()) == 1
    table, summary = reader.joined(sink.root)
    assert summary.decisions == 300 and summary.with_outcome == 100
    row = next(r for r in table.to_pylist() if r["transaction_id"] == "tx-3")
    assert row["outcome"] == "fraud" and row["card_id"] == "card-3"
    assert len(row["features"]) > 0 and row["decision"] == "approve"


class Feeder(threading.Thread):
    """Appends decisions ``d0, d1, …`` at about ``rate`` per second until stopped."""

    def __init__(self, producer: Producer, rate: float) -> None:
        super().__init__(daemon=True)
        self.producer = producer
        self.rate = rate
        self.sent = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.producer.append(decision(self.sent))
            self.sent += 1
            time.sleep(1 / self.rate)


def test_kill_9_under_a_steady_stream_loses_and_duplicates_nothing(
    log_settings: LogFactory, sink_factory: SinkFactory
) -> None:
    settings = log_settings()
    sink = sink_factory(settings, flush_interval_s=0.2)
    sink.start()
    producer = producer_on(settings)
    feeder = Feeder(producer, 400)
    feeder.start()
    try:
        for _ in range(3):
            # Kill it once it has written something since it (re)started.
            before = sink.metric(catalogue.DECISIONLOG_PARTS_WRITTEN)
            # Generous: a restarted consumer rejoins its group, which on a starved machine
            # has taken over a minute once (Kafka).
            assert wait_until(
                lambda b=before: sink.metric(catalogue.DECISIONLOG_PARTS_WRITTEN) > b, 150
            ), (sink.logs / f"sink-{sink.starts}.log").read_text()[-3000:]
            sink.kill()
            sink.start()
    finally:
        feeder.done.set()
        feeder.join(30)
    assert producer.flush(60)
    producer.close()
    sent = feeder.sent
    assert sent > 0
    wait_written(sink.root, {f"d{i}" for i in range(sent)})
    assert sink.stop() == 0
    counts = sink.written()
    assert set(counts) == {f"d{i}" for i in range(sent)}
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1][:10]


def test_sigterm_writes_what_was_read(tmp_path: Path, sink_factory: SinkFactory) -> None:
    settings = EventLogSettings(backend="file", var_dir=tmp_path, topic="sigterm", groups=())
    # No flush by time: only SIGTERM (or size) writes.
    sink = sink_factory(settings, flush_interval_s=300)
    sink.start()
    producer = producer_on(settings)
    for i in range(500):
        producer.append(decision(i))
    producer.close()
    assert wait_until(lambda: sink.metric(catalogue.DECISIONLOG_PENDING) == 500, 60)
    assert not sink.written()
    assert sink.stop() == 0
    assert sink.written() == {f"d{i}": 1 for i in range(500)}
    # The position was committed: a restarted sink writes nothing again.
    sink.start()
    assert sink.stop() == 0
    assert sink.written() == {f"d{i}": 1 for i in range(500)}


@pytest.mark.redis
def test_redis_briefly_down_loses_nothing(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    tmp_path: Path,
    sink_factory: SinkFactory,
) -> None:
    settings = settings_factory(request, "redis", tmp_path)(send_timeout_s=1.0)
    sink = sink_factory(settings)
    sink.start()
    producer = producer_on(settings)
    for i in range(200):
        producer.append(decision(i))
    assert producer.flush(60)
    wait_written(sink.root, {f"d{i}" for i in range(200)})
    redis_server.stop()
    try:
        for i in range(200, 500):
            producer.append(decision(i))
        assert wait_until(lambda: producer.stats.spilled >= 300, 60)
        assert wait_until(lambda: sink.metric(catalogue.DECISIONLOG_BACKEND_UP) == 0, 60)
    finally:
        redis_server.start()
    for i in range(500, 600):
        producer.append(decision(i))
    assert producer.flush(120), producer.stats
    producer.close()
    wait_written(sink.root, {f"d{i}" for i in range(600)})
    assert sink.metric(catalogue.DECISIONLOG_BACKEND_UP) == 1
    assert sink.stop() == 0
    assert max(sink.written().values()) == 1
