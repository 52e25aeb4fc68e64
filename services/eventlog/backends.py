"""Opens the configured backend's writer, producer and consumers."""

from __future__ import annotations

from typing import Literal

from services.eventlog.journal import JournalProducer
from services.eventlog.metrics import EventLogMetrics
from services.eventlog.producer import Producer
from services.eventlog.records import Consumer, LogWriter
from services.eventlog.settings import EventLogSettings

AnyProducer = Producer | JournalProducer
"""Either kind of producer: both append, flush, close and report the same stats."""


def open_writer(settings: EventLogSettings) -> LogWriter:
    """The backend's synchronous writer (what the producer's sender thread uses)."""
    if settings.backend == "file":
        from services.eventlog.filelog import FileLogWriter

        return FileLogWriter(settings)
    if settings.backend == "redis":
        from services.eventlog.redis_streams import RedisStreamWriter

        return RedisStreamWriter(settings)
    from services.eventlog.kafka_log import KafkaWriter

    return KafkaWriter(settings)


def open_producer(
    settings: EventLogSettings,
    metrics: EventLogMetrics | None = None,
    journal: Literal["off", "write", "fsync"] = "off",
) -> AnyProducer:
    """A producer on the configured backend. It connects lazily: a backend that is down at
    start only means the first events wait (spilled, or in the journal). ``journal`` other
    than ``off`` gives a ``JournalProducer`` (each event on local disk when ``append``
    returns; ``fsync``: once ``durable`` returns), else a memory-buffered ``Producer``."""
    if journal == "off":
        return Producer(settings, lambda: open_writer(settings), metrics)
    return JournalProducer(settings, lambda: open_writer(settings), metrics, sync=journal)


def open_consumer(
    settings: EventLogSettings, group: str, consumer_name: str | None = None
) -> Consumer:
    """A member of ``group`` on the configured backend, resuming from the group's last commit.
    ``consumer_name`` overrides the settings' (Redis consumer, Kafka static member)."""
    if settings.backend == "file":
        from services.eventlog.filelog import FileLogConsumer

        return FileLogConsumer(settings, group)
    if settings.backend == "redis":
        from services.eventlog.redis_streams import RedisStreamConsumer

        return RedisStreamConsumer(settings, group, consumer_name)
    from services.eventlog.kafka_log import KafkaConsumer

    return KafkaConsumer(settings, group, consumer_name)
