"""The pure parts of a partitioned updater group: the outcome join, the partition counts its
states were built on, the lock that keeps one member on a partition, the shared seed's
files. The group itself runs against a real broker in
``tests/integration/test_liveloop_group.py``."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from fraud.v1 import events_pb2, outcomes_pb2
from services.domain.aggregation import Label
from services.updater.joiner import OutcomeJoin, index_entry
from services.updater.partitions import (
    PartitionBusy,
    PartitionsChanged,
    check_partition_counts,
    discard_partitions,
    lock_file,
    partition_of,
)
from services.updater.state import StateStore


def _decision(tid: str, merchant: str = "m-1", terminal: str = "t-1") -> events_pb2.DecisionEvent:
    event = events_pb2.DecisionEvent(transaction_id=tid, merchant_id=merchant, terminal_id=terminal)
    event.timestamp.FromMicroseconds(1_700_000_000_000_000)
    return event


def _outcome(tid: str, fraud: bool = True, reported_us: int = 1_700_000_100_000_000) -> bytes:
    envelope = events_pb2.EventEnvelope()
    o = envelope.outcome
    o.transaction_id = tid
    o.outcome = outcomes_pb2.OUTCOME_FRAUD if fraud else outcomes_pb2.OUTCOME_LEGITIMATE
    o.reported_at.FromMicroseconds(reported_us)
    return envelope.SerializeToString()


class Forwarded(list[tuple[str, bytes]]):
    def __call__(self, merchant: str, raw: bytes) -> None:
        self.append((merchant, raw))


def _join(tmp_path: Path, forwarded: Forwarded, max_pending: int = 10) -> OutcomeJoin:
    return OutcomeJoin(StateStore(tmp_path / "transactions-0.db"), forwarded, max_pending)


def test_an_outcome_after_its_entry_goes_to_its_merchant_as_it_came(tmp_path: Path) -> None:
    forwarded = Forwarded()
    join = _join(tmp_path, forwarded)
    join.entry(_decision("tx-1", merchant="m-7"))
    raw = _outcome("tx-1")
    assert join.outcome(events_pb2.EventEnvelope.FromString(raw).outcome, raw)
    assert forwarded == [("m-7", raw)]
    assert join.pending == 0


def test_an_outcome_before_its_entry_is_held_across_a_checkpoint_then_sent(
    tmp_path: Path,
) -> None:
    forwarded = Forwarded()
    join = _join(tmp_path, forwarded)
    raw = _outcome("tx-2", fraud=False, reported_us=1_700_000_200_000_000)
    assert not join.outcome(events_pb2.EventEnvelope.FromString(raw).outcome, raw)
    assert join.pending == 1 and forwarded == []
    join.checkpoint({"next_offset": "5"})
    # A new owner of the partition finds it held, and sends it when the entry comes.
    again = _join(tmp_path, forwarded)
    assert again.pending == 1
    again.entry(_decision("tx-2", merchant="m-9"))
    ((merchant, sent),) = forwarded
    outcome = events_pb2.EventEnvelope.FromString(sent).outcome
    assert merchant == "m-9"
    assert (outcome.transaction_id, outcome.outcome) == ("tx-2", outcomes_pb2.OUTCOME_LEGITIMATE)
    assert outcome.reported_at.ToMicroseconds() == 1_700_000_200_000_000
    again.checkpoint({})
    assert _join(tmp_path, Forwarded()).pending == 0


def test_an_entry_survives_a_checkpoint_and_disputes_are_no_labels(tmp_path: Path) -> None:
    forwarded = Forwarded()
    join = _join(tmp_path, forwarded)
    join.entry(_decision("tx-3", merchant="m-3"))
    join.checkpoint({})
    again = _join(tmp_path, forwarded)
    raw = _outcome("tx-3")
    assert again.outcome(events_pb2.EventEnvelope.FromString(raw).outcome, raw)
    disputed = events_pb2.OutcomeEvent(transaction_id="tx-3", outcome=outcomes_pb2.OUTCOME_DISPUTED)
    assert not again.outcome(disputed, b"")
    assert forwarded == [("m-3", raw)] and again.pending == 0


def test_held_outcomes_beyond_the_bound_drop_the_oldest_report(tmp_path: Path) -> None:
    join = _join(tmp_path, Forwarded(), max_pending=2)
    for i, reported in enumerate((300, 100, 200)):
        raw = _outcome(f"tx-{i}", reported_us=1_700_000_000_000_000 + reported)
        join.outcome(events_pb2.EventEnvelope.FromString(raw).outcome, raw)
    assert join.pending == 2 and join.dropped == 1


def test_the_index_entry_carries_only_what_the_join_needs() -> None:
    decision = _decision("tx-4", merchant="m-4", terminal="")
    decision.amount_minor = 1234
    decision.card_id = "card-1"
    entry = events_pb2.EventEnvelope.FromString(index_entry(decision)).decision
    assert (entry.transaction_id, entry.merchant_id, entry.terminal_id) == ("tx-4", "m-4", "")
    assert entry.timestamp == decision.timestamp
    assert entry.amount_minor == 0 and entry.card_id == ""


def test_a_key_has_one_partition_for_a_given_count() -> None:
    assert partition_of(b"merchant-42", 6) == zlib.crc32(b"merchant-42") % 6
    spread = {partition_of(f"m-{i}".encode(), 6) for i in range(200)}
    assert spread == set(range(6))


def test_the_partition_counts_are_kept_and_a_change_refused(tmp_path: Path) -> None:
    counts = {"events": 6, "events.by-merchant": 6, "events.by-transaction": 6}
    check_partition_counts(tmp_path, counts)
    check_partition_counts(tmp_path, dict(counts))
    with pytest.raises(PartitionsChanged, match="events: 6 then, 12 now"):
        check_partition_counts(tmp_path, {**counts, "events": 12})


def test_one_member_per_partition_and_no_reseed_under_a_member(tmp_path: Path) -> None:
    held = lock_file(tmp_path / "cards-0.lock", 0.0)
    try:
        with pytest.raises(PartitionBusy):
            lock_file(tmp_path / "cards-0.lock", 0.1)
        (tmp_path / "cards-0.db").write_bytes(b"")
        with pytest.raises(PartitionBusy, match="stop every member"):
            discard_partitions(tmp_path)
        assert (tmp_path / "cards-0.db").exists()
    finally:
        os.close(held)
    discard_partitions(tmp_path)
    assert not (tmp_path / "cards-0.db").exists()


def test_a_sealed_seed_reads_the_same_frozen(tmp_path: Path) -> None:
    path = tmp_path / "base.db"
    seed = StateStore(path)
    seed.save(transactions=[("tx-5", "m-5", "t-5", 1)], labels_held=[("tx-6", Label(True, 2))])
    seed.seal()
    assert not path.with_name("base.db-wal").exists()
    frozen = StateStore.frozen(path)
    assert frozen.entities_of("tx-5") == ("m-5", "t-5")
    assert dict(frozen.pending_labels()) == {"tx-6": Label(True, 2)}
    frozen.close()
