"""Updaters as a Kafka consumer group: each partition's windows owned by one member at a time.

The event log is keyed by card (decisions) and by transaction (outcomes), while a merchant's
windows gather the events of every card, and an outcome names only its transaction. So the
group reads three topics, and forwards between them:

- ``<topic>`` (the event log): the member owning its partition *p* applies the card windows
  of *p*'s cards. It forwards each decision to the merchant-keyed topic, and the decision's
  index entry (transaction → merchant, terminal, time) and each outcome to the
  transaction-keyed topic.
- ``<topic>.by-transaction`` (keyed by transaction): the member owning a partition joins
  each outcome with its transaction's index entry (``joiner.py``; the history's transactions
  are in the shared seed) and forwards it to its merchant; an outcome that comes before its
  entry is held in the partition's state until the entry comes.
- ``<topic>.by-merchant`` (keyed by merchant): the member owning a partition applies the
  merchant and terminal windows of its merchants (a terminal's windows live with its
  merchant's: terminal ids are unique across merchants), with the outcomes that come before
  their decision held as in the single updater.

Forwarded records go to partition ``crc32(key) % partitions``. Kafka assigns the partitions;
nothing here schedules. Every partition has its own state file (``<state dir>/<kind>-<n>.db``)
whose checkpoint transaction also saves the partition's next offset, and only the member
holding the partition opens it. A member given a partition opens its file, applies its
journal again and seeks to that offset before it applies anything; one losing a partition
writes its rows, flushes its forwards, snapshots it and closes the file first. Forwards are
flushed before any checkpoint, so a crash at any point forwards again (never loses) what
followed the last one, and the windows count a transaction once (its id). The states the
dataset's history left are seeded once into ``base.db``, which every partition reads (and
none writes) for the entities it has not changed.

A partition's file is locked while a member holds it: a member that lost the partition but
has not noticed yet (paused past its session) cannot write beside the new owner.

How to run and scale it: ``docs/liveloop.md``, "Several updaters".
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from google.protobuf.message import DecodeError

from fraud.v1 import events_pb2
from services.eventlog import BackendUnavailable, EventLogSettings
from services.eventlog import Consumer as EventLogConsumer
from services.eventlog.kafka_log import static_member_id
from services.updater.engine import CARD_VIEWS, MERCHANT_VIEWS, Applied, LiveAggregator, View
from services.updater.joiner import OutcomeJoin, index_entry
from services.updater.loop import RowWriter, UpdaterLoop, event_of, lag_after
from services.updater.metrics import UpdaterMetrics
from services.updater.partitions import (
    OFFSET_KEY,
    Kind,
    Part,
    Topics,
    check_partition_counts,
    group_id,
    lock_file,
    partition_of,
    state_file,
)
from services.updater.settings import UpdaterSettings
from services.updater.state import StateStore

log = logging.getLogger(__name__)


class PartitionedLoop(UpdaterLoop):
    """One member of a partitioned updater group (poll, apply, forward, write, checkpoint)."""

    def __init__(
        self,
        settings: UpdaterSettings,
        events: EventLogSettings,
        writer: RowWriter,
        base: StateStore,
        metrics: UpdaterMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            settings, lambda: cast(EventLogConsumer, self._open()), writer, metrics, clock
        )
        self._events = events
        self._base = base
        self._dir = settings.partition_dir
        self._topics = Topics(events)
        self._parts: dict[tuple[str, int], Part] = {}
        self._kafka: Consumer | None = None
        self._producer: Producer | None = None
        self._forward_errors: list[str] = []
        self._applied = 0

    # --- the group ---------------------------------------------------------------------

    def _open(self) -> _Member:
        self._topics.ensure()
        check_partition_counts(self._dir, self._topics.partitions)
        config = {"bootstrap.servers": self._events.kafka_bootstrap, "logger": log}
        config.update(self._events.kafka_config)
        self._producer = Producer(
            {
                **config,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "none",
                "message.timeout.ms": int(self._events.send_timeout_s * 1000),
            }
        )
        name = self._events.consumer_name
        self._kafka = Consumer(
            {
                **config,
                "group.id": group_id(self._settings.group),
                "group.instance.id": static_member_id(name, self._topics.events),
                "group.protocol": "classic",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": self._events.kafka_session_timeout_ms,
                "heartbeat.interval.ms": max(1000, self._events.kafka_session_timeout_ms // 5),
                "fetch.wait.max.ms": 50,
            }
        )
        self._kafka.subscribe(
            [self._topics.events, self._topics.transactions, self._topics.merchants],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        return _Member(self)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Opens each new partition's state (journal applied again) and seeks to its offset."""
        for tp in partitions:
            part = self._open_part(self._topics.kind_of(tp.topic), tp.partition)
            self._parts[(tp.topic, tp.partition)] = part
            # A partition without a checkpoint holds the seed only: every event the log
            # still has comes after it (the group's committed offsets are for monitoring).
            tp.offset = OFFSET_BEGINNING if part.next_offset is None else part.next_offset
        consumer.assign(partitions)
        self._count_partitions()
        log.info(
            "updater partitions assigned",
            extra={"partitions": sorted(f"{t}:{p}" for t, p in self._parts)},
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Finishes the partitions taken away: rows, forwards, a full snapshot, then closed."""
        taken = [
            self._parts[k] for tp in partitions if (k := (tp.topic, tp.partition)) in self._parts
        ]
        try:
            if taken:
                self._write_rows()
                self._flush_forwards()
                for part in taken:
                    self._save_part(part, final=True)
        finally:
            self._drop(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a revoke (session expired): another member may own them
        now, so nothing more is saved; their files keep the last checkpoint."""
        self._drop(partitions)

    def _count_partitions(self) -> None:
        for kind in Kind:
            owned = sum(1 for part in self._parts.values() if part.kind is kind)
            self._metrics.partitions.labels(kind.value).set(owned)

    def _drop(self, partitions: list[TopicPartition] | None = None) -> None:
        keys: list[tuple[str, int]] = (
            list(self._parts)
            if partitions is None
            else [(str(tp.topic), int(tp.partition)) for tp in partitions]
        )
        for key in keys:
            part = self._parts.pop(key, None)
            if part is not None:
                part.close()
        self._count_partitions()

    def _open_part(self, kind: Kind, partition: int) -> Part:
        path = state_file(self._dir, kind, partition)
        self._dir.mkdir(parents=True, exist_ok=True)
        fd = lock_file(path.with_suffix(".lock"), self._events.kafka_session_timeout_ms / 1000)
        try:
            store = StateStore(path, base=self._base, exclusive=True)
            offset = store.meta(OFFSET_KEY)
            part = Part(kind, partition, store, fd, None if offset is None else int(offset))
            s = self._settings
            if kind is Kind.TRANSACTIONS:
                part.join = OutcomeJoin(store, self._forward_to_merchant, s.max_pending_labels)
            else:
                views = CARD_VIEWS if kind is Kind.CARDS else MERCHANT_VIEWS
                agg = LiveAggregator(
                    store,
                    s.cache_max_entities,
                    s.max_pending_labels,
                    views=views,
                    owns_merchant=self._owns(partition) if kind is Kind.MERCHANTS else None,
                )
                agg.restore_live_rows()
                part.agg = agg
        except BaseException:
            os.close(fd)
            raise
        return part

    def _owns(self, partition: int) -> Callable[[str], bool]:
        """Whether a merchant is keyed to ``partition`` of the merchant-keyed topic (the seed's
        due reports of its terminals are that partition's to apply)."""
        count = self._topics.partitions[self._topics.merchants]
        return lambda merchant_id: partition_of(merchant_id.encode(), count) == partition

    def _aggs(self) -> Iterator[LiveAggregator]:
        """The windows of the card and merchant partitions held."""
        return (p.agg for p in self._parts.values() if p.agg is not None)

    @property
    def sweeps(self) -> bool:
        """Whether this member sweeps the lists' expired entries: the one that owns the
        event log's partition 0 (one member of the group at a time, give or take a
        rebalance; a sweep done twice audits an expiry twice and removes nothing twice)."""
        return (self._topics.events, 0) in self._parts

    # --- the loop ----------------------------------------------------------------------

    def failure_of(self, error: Exception) -> str | None:
        """The Kafka client's own errors are the log's too; the rest as any updater's."""
        if isinstance(error, KafkaException):
            self._connected = False
            return "log"
        return super().failure_of(error)

    def on_failure(self, what: str) -> None:
        """Not ready; after a log or state failure, the member leaves the group and its
        partitions start again from their files (what was applied since is applied again)."""
        self._metrics.ready.set(0)
        if what in ("log", "state"):
            self._drop()
            self.close_consumer()

    def step(self) -> None:
        """One iteration: retry unwritten rows, checkpoint if due, poll, apply, write."""
        if any(agg.rows_pending for agg in self._aggs()):
            self._write_rows()
        s = self._settings
        if self.checkpoint_due(s.checkpoint_interval_s, self._applied, s.checkpoint_max_events):
            self.checkpoint()
        member = cast(_Member, self.consumer())
        records = member.poll_messages(s.poll_max_records, s.poll_timeout_s)
        self._connected = True
        self._failures.recovered("log")
        if records:
            if self._uncommitted_since is None:
                self._uncommitted_since = time.monotonic()
            last_created = self._apply(records)
            self._write_rows()
            lag = lag_after(len(records), last_created, self._clock(), s)
            self._caught_up = lag is None
            self._metrics.lag.set(lag or 0.0)
        else:
            self._caught_up = True
            self._metrics.lag.set(0.0)
        self._metrics.ready.set(1 if self.ready() else 0)
        self._metrics.pending_labels.set(sum(p.pending for p in self._parts.values()))

    def _apply(self, messages: list[Message]) -> float:
        """Applies (and forwards) the messages; returns the newest one's creation time."""
        m = self._metrics
        last = 0.0
        for msg in messages:
            part = self._parts.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
            if part is None:  # taken away within this poll: its new owner applies it
                continue
            part.next_offset = msg.offset() + 1  # type: ignore[operator]
            part.changed = True
            raw = msg.value() or b""
            try:
                envelope = events_pb2.EventEnvelope.FromString(raw)
                kind, created = event_of(envelope)
                if created is None:
                    m.records.labels(kind).inc()
                    continue
                applied = self._apply_one(part, envelope, kind, raw)
            except (DecodeError, ValueError) as error:
                m.records.labels("invalid").inc()
                log.error(
                    "skipped an invalid event log record",
                    extra={
                        "position": f"{msg.topic()}:{msg.partition()}:{msg.offset()}",
                        "error": str(error),
                    },
                )
                continue
            m.records.labels(kind).inc()
            self._applied += 1
            m.count(applied)
            for view in {v for v, _ in applied.changes}:
                self._unwritten.append((view, created))
            last = max(last, created)
        for part in self._parts.values():
            dropped = part.take_dropped()
            if dropped:
                m.labels_dropped.inc(dropped)
        return last

    def _apply_one(
        self, part: Part, envelope: events_pb2.EventEnvelope, kind: str, raw: bytes
    ) -> Applied:
        if part.join is not None:
            if kind == "decision":
                part.join.entry(envelope.decision)
            else:
                part.join.outcome(envelope.outcome, raw)
            return Applied()
        assert part.agg is not None
        if part.kind is Kind.MERCHANTS:
            return part.agg.apply(envelope, raw)
        if kind == "outcome":
            self._forward(self._topics.transactions, envelope.outcome.transaction_id, raw)
            return Applied()
        applied = part.agg.apply(envelope, raw)
        decision = envelope.decision
        self._forward_to_merchant(decision.merchant_id, raw)
        self._forward(self._topics.transactions, decision.transaction_id, index_entry(decision))
        return applied

    # --- forwarding ----------------------------------------------------------------------

    def _forward_to_merchant(self, merchant_id: str, raw: bytes) -> None:
        self._forward(self._topics.merchants, merchant_id, raw)

    def _forward(self, topic: str, key_text: str, raw: bytes) -> None:
        """Produces one record to ``topic``'s partition of the key (acknowledged by the
        flush before the next checkpoint)."""
        assert self._producer is not None
        key = key_text.encode()
        partition = partition_of(key, self._topics.partitions[topic])
        while True:
            try:
                self._producer.produce(
                    topic, value=raw, key=key, partition=partition, on_delivery=self._delivered
                )
                return
            except BufferError:
                self._producer.poll(0.1)

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._forward_errors.append(err.str())

    def _flush_forwards(self) -> None:
        """Waits until every forward is stored; raises ``BackendUnavailable`` otherwise (the
        partitions then start again from their checkpoints, and forward again)."""
        if self._producer is None:
            return
        remaining = self._producer.flush(self._events.send_timeout_s + 1.0)
        if remaining or self._forward_errors:
            first = self._forward_errors[0] if self._forward_errors else "not delivered in time"
            self._forward_errors.clear()
            raise BackendUnavailable(f"kafka: forwarding: {first}")

    # --- rows and checkpoints --------------------------------------------------------------

    def _write_rows(self) -> None:
        cards, merchants, terminals = [], [], []
        for agg in self._aggs():
            rows = agg.rows()
            cards += rows.cards
            merchants += rows.merchants
            terminals += rows.terminals
        self._writer.write(cards, merchants, terminals)
        for agg in self._aggs():
            agg.rows_written()
        self._store_ok = True
        self._failures.recovered("online_store")
        self._metrics.written(self._unwritten, self._clock())
        self._unwritten.clear()

    def checkpoint(self) -> None:
        """Flushes every forward, then saves each changed partition's state with its offset
        (one transaction per file); then commits the offsets to the group too (what lag
        monitoring reads)."""
        if self._consumer is None or any(agg.rows_pending for agg in self._aggs()):
            return
        self._metrics.checkpoint.observe(self.commit_after(self._save))

    def _save(self) -> None:
        self._flush_forwards()
        for part in self._parts.values():
            if part.changed:
                self._save_part(part)
        self._applied = 0
        for view in View:
            self._metrics.cached.labels(view.value).set(
                sum(agg.sizes()[view] for agg in self._aggs())
            )

    @staticmethod
    def _save_part(part: Part, final: bool = False) -> None:
        """One partition's checkpoint (``final``: every state snapshotted, no journal left)."""
        if part.join is not None:
            part.join.checkpoint(part.meta())
        elif part.agg is not None:
            if final:
                part.agg.snapshot_all(part.meta())
            else:
                part.agg.checkpoint(part.meta())
        part.changed = False

    def commit_offsets(self) -> None:
        """Commits the owned partitions' offsets to the group (asynchronously: the state
        files hold the truth; the group's offsets are for lag monitoring)."""
        assert self._kafka is not None
        offsets = [
            TopicPartition(topic, partition, part.next_offset)
            for (topic, partition), part in self._parts.items()
            if part.next_offset is not None
        ]
        if offsets:
            with contextlib.suppress(KafkaException):
                self._kafka.commit(offsets=offsets, asynchronous=True)

    def finish(self) -> None:
        """On stop: the last rows, a full snapshot of every partition, then leave the group."""
        try:
            if self._parts:
                self._write_rows()
                self._flush_forwards()
                for part in self._parts.values():
                    self._save_part(part, final=True)
                self.commit_offsets()
        except Exception:
            log.exception("final checkpoint failed; the log gives the rest again on restart")
        self.close_consumer()
        self._drop()
        self._metrics.ready.set(0)


class _Member:
    """The consumer as ``ConsumeLoop`` holds it (poll, commit, close)."""

    def __init__(self, loop: PartitionedLoop) -> None:
        self._loop = loop

    def poll_messages(self, max_records: int, timeout_s: float) -> list[Message]:
        kafka = self._loop._kafka
        assert kafka is not None
        first = kafka.poll(timeout_s)
        if first is None:
            return []
        messages = [first]
        if max_records > 1:
            messages += kafka.consume(max_records - 1, 0)
        out = []
        for msg in messages:
            error = msg.error()
            if error is None:
                out.append(msg)
            elif error.fatal():
                raise BackendUnavailable(f"kafka: {error.str()}")
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("updater kafka consumer: %s", error.str())
        return out

    def commit(self) -> None:
        self._loop.commit_offsets()

    def close(self) -> None:
        loop = self._loop
        if loop._kafka is not None:
            try:
                loop._kafka.close()  # revokes: the partitions are finished first
            finally:
                loop._kafka = None
        if loop._producer is not None:
            loop._producer.flush(1.0)
            loop._producer = None
