"""The live feature updater's logic without servers: seed, live aggregation, checkpoints, loop."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2, outcomes_pb2
from services.common.errors import Unavailable
from services.domain import aggregation as agg
from services.domain import featurespec
from services.domain.aggregation import Change
from services.eventlog import BackendUnavailable, Record
from services.featurestore.writer import Row
from services.pipelines import simulate
from services.updater import seed
from services.updater.engine import LiveAggregator, View
from services.updater.loop import UpdateLoop
from services.updater.metrics import UpdaterMetrics
from services.updater.settings import UpdaterSettings
from services.updater.state import StateStore

END = date(2026, 3, 1)
DAY = 86_400.0
REL = 1e-9


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """A small simulated history with some fraud labels reported late."""
    params = simulate.SimulationParams(n_customers=300, n_merchants=120, days=50, end=END)
    tx = simulate.simulate(params).transactions
    rng = np.random.default_rng(5)
    late = tx["is_fraud"].to_numpy() & (rng.random(len(tx)) < 0.5)
    tx["fraud_reported_at"] = pd.Series(pd.NaT, index=tx.index, dtype=tx["timestamp"].dtype)
    tx.loc[late, "fraud_reported_at"] = tx.loc[late, "timestamp"] + pd.Timedelta(days=10)
    return tx.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)


def _newest_rows(table: pd.DataFrame, key: str) -> dict[str, dict[str, float]]:
    newest = table.sort_values("event_timestamp").groupby(key).tail(1).set_index(key)
    newest = newest.drop(columns=["event_timestamp"])
    return {str(k): {n: float(v) for n, v in row.items()} for k, row in newest.iterrows()}


def _assert_rows_equal(got: dict[str, float], want: dict[str, float], what: str) -> None:
    for name, value in got.items():
        expected = want[name]
        if math.isnan(expected):
            assert math.isnan(value), (what, name)
        elif name == "card_amount_std_30d":
            scale = got["card_amount_mean_30d"] ** 2 + expected**2
            assert abs(value**2 - expected**2) <= REL * scale, (what, name, value, expected)
        else:
            assert value == pytest.approx(expected, rel=REL, abs=1e-12), (what, name)


def _assert_states_match_batch(
    cards: dict[str, agg.CardState], merchants: dict[str, agg.MerchantState], tx: pd.DataFrame
) -> None:
    card_table = _newest_rows(agg.card_feature_table(tx), "card_id")
    merchant_table = _newest_rows(agg.merchant_feature_table(tx), "merchant_id")
    assert set(cards) == set(card_table)
    assert set(merchants) == set(merchant_table)
    for card_id, state in cards.items():
        row = agg.card_row(state)
        assert row is not None
        _assert_rows_equal(row, card_table[card_id], card_id)
    for merchant_id, merchant in merchants.items():
        row = agg.merchant_row(merchant)
        assert row is not None
        _assert_rows_equal(row, merchant_table[merchant_id], merchant_id)


def decision(row: pd.Series, transaction_id: str | None = None) -> events_pb2.DecisionEvent:
    """The decision event the gateway would emit for one raw transaction."""
    event = events_pb2.DecisionEvent(
        event_id="e",
        transaction_id=transaction_id or str(row["transaction_id"]),
        card_id=str(row["card_id"]),
        merchant_id=str(row["merchant_id"]),
        amount_minor=int(row["amount_minor"]),
        currency=str(row["currency"]),
        card_not_present=row["channel"] == featurespec.CARD_NOT_PRESENT,
    )
    micros = int(row["timestamp"].value // 1_000)
    event.timestamp.seconds, nanos = divmod(micros, 1_000_000)
    event.timestamp.nanos = nanos * 1_000
    return event


def outcome(transaction_id: str, fraud: bool, reported_s: float) -> events_pb2.OutcomeEvent:
    """An outcome event as ReportOutcome appends it."""
    event = events_pb2.OutcomeEvent(
        event_id="o",
        transaction_id=transaction_id,
        outcome=outcomes_pb2.OUTCOME_FRAUD if fraud else outcomes_pb2.OUTCOME_LEGITIMATE,
        source=outcomes_pb2.OUTCOME_SOURCE_ANALYST,
    )
    event.reported_at.FromNanoseconds(round(reported_s * 1e9))
    return event


def _seeded_store(path: Path, history: pd.DataFrame) -> StateStore:
    store = StateStore(path)
    s = seed.replay(history)
    store.save(
        ((k, c.to_bytes()) for k, c in s.cards.items()),
        ((k, m.to_bytes()) for k, m in s.merchants.items()),
        s.transactions,
        live=False,
    )
    return store


def _live_part(tx: pd.DataFrame) -> pd.DataFrame:
    """Live transactions as the batch sees them: what a request carries, no codes or labels."""
    return tx.assign(
        card_home_country=np.nan,
        merchant_country=np.nan,
        merchant_category=np.nan,
        is_fraud=False,
        fraud_reported_at=pd.Series(pd.NaT, index=tx.index, dtype=tx["timestamp"].dtype),
    )


# --- seed ---------------------------------------------------------------------------------


def test_seed_states_give_the_batch_rows(frame: pd.DataFrame) -> None:
    history = seed.replay(frame)
    _assert_states_match_batch(history.cards, history.merchants, frame)
    held = {tid for state in history.merchants.values() for tid in state.events.ids}
    assert {tid for tid, _, _ in history.transactions} == held
    assert history.events == len(frame)


# --- the live path ------------------------------------------------------------------------


def _all_states(
    agg_: LiveAggregator, cards: Iterable[str], merchants: Iterable[str]
) -> tuple[dict[str, agg.CardState], dict[str, agg.MerchantState]]:
    card_states = {}
    for card_id in cards:
        state = agg_._cards.get(card_id)
        assert state is not None, card_id
        card_states[card_id] = state
    merchant_states = {}
    for merchant_id in merchants:
        state = agg_._merchants.get(merchant_id)
        assert state is not None, merchant_id
        merchant_states[merchant_id] = state
    return card_states, merchant_states


def test_live_events_continue_the_batch_history(frame: pd.DataFrame, tmp_path: Path) -> None:
    cut = frame["timestamp"].max() - pd.Timedelta(days=2)
    history, live = frame[frame["timestamp"] <= cut], frame[frame["timestamp"] > cut]
    store = _seeded_store(tmp_path / "state.db", history)
    live_agg = LiveAggregator(store, cache_max=10_000, max_pending_labels=1_000)
    rng = np.random.default_rng(1)
    # Out of order by up to an hour, and a tenth of the decisions retried.
    micros = agg.timestamps_us(live["timestamp"])
    order = np.argsort(micros + rng.integers(0, 3_600_000_000, len(live)))
    rows = [live.iloc[int(i)] for i in order]
    changes: list[Change] = []
    for row in rows:
        changes += [c for _, c in live_agg.apply_decision(decision(row)).changes]
        if rng.random() < 0.1:
            changes += [c for _, c in live_agg.apply_decision(decision(row)).changes]
    # Outcomes: history transactions inside the merchants' fraud-rate windows turn out to be
    # fraud (reported now), and some history frauds turn out legitimate.
    now_s = live["timestamp"].max().timestamp()
    window = history[
        (history["timestamp"] > cut - pd.Timedelta(days=30))
        & (history["timestamp"] < cut - pd.Timedelta(days=8))
    ]
    flipped = window[~window["is_fraud"]].sample(15, random_state=2)
    cleared = window[window["is_fraud"] & window["fraud_reported_at"].isna()].head(3)
    for tid in flipped["transaction_id"]:
        live_agg.apply_outcome(outcome(str(tid), True, now_s - 60))
    for tid in cleared["transaction_id"]:
        live_agg.apply_outcome(outcome(str(tid), False, now_s - 30))
    assert Change.DUPLICATE in changes and Change.LATE in changes

    want = pd.concat([history, _live_part(live)], ignore_index=True)
    want.loc[want["transaction_id"].isin(flipped["transaction_id"]), "is_fraud"] = True
    want.loc[want["transaction_id"].isin(flipped["transaction_id"]), "fraud_reported_at"] = (
        pd.Timestamp(now_s - 60, unit="s", tz="UTC")
    )
    want.loc[want["transaction_id"].isin(cleared["transaction_id"]), "is_fraud"] = False
    cards, merchants = _all_states(live_agg, want["card_id"].unique(), want["merchant_id"].unique())
    _assert_states_match_batch(cards, merchants, want)


def test_a_restart_from_the_checkpoint_replays_to_the_same_rows(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    cut = frame["timestamp"].max() - pd.Timedelta(days=1)
    history, live = frame[frame["timestamp"] <= cut], frame[frame["timestamp"] > cut]
    events = [decision(row) for _, row in live.iterrows()]
    half = len(events) // 2

    reference = LiveAggregator(_seeded_store(tmp_path / "a.db", history), 10_000, 100)
    for event in events:
        reference.apply_decision(event)

    store = _seeded_store(tmp_path / "b.db", history)
    first = LiveAggregator(store, 10_000, 100)
    for event in events[:half]:
        first.apply_decision(event)
    first.checkpoint()
    for event in events[half : half + 50]:
        first.apply_decision(event)  # applied, never checkpointed: the crash loses it
    store.close()

    store = StateStore(tmp_path / "b.db")
    second = LiveAggregator(store, 10_000, 100)
    changes = []
    # The log gives everything after the last commit again: from half on.
    for event in events[half:]:
        changes += [c for _, c in second.apply_decision(event).changes]
    assert Change.DUPLICATE not in changes  # the checkpoint held exactly the first half
    for event in events[:half]:
        assert {c for _, c in second.apply_decision(event).changes} == {Change.DUPLICATE}
    ids_c, ids_m = live["card_id"].unique(), live["merchant_id"].unique()
    got_c, got_m = _all_states(second, ids_c, ids_m)
    want_c, want_m = _all_states(reference, ids_c, ids_m)
    for key, state in got_c.items():
        assert agg.card_row(state) == agg.card_row(want_c[key])
    for key, merchant in got_m.items():
        assert agg.merchant_row(merchant) == agg.merchant_row(want_m[key])


def test_the_journal_brings_back_what_no_snapshot_holds(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    cut = frame["timestamp"].max() - pd.Timedelta(days=1)
    history, live = frame[frame["timestamp"] <= cut], frame[frame["timestamp"] > cut]
    events = [decision(row) for _, row in live.iterrows()]
    store = _seeded_store(tmp_path / "s.db", history)
    # No snapshot budget: checkpoints only journal, until the journal passes its bound.
    first = LiveAggregator(store, 10_000, 100, snapshot_budget_s=0.0, journal_max_events=40)
    for i, event in enumerate(events):
        first.apply_decision(event)
        if i % 10 == 9:
            first.checkpoint()
    first.checkpoint()
    assert 0 < first.journal_events <= 40 + 10
    assert store.counts()["journal"] == first.journal_events
    expected = {
        key: agg.card_row(state)
        for key in live["card_id"].unique()
        if (state := first._cards.get(str(key))) is not None
    }
    store.close()

    store = StateStore(tmp_path / "s.db")
    second = LiveAggregator(store, 10_000, 100)
    assert second.replayed == first.journal_events
    cards, _ = second.rows()
    assert cards  # the replayed entities' rows are written again
    for key, row in expected.items():
        state = second._cards.get(str(key))
        assert state is not None and agg.card_row(state) == row
    second.snapshot_all()
    assert store.counts()["journal"] == 0 and second.journal_events == 0


def test_an_outcome_before_its_decision_waits_for_it(frame: pd.DataFrame, tmp_path: Path) -> None:
    row = frame.iloc[-1]
    live = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    held = live.apply_outcome(outcome("tx-later", True, row["timestamp"].timestamp()))
    assert held.changes == [(View.MERCHANT, Change.PENDING)]
    assert live.pending_labels == 1
    live.checkpoint()
    restarted = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    assert restarted.pending_labels == 1
    restarted.apply_decision(decision(row, "tx-later"))
    assert restarted.pending_labels == 0
    state = restarted._merchants.get(str(row["merchant_id"]))
    assert state is not None and state.labels["tx-later"].is_fraud


def test_disputed_outcomes_are_no_label(tmp_path: Path) -> None:
    live = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    event = outcome("tx-1", True, 1_000.0)
    event.outcome = outcomes_pb2.OUTCOME_DISPUTED
    assert live.apply_outcome(event).changes == []
    assert live.pending_labels == 0


def test_held_outcomes_are_bounded(tmp_path: Path) -> None:
    live = LiveAggregator(StateStore(tmp_path / "s.db"), 100, max_pending_labels=3)
    for i in range(5):
        live.apply_outcome(outcome(f"tx-{i}", True, 1_000.0 + i))
    assert live.pending_labels == 3
    assert live.labels_dropped == 2


def test_only_saved_states_leave_the_cache(frame: pd.DataFrame, tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.db")
    live = LiveAggregator(store, cache_max=2, max_pending_labels=10)
    rows = [r for _, r in frame.head(40).iterrows()]
    for row in rows:
        live.apply_decision(decision(row))
    assert live.sizes()[View.CARD] > 2  # nothing saved yet: nothing may go
    live.rows_written()
    live.snapshot_all()
    assert live.sizes()[View.CARD] == 2
    for row in rows:  # the evicted states come back from the file: all duplicates
        assert {c for _, c in live.apply_decision(decision(row)).changes} == {Change.DUPLICATE}


# --- the loop -------------------------------------------------------------------------------


@dataclass
class FakeConsumer:
    """A consumer over a list of records: poll hands them out, commit remembers how far."""

    records: list[Record]
    group: str = "feature-updater"
    polled: int = 0
    committed: int = 0
    fail_polls: int = 0

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        if self.fail_polls:
            self.fail_polls -= 1
            raise BackendUnavailable("down")
        batch = self.records[self.polled : self.polled + max_records]
        self.polled += len(batch)
        return batch

    def commit(self) -> None:
        self.committed = self.polled

    def close(self) -> None:
        return None


@dataclass
class FakeWriter:
    """Records the rows written; fails the next ``fail`` writes."""

    fail: int = 0
    cards: dict[str, Row] = field(default_factory=dict)
    merchants: dict[str, Row] = field(default_factory=dict)

    def write(self, cards: Sequence[Row], merchants: Sequence[Row]) -> None:
        if self.fail:
            self.fail -= 1
            raise Unavailable("store down")
        self.cards.update((r.entity_id, r) for r in cards)
        self.merchants.update((r.entity_id, r) for r in merchants)


def _records(frame: pd.DataFrame) -> list[Record]:
    out = []
    for i, (_, row) in enumerate(frame.iterrows()):
        envelope = events_pb2.EventEnvelope(decision=decision(row))
        envelope.decision.decided_at.FromSeconds(int(row["timestamp"].timestamp()))
        out.append(Record(row["card_id"].encode(), envelope.SerializeToString(), str(i)))
    return out


def _loop(
    tmp_path: Path, consumer: FakeConsumer, writer: FakeWriter, **settings: object
) -> tuple[UpdateLoop, UpdaterMetrics]:
    s = UpdaterSettings(var_dir=tmp_path, poll_max_records=10, **settings)  # type: ignore[arg-type]
    metrics = UpdaterMetrics(CollectorRegistry())
    store = StateStore(s.state_file)
    return UpdateLoop(s, lambda: consumer, writer, LiveAggregator(store, 100, 10), metrics), metrics


def test_the_loop_commits_only_after_rows_and_states_are_stored(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    consumer = FakeConsumer(_records(frame.head(25)))
    writer = FakeWriter(fail=1)
    loop, _ = _loop(tmp_path, consumer, writer, checkpoint_interval_s=1e-6)
    with pytest.raises(Unavailable):
        loop.step()  # applied, the row write failed
    assert consumer.polled == 10 and consumer.committed == 0
    assert not loop.ready()
    loop.step()  # rows written first, then the due checkpoint commits, then the next poll
    assert consumer.committed == 10 and consumer.polled == 20
    assert set(writer.cards) == set(frame.head(20)["card_id"])
    while consumer.polled < 25:
        loop.step()
    loop.step()  # an empty poll: caught up
    assert loop.ready()
    loop.checkpoint()
    assert consumer.committed == 25
    assert set(writer.cards) == set(frame.head(25)["card_id"])


def test_the_loop_retries_a_log_that_is_down(frame: pd.DataFrame, tmp_path: Path) -> None:
    consumer = FakeConsumer(_records(frame.head(5)), fail_polls=2)
    writer = FakeWriter()
    loop, metrics = _loop(tmp_path, consumer, writer, retry_backoff_s=0.001)
    log_errors = metrics.store_errors.labels("log")
    errors_before = log_errors._value.get()
    stop = threading.Event()

    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    deadline = time.monotonic() + 60
    while not (consumer.polled == 5 and loop.ready()):
        assert time.monotonic() < deadline, "the loop never caught up"
        stop.wait(0.01)
    stop.set()
    thread.join()
    assert consumer.committed == 5  # the final checkpoint on stop commits the rest
    assert len(writer.cards) == frame.head(5)["card_id"].nunique()
    assert log_errors._value.get() - errors_before == 2


def test_an_undecodable_record_is_skipped_and_counted(frame: pd.DataFrame, tmp_path: Path) -> None:
    records = [Record(b"k", b"\xff\xff not a message", "0"), *_records(frame.head(2))]
    consumer = FakeConsumer(records)
    writer = FakeWriter()
    loop, metrics = _loop(tmp_path, consumer, writer)
    invalid, decisions = metrics.records.labels("invalid"), metrics.records.labels("decision")
    before = invalid._value.get(), decisions._value.get()
    loop.step()
    # Deltas: importing feast puts prometheus_client in multiprocess mode, where values of
    # one name are shared by every registry of the process.
    assert invalid._value.get() - before[0] == 1
    assert decisions._value.get() - before[1] == 2
    assert len(writer.cards) == frame.head(2)["card_id"].nunique()
