"""The event log: decision and outcome events from the gateway to the pipelines that consume them.

A small backend-neutral API over three backends chosen by ``EventLogSettings.backend``:
a durable local file log (the embedded default), Redis Streams, and Kafka.

- ``open_producer(settings)`` → ``Producer``: ``append(envelope)`` costs a serialization and a
  queue append on the caller's thread and never blocks; a sender thread batches the I/O,
  spills to local disk while the backend is down or slow, and ``close`` loses nothing.
- ``open_producer(settings, journal="write")`` → ``JournalProducer``: ``append`` writes the
  event to a local journal file before it returns (``journal.py``), so a crash of the caller
  loses nothing it appended; adopted journals are delivered exactly once (file, Redis).
- ``open_consumer(settings, group)`` → ``Consumer``: ``poll`` batches, apply them, ``commit``;
  at-least-once, resuming from the group's last commit after a crash.

No transport (gRPC) code here; the gateway, the feature updater and the decision sink use it.
"""

from services.eventlog.backends import AnyProducer, open_consumer, open_producer, open_writer
from services.eventlog.journal import JournalProducer
from services.eventlog.metrics import EventLogMetrics
from services.eventlog.producer import Producer, ProducerClosedError, ProducerStats
from services.eventlog.records import (
    BackendUnavailable,
    Consumer,
    CorruptLogError,
    EventLogError,
    GroupBusyError,
    KeyValue,
    LogWriter,
    Record,
)
from services.eventlog.settings import EventLogSettings

__all__ = [
    "AnyProducer",
    "BackendUnavailable",
    "Consumer",
    "CorruptLogError",
    "EventLogError",
    "EventLogMetrics",
    "EventLogSettings",
    "GroupBusyError",
    "JournalProducer",
    "KeyValue",
    "LogWriter",
    "Producer",
    "ProducerClosedError",
    "ProducerStats",
    "Record",
    "open_consumer",
    "open_producer",
    "open_writer",
]
