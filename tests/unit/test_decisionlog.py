"""The decision log's pure parts: names and days, events as rows, and the readers' joins and
deduplication over parts written to a temporary folder."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2, outcomes_pb2, scoring_pb2
from services.decisionlog import joined, layout, writer
from services.decisionlog.metrics import SinkMetrics
from services.decisionlog.rows import AddResult, Batch, RecentIds
from services.decisionlog.settings import DecisionLogSettings
from services.decisionlog.sink import DecisionSink
from services.domain import featurespec
from services.eventlog import EventLogSettings, Record, events
from services.pipelines import decisions as reader

DAY0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def decision(
    event_id: str,
    tx: str,
    at: datetime = DAY0,
    *,
    card: str = "card-1",
    score: float = 0.5,
    features: list[float] | None = None,
) -> events_pb2.EventEnvelope:
    envelope = events_pb2.EventEnvelope()
    d = envelope.decision
    d.event_id = event_id
    d.transaction_id = tx
    d.card_id = card
    d.merchant_id = "merch-00001"
    d.amount_minor = 1234
    d.currency = "EUR"
    d.timestamp.FromDatetime(at - timedelta(milliseconds=5))
    d.decided_at.FromDatetime(at)
    d.decision = scoring_pb2.DECISION_DECLINE
    d.scored_by = scoring_pb2.SCORED_BY_MODEL
    d.feature_source = scoring_pb2.FEATURE_SOURCE_ONLINE
    d.route = events_pb2.ROUTE_CANARY
    d.score = score
    d.model_version = "fraud-lgbm/3"
    d.reasons.extend(["card velocity", "amount"])
    if features is not None:
        d.features.extend(features)
        d.feature_schema = events.feature_schema_id(featurespec.MODEL_FEATURES)
    return envelope


def outcome(
    event_id: str,
    tx: str,
    kind: int = outcomes_pb2.OUTCOME_FRAUD,
    reported: datetime = DAY0,
    received: datetime | None = None,
    reported_by: str = "",
) -> events_pb2.EventEnvelope:
    envelope = events_pb2.EventEnvelope()
    o = envelope.outcome
    o.reported_by = reported_by
    o.event_id = event_id
    o.transaction_id = tx
    o.outcome = kind  # type: ignore[assignment]
    o.source = outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK
    o.reported_at.FromDatetime(reported)
    o.received_at.FromDatetime(received or reported)
    return envelope


def record(envelope: events_pb2.EventEnvelope, position: int = 0) -> Record:
    return Record(events.key_of(envelope), envelope.SerializeToString(), str(position))


def write_flush(
    root: Path,
    flush: int,
    envelopes: list[events_pb2.EventEnvelope],
    sink: str = layout.DEFAULT_SINK,
) -> None:
    """Writes the envelopes as flush number ``flush`` of sink ``sink`` would."""
    batch = Batch(RecentIds(0))
    for i, envelope in enumerate(envelopes):
        assert batch.add(record(envelope, flush * 1000 + i)) != AddResult.INVALID
    for (kind, day), buffer in batch.buffers.items():
        folder = layout.table_path(root, kind) / layout.day_name(layout.day_of_index(day))
        writer.write_part(buffer.to_table(), folder / layout.part_name(flush, sink))


def test_part_names_round_trip() -> None:
    assert layout.part_name(7) == "part-000000000007.parquet"
    assert layout.parse_part(layout.part_name(7)) == (7, 7)
    assert layout.parse_part(layout.compacted_name(3, 9)) == (3, 9)
    assert layout.parse_part(".tmp-part-000000000007.parquet") is None
    assert layout.parse_day("day=2025-03-01") == date(2025, 3, 1)
    assert layout.parse_day("day=junk") is None


def test_each_sink_names_its_parts_journal_and_lock(tmp_path: Path) -> None:
    named = layout.part_name(7, "decision-sink-1")
    assert named == "part-000000000007.decision-sink-1.parquet"
    assert layout.parse_part(named) == (7, 7)
    assert layout.part_sink(named) == "decision-sink-1"
    assert layout.part_sink(layout.part_name(7)) == layout.DEFAULT_SINK
    assert layout.part_sink(layout.compacted_name(3, 9)) is None
    assert layout.part_sink("part-000000000007.x.parquet.tmp") is None
    assert layout.parse_part("part-000000000007..x.parquet") is None
    with pytest.raises(ValueError, match="not a sink name"):
        layout.part_name(1, ".hidden")
    assert layout.journal_path(tmp_path).name == "journal.json"
    assert layout.journal_path(tmp_path, "s2").name == "journal.s2.json"
    assert layout.lock_path(tmp_path, "s2").name == "lock.s2"
    # Two sinks of different names hold their locks side by side; one name, one sink.
    first = writer.RootLock(tmp_path)
    second = writer.RootLock(tmp_path, "s2")
    with pytest.raises(writer.RootBusyError, match="'s2'"):
        writer.RootLock(tmp_path, "s2")
    first.release()
    second.release()


def test_a_sinks_flush_numbers_follow_its_own_parts(tmp_path: Path) -> None:
    write_flush(tmp_path, 4, [decision("e1", "tx-1")])
    write_flush(tmp_path, 9, [decision("e2", "tx-2")], sink="s2")
    assert writer.last_flush_on_disk(tmp_path) == 4
    assert writer.last_flush_on_disk(tmp_path, "s2") == 9
    assert writer.last_flush_on_disk(tmp_path, "s3") == 0
    # The same flush number of two sinks: two parts, read as one log.
    write_flush(tmp_path, 5, [decision("e3", "tx-3")])
    write_flush(tmp_path, 5, [decision("e4", "tx-4"), decision("e1", "tx-1")], sink="s2")
    table, _ = reader.joined(tmp_path)
    assert sorted(table.column("transaction_id").to_pylist()) == ["tx-1", "tx-2", "tx-3", "tx-4"]


def test_compaction_spares_every_sinks_last_flush(tmp_path: Path) -> None:
    day = f"decisions/day={DAY0.date()}"
    for flush in (1, 2):
        write_flush(tmp_path, flush, [decision(f"a{flush}", f"tx-a{flush}")])
        write_flush(tmp_path, flush, [decision(f"b{flush}", f"tx-b{flush}")], sink="s2")
    writer.Journal(tmp_path).begin(writer.JournalEntry(2, (f"{day}/{layout.part_name(2)}",)))
    writer.Journal(tmp_path, "s2").begin(
        writer.JournalEntry(2, (f"{day}/{layout.part_name(2, 's2')}",))
    )
    assert len(writer.Journal.every(tmp_path)) == 2
    reader.compact(tmp_path, before=DAY0.date() + timedelta(days=1))
    day_dir = layout.table_path(tmp_path, "decisions") / layout.day_name(DAY0.date())
    names = sorted(p.name for p in layout.parts(day_dir))
    assert names == sorted(
        [layout.compacted_name(1, 1), layout.part_name(2), layout.part_name(2, "s2")]
    )
    table, _ = reader.joined(tmp_path)
    assert sorted(table.column("transaction_id").to_pylist()) == [
        "tx-a1",
        "tx-a2",
        "tx-b1",
        "tx-b2",
    ]


def test_day_index_splits_at_utc_midnight() -> None:
    midnight = datetime(2025, 3, 2, tzinfo=UTC)
    before = layout.utc_us(midnight) - 1
    assert layout.day_of_index(layout.day_index(before)) == date(2025, 3, 1)
    assert layout.day_of_index(layout.day_index(layout.utc_us(midnight))) == date(2025, 3, 2)


def test_the_small_models_answers_are_stored_by_their_short_names() -> None:
    batch = Batch(RecentIds(10))
    for i, engine in enumerate(
        (scoring_pb2.SCORED_BY_FIRST_STAGE, scoring_pb2.SCORED_BY_SMALL_MODEL)
    ):
        envelope = decision(f"e{i}", f"tx-{i}")
        envelope.decision.scored_by = engine
        assert batch.add(record(envelope, i)) == AddResult.DECISION
    ((_, buffer),) = batch.buffers.items()
    rows = buffer.to_table().to_pylist()
    assert [row["scored_by"] for row in rows] == ["first_stage", "small_model"]


def test_recent_ids_forget_the_oldest() -> None:
    recent = RecentIds(2)
    for event_id in ("a", "b", "c"):
        recent.add(event_id)
    assert "a" not in recent and "b" in recent and "c" in recent and len(recent) == 2


def test_a_decision_becomes_a_row_with_short_enum_names() -> None:
    batch = Batch(RecentIds(10))
    assert batch.add(record(decision("e1", "tx-1", features=[1.0, 2.5]), 42)) == AddResult.DECISION
    ((kind, day), buffer), *_ = batch.buffers.items()
    assert kind == "decisions" and layout.day_of_index(day) == DAY0.date()
    row = buffer.to_table().to_pylist()[0]
    assert row["decision"] == "decline"
    assert row["scored_by"] == "model"
    assert row["feature_source"] == "online"
    assert row["route"] == "canary"
    assert row["decided_at"] == DAY0
    assert row["features"] == [1.0, 2.5]
    assert row["reasons"] == ["card velocity", "amount"]
    assert row["shadow_score"] is None and row["terminal_id"] is None
    assert row["log_position"] == "42"


def test_duplicates_and_non_events_are_not_gathered() -> None:
    batch = Batch(RecentIds(10))
    assert batch.add(record(decision("e1", "tx-1"))) == AddResult.DECISION
    assert batch.add(record(decision("e1", "tx-1"))) == AddResult.DUPLICATE
    assert batch.add(Record(b"k", b"\xff\xff\xff", "9")) == AddResult.INVALID
    assert batch.add(Record(b"k", b"", "10")) == AddResult.INVALID
    assert batch.rows == 1


def test_outcomes_are_partitioned_by_the_day_they_were_received() -> None:
    batch = Batch(RecentIds(10))
    received = DAY0 + timedelta(days=30)
    batch.add(record(outcome("o1", "tx-1", reported=DAY0, received=received)))
    assert list(batch.buffers) == [("outcomes", layout.day_index(layout.utc_us(received)))]


def test_export_keeps_the_first_decision_of_a_transaction_and_its_latest_outcome(
    tmp_path: Path,
) -> None:
    later = DAY0 + timedelta(seconds=1)
    write_flush(
        tmp_path,
        1,
        [
            # The outcome of tx-2 arrives before its decision.
            outcome("o2", "tx-2", outcomes_pb2.OUTCOME_LEGITIMATE),
            # A retry of tx-1 decided later, written first.
            decision("e1-retry", "tx-1", later, score=0.9),
        ],
    )
    write_flush(
        tmp_path,
        2,
        [
            decision("e1", "tx-1", DAY0, score=0.1),
            decision("e1", "tx-1", DAY0, score=0.1),  # delivered twice
            decision("e2", "tx-2", DAY0),
            # A dispute, then fraud: the latest report wins even though it arrived first.
            outcome("o1b", "tx-1", outcomes_pb2.OUTCOME_FRAUD, reported=DAY0 + timedelta(days=9)),
            outcome(
                "o1a", "tx-1", outcomes_pb2.OUTCOME_DISPUTED, reported=DAY0 + timedelta(days=3)
            ),
            outcome("o9", "tx-unknown"),
        ],
    )
    table, summary = reader.joined(tmp_path)
    rows = {r["transaction_id"]: r for r in table.to_pylist()}
    assert list(table.column_names[: len(joined.LEADING_COLUMNS)]) == list(joined.LEADING_COLUMNS)
    assert set(rows) == {"tx-1", "tx-2"}
    assert rows["tx-1"]["event_id"] == "e1" and rows["tx-1"]["score"] == 0.1
    assert rows["tx-1"]["outcome"] == "fraud"
    assert rows["tx-1"]["outcome_reports"] == 2
    assert rows["tx-1"]["outcome_reported_at"] == DAY0 + timedelta(days=9)
    assert rows["tx-2"]["outcome"] == "legitimate"
    assert summary.duplicate_events == 1
    assert summary.retried_transactions == 1
    assert summary.with_outcome == 2
    assert summary.orphan_outcomes == 1


def test_the_export_names_who_gave_the_latest_outcome(tmp_path: Path) -> None:
    write_flush(
        tmp_path,
        1,
        [
            decision("e1", "tx-1"),
            outcome("o1", "tx-1", outcomes_pb2.OUTCOME_DISPUTED),
            outcome(
                "o2", "tx-1", reported=DAY0 + timedelta(hours=1), reported_by="alice@example.org"
            ),
        ],
    )
    (row,) = reader.joined(tmp_path)[0].to_pylist()
    assert row["outcome"] == "fraud" and row["outcome_reported_by"] == "alice@example.org"


def test_parts_written_before_reported_by_existed_read_it_as_null(tmp_path: Path) -> None:
    write_flush(tmp_path, 1, [decision("e1", "tx-1"), outcome("o1", "tx-1")])
    (part,) = (tmp_path / "outcomes").rglob("part-*.parquet")
    old = pq.read_table(part).drop_columns(["reported_by"])
    pq.write_table(old, part)
    (row,) = reader.joined(tmp_path)[0].to_pylist()
    assert row["outcome"] == "fraud" and row["outcome_reported_by"] is None


def test_a_decision_without_outcome_has_nulls(tmp_path: Path) -> None:
    write_flush(tmp_path, 1, [decision("e1", "tx-1")])
    (row,) = reader.joined(tmp_path)[0].to_pylist()
    assert row["outcome"] is None and row["outcome_reported_at"] is None
    assert row["outcome_reports"] == 0


def test_the_window_selects_by_decision_time(tmp_path: Path) -> None:
    write_flush(
        tmp_path,
        1,
        [decision(f"e{d}", f"tx-{d}", DAY0 + timedelta(days=d)) for d in range(5)],
    )
    since, until = DAY0 + timedelta(days=1), DAY0 + timedelta(days=3)
    table, summary = reader.joined(tmp_path, since, until)
    assert sorted(table.column("transaction_id").to_pylist()) == ["tx-1", "tx-2"]
    assert summary.decisions == 2


def test_export_writes_wide_feature_columns(tmp_path: Path) -> None:
    vector = [float(i) for i in range(len(featurespec.MODEL_FEATURES))]
    write_flush(tmp_path / "log", 1, [decision("e1", "tx-1", features=vector)])
    out = tmp_path / "out.parquet"
    summary = reader.export(tmp_path / "log", out, wide=True)
    assert summary.decisions == 1
    table = pq.read_table(out)
    first = featurespec.MODEL_FEATURES[1]
    assert table.column(reader.FEATURE_PREFIX + first).to_pylist() == [1.0]
    assert b"fraudmesh.feature_orders" in table.schema.metadata


def test_compaction_merges_closed_days_and_spares_the_journal(tmp_path: Path) -> None:
    for flush in (1, 2, 3):
        write_flush(tmp_path, flush, [decision(f"e{flush}", f"tx-{flush}"), decision("e1", "tx-1")])
    writer.Journal(tmp_path).begin(
        writer.JournalEntry(3, (f"decisions/day={DAY0.date()}/{layout.part_name(3)}",))
    )
    summary = reader.compact(tmp_path, before=DAY0.date() + timedelta(days=1))
    day_dir = layout.table_path(tmp_path, "decisions") / layout.day_name(DAY0.date())
    names = [p.name for p in layout.parts(day_dir)]
    assert names == [layout.compacted_name(1, 2), layout.part_name(3)]
    assert summary.duplicates == 2  # e1 once in flush 1 (as written twice) and in flush 2
    table, _ = reader.joined(tmp_path)
    assert sorted(table.column("transaction_id").to_pylist()) == ["tx-1", "tx-2", "tx-3"]
    # Compacting again (as after a crash that left inputs behind) is harmless.
    reader.compact(tmp_path, before=DAY0.date() + timedelta(days=1))
    assert [p.name for p in layout.parts(day_dir)] == names


def test_a_part_is_never_replaced(tmp_path: Path) -> None:
    write_flush(tmp_path, 1, [decision("e1", "tx-1")])
    with pytest.raises(FileExistsError):
        write_flush(tmp_path, 1, [decision("e2", "tx-2")])


def _named_sink(root: Path, name: str) -> DecisionSink:
    return DecisionSink(
        DecisionLogSettings(root=root),
        EventLogSettings(var_dir=root, consumer_name=name),
        SinkMetrics(CollectorRegistry()),
    )


def test_a_named_sink_takes_over_the_journal_of_the_default_names(tmp_path: Path) -> None:
    # A sink that wrote under the default names before sinks carried their consumer names.
    write_flush(tmp_path, 7, [decision("e1", "tx-1"), decision("e2", "tx-2")])
    entry = writer.JournalEntry(7, (f"decisions/day={DAY0.date()}/{layout.part_name(7)}",))
    writer.Journal(tmp_path).begin(entry)
    # While a sink of the default name runs, the journal stays its own.
    live = writer.RootLock(tmp_path)
    other = _named_sink(tmp_path, "decision-sink-1")
    assert other.recover() == 0
    other.release()
    live.release()
    assert layout.journal_path(tmp_path).exists()
    sink = _named_sink(tmp_path, "decision-sink-0")
    assert sink.recover() == 2  # the last flush's ids are skipped if the log gives them again
    assert sink.next_flush == 8
    sink.release()
    assert not layout.journal_path(tmp_path).exists()
    assert writer.Journal(tmp_path, "decision-sink-0").read() == entry
