"""The files and topics of a partitioned updater group (``partitioned.py``): where each
partition's state lives, the lock that keeps one member on it, the seed every partition
shares, and the merchant-keyed topic."""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from services.eventlog import BackendUnavailable, EventLogError, EventLogSettings
from services.eventlog.kafka_log import ensure_topic
from services.updater.engine import LiveAggregator
from services.updater.joiner import OutcomeJoin
from services.updater.state import StateStore

log = logging.getLogger(__name__)

MERCHANT_TOPIC_SUFFIX = ".by-merchant"
TRANSACTION_TOPIC_SUFFIX = ".by-transaction"
OFFSET_KEY = "next_offset"
"""Meta key of a partition's state file: the offset its checkpoint covers up to."""


def group_id(group: str) -> str:
    """The Kafka group of a partitioned updater group: apart from the single updater's, whose
    committed offsets match only its own state file (scaling from one updater to several and
    back leaves each resuming where its own state is)."""
    return group + ".partitioned"


def merchant_topic(topic: str) -> str:
    """The merchant-keyed topic a partitioned group forwards ``topic``'s events to."""
    return topic + MERCHANT_TOPIC_SUFFIX


def transaction_topic(topic: str) -> str:
    """The transaction-keyed topic where outcomes meet their decisions' index entries."""
    return topic + TRANSACTION_TOPIC_SUFFIX


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of a key: CRC-32 modulo the count (what librdkafka's default
    partitioner does with a key)."""
    return zlib.crc32(key) % partitions


class Kind(enum.StrEnum):
    """What a partition's state holds: card windows (the event log's partitions), merchant
    and terminal windows (the merchant-keyed topic's), or the outcome join (the
    transaction-keyed topic's)."""

    CARDS = "cards"
    MERCHANTS = "merchants"
    TRANSACTIONS = "transactions"


BASE_FILE = "base.db"
"""The seed every partition reads for the entities it has not changed."""


@contextlib.contextmanager
def seed_lock(directory: Path) -> Iterator[None]:
    """Held while a member checks (and builds) the shared seed: one member seeds, the
    others wait and find it done."""
    fd = os.open(directory / "base.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def discard_partitions(directory: Path) -> None:
    """Deletes every partition's state (the seed they build on is about to change); raises
    ``PartitionBusy`` if a member holds one: the members must all stop first."""
    held = []
    try:
        for lock in sorted(directory.glob("*-*.lock")):
            held.append(lock_file(lock, 0.0))
        for path in directory.glob("*-*.db*"):
            path.unlink()
    except PartitionBusy as error:
        raise PartitionBusy(
            f"the dataset changed since the group's seed, but {error}: stop every member of "
            "the group, then start them again to seed from the new dataset"
        ) from None
    finally:
        for fd in held:
            os.close(fd)


def state_file(directory: Path, kind: Kind, partition: int) -> Path:
    """The state file of one partition."""
    return directory / f"{kind.value}-{partition}.db"


class PartitionBusy(EventLogError):
    """Another member still holds a partition's state file."""


class PartitionsChanged(Exception):
    """A topic's partition count is not the one the group's states were built on."""


COUNTS_FILE = "partitions.json"
"""The partition count of each topic the group's states were built on."""


def check_partition_counts(directory: Path, counts: dict[str, int]) -> None:
    """Records the topics' partition counts at the group's first start; afterwards raises
    ``PartitionsChanged`` if one differs: a key's partition, and so the state file that
    holds its windows, follows from the count, and a changed count would apply a card's or a
    merchant's events onto a state that lacks its history."""
    path = directory / COUNTS_FILE
    directory.mkdir(parents=True, exist_ok=True)
    with seed_lock(directory):
        if not path.exists():
            scratch = path.with_suffix(".tmp")
            scratch.write_text(json.dumps(counts, sort_keys=True))
            os.replace(scratch, path)
            return
        built = json.loads(path.read_text())
    changed = {t: (built.get(t), n) for t, n in counts.items() if built.get(t) != n}
    if changed:
        detail = ", ".join(f"{t}: {was} then, {now} now" for t, (was, now) in changed.items())
        raise PartitionsChanged(
            f"the group's states were built on other partition counts ({detail}): stop every "
            f"member, delete {directory}, and start again to seed and replay the log"
        )


@dataclass
class Part:
    """One partition this member owns: its state file, its windows, where it is in the log."""

    kind: Kind
    partition: int
    store: StateStore
    lock_fd: int
    next_offset: int | None
    agg: LiveAggregator | None = None
    """The windows of a card or merchant partition."""
    join: OutcomeJoin | None = None
    """The join of a transaction partition."""
    changed: bool = False

    def meta(self) -> dict[str, str]:
        """What the partition's checkpoint saves besides its state: its next offset."""
        return {} if self.next_offset is None else {OFFSET_KEY: str(self.next_offset)}

    @property
    def pending(self) -> int:
        """Outcomes held here for a decision (or an index entry) not seen yet."""
        if self.agg is not None:
            return self.agg.pending_labels
        return self.join.pending if self.join is not None else 0

    def take_dropped(self) -> int:
        """Held outcomes dropped since the last call."""
        if self.agg is not None:
            dropped, self.agg.labels_dropped = self.agg.labels_dropped, 0
        elif self.join is not None:
            dropped, self.join.dropped = self.join.dropped, 0
        else:
            dropped = 0
        return dropped

    def close(self) -> None:
        self.store.close()
        os.close(self.lock_fd)


def lock_file(path: Path, timeout_s: float) -> int:
    """An exclusive lock on ``path`` (waits up to ``timeout_s`` for a member finishing with it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise PartitionBusy(f"{path.name} is still held by another member") from None
            time.sleep(0.05)


class Topics:
    """The three topics of a group: the event log, and the merchant- and transaction-keyed
    topics it forwards to (created if missing, with the event log's partitions and
    replicas), and how many partitions each forwarded topic has."""

    def __init__(self, events: EventLogSettings) -> None:
        self.events = events.topic
        self.merchants = merchant_topic(events.topic)
        self.transactions = transaction_topic(events.topic)
        self._settings = events
        self.partitions: dict[str, int] = {}

    def kind_of(self, topic: str) -> Kind:
        """Which state a partition of ``topic`` holds."""
        if topic == self.events:
            return Kind.CARDS
        return Kind.MERCHANTS if topic == self.merchants else Kind.TRANSACTIONS

    def ensure(self) -> None:
        """Creates what is missing; learns the forwarded topics' partition counts."""
        ensure_topic(self._settings)
        config: dict[str, Any] = {
            "bootstrap.servers": self._settings.kafka_bootstrap,
            "logger": log,
            **self._settings.kafka_config,
        }
        admin = AdminClient(config)
        timeout = self._settings.send_timeout_s
        self.partitions[self.events] = self._partitions(admin, self.events, timeout)
        for name in (self.merchants, self.transactions):
            if self._partitions(admin, name, 0.0) == 0:
                self._create(admin, name)
            self.partitions[name] = self._partitions(admin, name, timeout)

    def _create(self, admin: AdminClient, name: str) -> None:
        """Creates a forwarded topic like the event log: its partitions and replicas."""
        timeout = self._settings.send_timeout_s
        partitions = self._partitions(admin, self.events, timeout)
        events = admin.list_topics(topic=self.events, timeout=timeout).topics[self.events]
        replicas = len(events.partitions[0].replicas) or self._settings.kafka_replication
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replicas,
            config={"retention.ms": str(self._settings.kafka_retention_ms)},
        )
        future = admin.create_topics([topic], operation_timeout=timeout)[name]
        try:
            future.result(timeout=timeout + 1)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (
                isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
            ):
                raise BackendUnavailable(f"kafka: creating {name}: {exc}") from exc

    @staticmethod
    def _partitions(admin: AdminClient, topic: str, timeout_s: float) -> int:
        """The topic's partition count, waiting up to ``timeout_s`` for a topic just created
        to show its partitions; 0 if it has none by then."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = admin.list_topics(topic=topic, timeout=max(timeout_s, 1.0)).topics
            except KafkaException as exc:
                raise BackendUnavailable(f"kafka: metadata: {exc}") from exc
            meta = found.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                return len(meta.partitions)
            if time.monotonic() >= deadline:
                if timeout_s > 0:
                    raise BackendUnavailable(f"kafka: {topic} shows no partitions")
                return 0
            time.sleep(0.1)
