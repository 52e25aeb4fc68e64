"""The Kafka backend (confluent-kafka): an idempotent, keyed producer and manually committed groups.

Records are keyed by card (decisions) or transaction (outcomes): the partitioner puts a key
on one partition, and the idempotent producer (``acks=all``) keeps each partition's order
through retries, so per-card order holds. Consumers commit only after the caller applied
what it polled, and use static membership (``group.instance.id`` made of the consumer name
and the topic), so a restarted consumer gets its partitions back at once instead of after a
session timeout. A group id serves one topic at a time; pointed at another, it reads that
topic from its committed offsets there (from the earliest for a new one). The topic is
created with the configured partitions and retention if it does not exist.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from services.eventlog.records import BackendUnavailable, KeyValue, Record
from services.eventlog.settings import EventLogSettings

log = logging.getLogger(__name__)


def _base_config(settings: EventLogSettings) -> dict[str, Any]:
    # librdkafka's own log lines go through Python logging, not straight to stderr.
    return {"bootstrap.servers": settings.kafka_bootstrap, "logger": log, **settings.kafka_config}


def static_member_id(consumer_name: str, topic: str) -> str:
    """The Kafka static member id (``group.instance.id``) of a consumer on ``topic``:
    ``<name>.<topic>``, or ``<name>.<hash of topic>`` when that would pass Kafka's 249
    characters; only the characters Kafka allows in names."""
    member = f"{consumer_name}.{topic}"
    if len(member) <= 249:
        return member
    return f"{consumer_name}.{hashlib.blake2b(topic.encode(), digest_size=8).hexdigest()}"


def ensure_topic(settings: EventLogSettings, timeout_s: float | None = None) -> None:
    """Creates the topic if the cluster does not have it; raises ``BackendUnavailable`` if
    the cluster does not answer. A topic that exists is used as it is (created by an
    operator, possibly with other partitions and retention)."""
    timeout = settings.send_timeout_s if timeout_s is None else timeout_s
    admin = AdminClient(_base_config(settings))
    try:
        metadata = admin.list_topics(topic=settings.topic, timeout=timeout)
    except KafkaException as exc:
        raise BackendUnavailable(f"kafka: metadata: {exc}") from exc
    found = metadata.topics.get(settings.topic)
    if found is not None and found.error is None:
        return
    topic = NewTopic(
        settings.topic,
        num_partitions=settings.kafka_partitions,
        replication_factor=settings.kafka_replication,
        config={"retention.ms": str(settings.kafka_retention_ms)},
    )
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[settings.topic].result(timeout=timeout + 1)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise BackendUnavailable(f"kafka: creating topic {settings.topic}: {exc}") from exc
    except Exception as exc:  # the future times out with a plain exception
        raise BackendUnavailable(f"kafka: creating topic {settings.topic}: {exc!r}") from exc


class KafkaWriter:
    """Produces batches and waits for the brokers' acknowledgement of each."""

    def __init__(self, settings: EventLogSettings) -> None:
        self._settings = settings
        timeout_ms = int(settings.send_timeout_s * 1000)
        self._producer = Producer(
            {
                "enable.idempotence": True,
                "acks": "all",
                # The caller already batches; librdkafka only needs to pack one batch.
                "linger.ms": 1,
                # Events are small and mostly floats: compression costs more CPU per batch
                # than it saves (docs/eventlog.md); kafka_config can turn it on.
                "compression.type": "none",
                # A message the cluster has not taken within this time fails, and its
                # batch goes to the spill file instead of waiting in librdkafka.
                "message.timeout.ms": timeout_ms,
                "request.timeout.ms": min(timeout_ms, 30_000),
                **_base_config(settings),
            }
        )
        self._topic_ready = False

    def write(self, batch: Sequence[KeyValue]) -> None:
        """Produces the batch in order and waits for every delivery report."""
        if not self._topic_ready:
            ensure_topic(self._settings)
            self._topic_ready = True
        failed: dict[int, str] = {}
        stored: set[int] = set()

        def report(index: int) -> Any:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                if err is None:
                    stored.add(index)
                else:
                    failed[index] = err.str()

            return on_delivery

        topic = self._settings.topic
        produce = self._producer.produce
        for i, (key, value) in enumerate(batch):
            try:
                produce(topic, value=value, key=key, on_delivery=report(i))
            except BufferError:
                self._producer.poll(0.1)
                produce(topic, value=value, key=key, on_delivery=report(i))
        remaining = self._producer.flush(self._settings.send_timeout_s + 1.0)
        if remaining:
            # Take them back from librdkafka (their reports come as purge errors), so that
            # the spill file, not librdkafka's memory, holds them while the cluster is away.
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.flush(1.0)
            # A message with no report at all is in doubt: rewriting it may duplicate it;
            # one acknowledged before the purge is not rewritten.
            for i in range(len(batch)):
                if i not in stored:
                    failed.setdefault(i, "not delivered in time")
        if failed:
            first = next(iter(failed.values()))
            raise BackendUnavailable(
                f"kafka: {len(failed)} of {len(batch)} not delivered ({first})",
                failed=sorted(failed),
            )

    def sync(self) -> None:
        """Nothing to do: every write already waited for the brokers' acknowledgement."""

    def close(self) -> None:
        """Flushes what librdkafka still holds."""
        self._producer.flush(self._settings.send_timeout_s)


class KafkaConsumer:
    """A consumer group member on the topic; commits what was polled when told to."""

    def __init__(
        self, settings: EventLogSettings, group: str, consumer_name: str | None = None
    ) -> None:
        self.group = group
        self.name = consumer_name or settings.consumer_name
        self._settings = settings
        ensure_topic(settings)
        self._consumer = Consumer(
            {
                "group.id": group,
                # The topic is part of the static member id: a member that comes back under
                # the same id gets its old assignment back without a rebalance, so a group
                # pointed at another topic under the same name would keep the old topic's
                # partitions and read nothing until its session expired.
                "group.instance.id": static_member_id(self.name, settings.topic),
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                # The classic protocol: with static membership, a consumer restarted after a
                # crash takes its partitions back at once (the new protocol refuses the
                # instance id until the dead member's session has expired).
                "group.protocol": "classic",
                "session.timeout.ms": settings.kafka_session_timeout_ms,
                "heartbeat.interval.ms": max(1000, settings.kafka_session_timeout_ms // 5),
                # Return fetched data at once rather than waiting for a fuller fetch.
                "fetch.wait.max.ms": 50,
                **_base_config(settings),
            }
        )
        self._consumer.subscribe([settings.topic])
        self._uncommitted = False

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Waits up to ``timeout_s`` for a first record, then takes what is already fetched."""
        first = self._consumer.poll(timeout_s)
        if first is None:
            return []
        messages = [first]
        if max_records > 1:
            messages += self._consumer.consume(max_records - 1, 0)
        records = []
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.fatal():
                    raise BackendUnavailable(f"kafka: {error.str()}")
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("eventlog kafka consumer: %s", error.str())
                continue
            records.append(
                Record(msg.key() or b"", msg.value() or b"", f"{msg.partition()}:{msg.offset()}")
            )
        if records:
            self._uncommitted = True
        return records

    def commit(self) -> None:
        """Commits the positions after every record polled so far (synchronously)."""
        if not self._uncommitted:
            return
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError._NO_OFFSET:
                self._uncommitted = False
                return
            raise BackendUnavailable(f"kafka: commit failed: {exc}") from exc
        self._uncommitted = False

    def close(self) -> None:
        """Closes the consumer; uncommitted records are delivered again."""
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
