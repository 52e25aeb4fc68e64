"""The live feature updater's logic without servers: seed, live aggregation, checkpoints, loop."""

from __future__ import annotations

import math
import sqlite3
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
from services.common import metric_catalogue as catalogue
from services.common.errors import Unavailable
from services.domain import aggregation as agg
from services.domain import featurespec
from services.domain.aggregation import Change
from services.eventlog import BackendUnavailable, EventLogSettings, Record
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.featurestore.writer import Row
from services.pipelines import simulate
from services.updater import app, seed
from services.updater import state as state_format
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
    return {
        str(k): {n: math.nan if pd.isna(v) else float(v) for n, v in row.items()}
        for k, row in newest.iterrows()
    }


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
    cards: dict[str, agg.CardState],
    merchants: dict[str, agg.MerchantState],
    terminals: dict[str, agg.MerchantState],
    tx: pd.DataFrame,
) -> None:
    card_table = _newest_rows(agg.card_feature_table(tx), "card_id")
    merchant_table = _newest_rows(agg.merchant_feature_table(tx), "merchant_id")
    terminal_table = _newest_rows(agg.terminal_feature_table(tx), "terminal_id")
    assert set(cards) == set(card_table)
    assert set(merchants) == set(merchant_table)
    assert set(terminals) == set(terminal_table)
    assert terminal_table  # the data names terminals: the comparison is not empty
    for card_id, state in cards.items():
        row = agg.card_row(state)
        assert row is not None
        _assert_rows_equal(row, card_table[card_id], card_id)
    for merchant_id, merchant in merchants.items():
        row = agg.merchant_row(merchant)
        assert row is not None
        _assert_rows_equal(row, merchant_table[merchant_id], merchant_id)
    for terminal_id, terminal in terminals.items():
        row = agg.terminal_row(terminal)
        assert row is not None
        _assert_rows_equal(row, terminal_table[terminal_id], terminal_id)


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
        terminal_id=_terminal(row),
    )
    micros = int(row["timestamp"].value // 1_000)
    event.timestamp.seconds, nanos = divmod(micros, 1_000_000)
    event.timestamp.nanos = nanos * 1_000
    return event


def _terminal(row: pd.Series) -> str:
    """The row's terminal as a decision event carries it: '' for none."""
    terminal = row.get("terminal_id")
    return terminal if isinstance(terminal, str) else ""


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
        cards=((k, c.to_bytes()) for k, c in s.cards.items()),
        merchants=((k, m.to_bytes()) for k, m in s.merchants.items()),
        terminals=((k, t.to_bytes()) for k, t in s.terminals.items()),
        transactions=s.transactions,
        live=False,
        due=s.due,
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
    _assert_states_match_batch(history.cards, history.merchants, history.terminals, frame)
    held = {tid for state in history.merchants.values() for tid in state.events.ids}
    at_terminals = {
        tid: terminal_id
        for terminal_id, state in history.terminals.items()
        for tid in state.events.ids
    }
    entries = {tid: (m, t) for tid, m, t, _ in history.transactions}
    assert set(entries) == held | set(at_terminals)
    paid = frame.set_index("transaction_id")
    for tid, (merchant_id, terminal_id) in entries.items():
        assert merchant_id == paid.at[tid, "merchant_id"]
        assert terminal_id == at_terminals.get(tid, "")
    assert history.events == len(frame)


def test_transactions_without_a_terminal_leave_the_terminals_alone(frame: pd.DataFrame) -> None:
    some = frame.assign(terminal_id=frame["terminal_id"].where(frame.index % 4 != 0, None))
    history = seed.replay(some)
    _assert_states_match_batch(history.cards, history.merchants, history.terminals, some)
    named = {tid for state in history.terminals.values() for tid in state.events.ids}
    assert named.isdisjoint(some.loc[some["terminal_id"].isna(), "transaction_id"])


# --- the live path ------------------------------------------------------------------------


def _all_states(
    agg_: LiveAggregator, cards: Iterable[str], merchants: Iterable[str], terminals: Iterable[str]
) -> tuple[dict[str, agg.CardState], dict[str, agg.MerchantState], dict[str, agg.MerchantState]]:
    card_states = {}
    for card_id in cards:
        state = agg_._cards.get(card_id)
        assert state is not None, card_id
        card_states[card_id] = state
    merchant_states = {}
    for merchant_id in merchants:
        merchant = agg_._merchants.get(merchant_id)
        assert merchant is not None, merchant_id
        merchant_states[merchant_id] = merchant
    terminal_states = {}
    for terminal_id in terminals:
        terminal = agg_._terminals.get(terminal_id)
        assert terminal is not None, terminal_id
        terminal_states[terminal_id] = terminal
    return card_states, merchant_states, terminal_states


def _terminals_of(tx: pd.DataFrame) -> list[str]:
    return [str(t) for t in tx["terminal_id"].dropna().unique()]


def test_live_events_continue_the_batch_history(frame: pd.DataFrame, tmp_path: Path) -> None:
    cut = frame["timestamp"].max() - pd.Timedelta(days=2)
    history, live = frame[frame["timestamp"] <= cut], frame[frame["timestamp"] > cut]
    # A payment need not name its terminal: a fifth of the live ones do not.
    live = live.assign(terminal_id=live["terminal_id"].where(live.index % 5 != 0, None))
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
    assert set(flipped["terminal_id"]) & set(live["terminal_id"].dropna())

    want = pd.concat([history, _live_part(live)], ignore_index=True)
    want.loc[want["transaction_id"].isin(flipped["transaction_id"]), "is_fraud"] = True
    want.loc[want["transaction_id"].isin(flipped["transaction_id"]), "fraud_reported_at"] = (
        pd.Timestamp(now_s - 60, unit="s", tz="UTC")
    )
    want.loc[want["transaction_id"].isin(cleared["transaction_id"]), "is_fraud"] = False
    cards, merchants, terminals = _all_states(
        live_agg, want["card_id"].unique(), want["merchant_id"].unique(), _terminals_of(want)
    )
    _assert_states_match_batch(cards, merchants, terminals, want)
    batch = live_agg.rows()
    assert {r.entity_id for r in batch.terminals} == set(live["terminal_id"].dropna()) | set(
        pd.concat([flipped, cleared])["terminal_id"]
    )


def test_a_restart_from_the_checkpoint_replays_to_the_same_rows(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    cut = frame["timestamp"].max() - pd.Timedelta(days=1)
    history, live = frame[frame["timestamp"] <= cut], frame[frame["timestamp"] > cut]
    events = [events_pb2.EventEnvelope(decision=decision(row)) for _, row in live.iterrows()]
    # Outcomes of history transactions in the fraud-rate windows, spread over the stream:
    # labels on both sides of the checkpoint and in what the crash loses.
    now_s = live["timestamp"].max().timestamp()
    window = history[
        (history["timestamp"] > cut - pd.Timedelta(days=30))
        & (history["timestamp"] < cut - pd.Timedelta(days=8))
    ]
    for i, tid in enumerate(
        window[~window["is_fraud"]].sample(20, random_state=3)["transaction_id"]
    ):
        labelled = events_pb2.EventEnvelope(outcome=outcome(str(tid), True, now_s))
        events.insert(min(len(events), 7 * i + 3), labelled)
    half = len(events) // 2

    reference = LiveAggregator(_seeded_store(tmp_path / "a.db", history), 10_000, 100)
    for event in events:
        reference.apply(event)

    store = _seeded_store(tmp_path / "b.db", history)
    first = LiveAggregator(store, 10_000, 100)
    for event in events[:half]:
        first.apply(event)
    first.checkpoint()
    for event in events[half : half + 50]:
        first.apply(event)  # applied, never checkpointed: the crash loses it
    store.close()

    store = StateStore(tmp_path / "b.db")
    second = LiveAggregator(store, 10_000, 100)
    changes = []
    # The log gives everything after the last commit again: from half on.
    for event in events[half:]:
        changes += [c for _, c in second.apply(event).changes]
    assert Change.DUPLICATE not in changes  # the checkpoint held exactly the first half
    for event in events[:half]:
        assert {c for _, c in second.apply(event).changes} == {Change.DUPLICATE}
    ids = live["card_id"].unique(), live["merchant_id"].unique(), _terminals_of(live)
    got_c, got_m, got_t = _all_states(second, *ids)
    want_c, want_m, want_t = _all_states(reference, *ids)
    for key, state in got_c.items():
        assert agg.card_row(state) == agg.card_row(want_c[key])
    for key, merchant in got_m.items():
        assert agg.merchant_row(merchant) == agg.merchant_row(want_m[key])
    assert got_t
    for key, terminal in got_t.items():
        assert agg.terminal_row(terminal) == agg.terminal_row(want_t[key])


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
    expected_terminals = {
        key: agg.terminal_row(state)
        for key in _terminals_of(live)
        if (state := first._terminals.get(key)) is not None
    }
    assert expected_terminals
    store.close()

    store = StateStore(tmp_path / "s.db")
    second = LiveAggregator(store, 10_000, 100)
    assert second.replayed == first.journal_events
    batch = second.rows()
    assert batch.cards and batch.terminals  # the replayed entities' rows are written again
    for key, row in expected.items():
        state = second._cards.get(str(key))
        assert state is not None and agg.card_row(state) == row
    for key, terminal_row in expected_terminals.items():
        terminal = second._terminals.get(key)
        assert terminal is not None and agg.terminal_row(terminal) == terminal_row
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
    applied = restarted.apply_decision(decision(row, "tx-later"))
    assert (View.TERMINAL, Change.APPLIED) in applied.changes
    assert restarted.pending_labels == 0
    state = restarted._merchants.get(str(row["merchant_id"]))
    assert state is not None and state.labels["tx-later"].is_fraud
    terminal = restarted._terminals.get(str(row["terminal_id"]))
    assert terminal is not None and terminal.labels["tx-later"].is_fraud


def test_a_label_its_decision_took_survives_a_crash_before_the_states_are_saved(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    # The outcome is held and checkpointed; its decision takes it; the next checkpoint saves
    # no snapshot (no budget), so the decision is only in the journal. A crash then: the
    # restart replays the decision onto the older states and must find the label to apply.
    row = frame.iloc[-1]
    live = LiveAggregator(
        StateStore(tmp_path / "s.db"), 100, 100, snapshot_budget_s=0.0, journal_max_events=1000
    )
    live.apply_outcome(outcome("tx-later", True, row["timestamp"].timestamp()))
    live.checkpoint()
    applied = live.apply_decision(decision(row, "tx-later"))
    assert (View.TERMINAL, Change.APPLIED) in applied.changes
    live.checkpoint()
    assert live.journal_events >= 1  # the decision: no snapshot holds it
    restarted = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    assert restarted.replayed >= 1
    terminal = restarted._terminals.get(str(row["terminal_id"]))
    assert terminal is not None and terminal.labels["tx-later"].is_fraud
    merchant = restarted._merchants.get(str(row["merchant_id"]))
    assert merchant is not None and merchant.labels["tx-later"].is_fraud
    # Once the states are saved, the label leaves the held ones for good.
    restarted.snapshot_all()
    assert restarted.pending_labels == 0
    assert LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100).pending_labels == 0


def test_held_outcomes_reach_the_rows_as_the_batch_counts_them(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    # The busiest terminal's transactions of three weeks, on fresh states: outcomes of the
    # first week's transactions come before any decision (held), at a report time that lies
    # in the fraud-rate windows of the last rows (more than a label delay before the end).
    busiest = frame["terminal_id"].value_counts().index[0]
    end = frame["timestamp"].max()
    mine = frame[
        (frame["terminal_id"] == busiest) & (frame["timestamp"] > end - pd.Timedelta(days=21))
    ]
    first_week = mine[mine["timestamp"] <= end - pd.Timedelta(days=14)]
    fraud = first_week.sample(4, random_state=1)["transaction_id"].tolist()
    reported = end - pd.Timedelta(days=12)
    live = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    for tid in fraud:
        held = live.apply_outcome(outcome(str(tid), True, reported.timestamp()))
        assert held.changes == [(View.MERCHANT, Change.PENDING)]
    assert live.pending_labels == len(fraud)
    for _, row in mine.iterrows():
        live.apply_decision(decision(row))
    assert live.pending_labels == 0

    want = _live_part(mine)
    want.loc[want["transaction_id"].isin(fraud), "is_fraud"] = True
    want.loc[want["transaction_id"].isin(fraud), "fraud_reported_at"] = reported
    terminal_want = _newest_rows(agg.terminal_feature_table(want), "terminal_id")[busiest]
    assert terminal_want["terminal_fraud_rate_28d"] > 0
    _, _, terminals = _all_states(live, [], [], [busiest])
    got = agg.terminal_row(terminals[busiest])
    assert got is not None
    _assert_rows_equal(got, terminal_want, busiest)
    merchant_id = str(mine["merchant_id"].iloc[0])
    merchant_want = _newest_rows(agg.merchant_feature_table(want), "merchant_id")[merchant_id]
    merchant = live._merchants.get(merchant_id)
    assert merchant is not None
    got_m = agg.merchant_row(merchant)
    assert got_m is not None
    _assert_rows_equal(got_m, merchant_want, merchant_id)


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
    terminals: dict[str, Row] = field(default_factory=dict)

    def write(
        self, cards: Sequence[Row], merchants: Sequence[Row], terminals: Sequence[Row]
    ) -> None:
        if self.fail:
            self.fail -= 1
            raise Unavailable("store down")
        self.cards.update((r.entity_id, r) for r in cards)
        self.merchants.update((r.entity_id, r) for r in merchants)
        self.terminals.update((r.entity_id, r) for r in terminals)


def _records(frame: pd.DataFrame) -> list[Record]:
    out = []
    for i, (_, row) in enumerate(frame.iterrows()):
        envelope = events_pb2.EventEnvelope(decision=decision(row))
        envelope.decision.decided_at.FromSeconds(int(row["timestamp"].timestamp()))
        out.append(Record(row["card_id"].encode(), envelope.SerializeToString(), str(i)))
    return out


def _loop(
    tmp_path: Path,
    consumer: FakeConsumer,
    writer: FakeWriter,
    registry: CollectorRegistry | None = None,
    **settings: object,
) -> tuple[UpdateLoop, UpdaterMetrics]:
    s = UpdaterSettings(var_dir=tmp_path, poll_max_records=10, **settings)  # type: ignore[arg-type]
    metrics = UpdaterMetrics(registry or CollectorRegistry())
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
    assert set(writer.terminals) == set(frame.head(20)["terminal_id"])
    while consumer.polled < 25:
        loop.step()
    loop.step()  # an empty poll: caught up
    assert loop.ready()
    loop.checkpoint()
    assert consumer.committed == 25
    assert set(writer.cards) == set(frame.head(25)["card_id"])
    assert set(writer.terminals) == set(frame.head(25)["terminal_id"])
    for terminal_id, row in writer.terminals.items():
        assert list(row.values) == list(featurespec.TERMINAL_FEATURES), terminal_id


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


def test_terminal_rows_are_counted_and_fresh_per_view(frame: pd.DataFrame, tmp_path: Path) -> None:
    head = frame.head(6)
    consumer = FakeConsumer(_records(head))
    writer = FakeWriter()
    registry = CollectorRegistry()
    loop, metrics = _loop(tmp_path, consumer, writer, registry=registry)

    def freshness(view: str) -> float | None:
        return registry.get_sample_value(catalogue.FEATURE_FRESHNESS.name, {"view": view})

    applied = metrics.changes.labels("terminal", "applied")
    before = applied._value.get()
    unknown = freshness("terminal")
    assert unknown is not None and math.isnan(unknown)  # no event yet
    loop.step()
    assert applied._value.get() - before == len(head)
    assert set(writer.terminals) == set(head["terminal_id"])
    for view in ("card", "merchant", "terminal"):
        age = freshness(view)
        assert age is not None and math.isfinite(age) and age >= 0, view


def test_a_decision_without_a_terminal_counts_in_no_terminal(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    row = frame.iloc[-1]
    live = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    event = decision(row)
    event.terminal_id = ""
    applied = live.apply_decision(event)
    assert {view for view, _ in applied.changes} == {View.CARD, View.MERCHANT}
    assert live.sizes()[View.TERMINAL] == 0 and live.rows().terminals == []
    live.checkpoint()
    # An outcome of it finds the merchant through the index, and no terminal.
    labelled = live.apply_outcome(outcome(str(row["transaction_id"]), True, 1.0e10))
    assert labelled.changes == [(View.MERCHANT, Change.APPLIED)]


# --- the state file -------------------------------------------------------------------------

_FORMAT_2 = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE cards (id TEXT PRIMARY KEY, state BLOB NOT NULL, live INTEGER NOT NULL) "
    "WITHOUT ROWID",
    "CREATE TABLE merchants (id TEXT PRIMARY KEY, state BLOB NOT NULL, live INTEGER NOT NULL) "
    "WITHOUT ROWID",
    "CREATE TABLE transactions (id TEXT PRIMARY KEY, merchant_id TEXT NOT NULL, "
    "t_us INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX transactions_by_time ON transactions (t_us)",
    "CREATE TABLE pending_labels (id TEXT PRIMARY KEY, is_fraud INTEGER NOT NULL, "
    "reported_us INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE journal (seq INTEGER PRIMARY KEY, record BLOB NOT NULL)",
)
"""The state file's layout before terminals (format 2)."""


def _format_2_file(path: Path, history: pd.DataFrame, seed_key: str) -> seed.Seed:
    """A state file as the version before terminals left it: seeded, then a live card."""
    s = seed.replay(history)
    db = sqlite3.connect(path)
    with db:
        for statement in _FORMAT_2:
            db.execute(statement)
        db.executemany(
            "INSERT INTO meta VALUES (?, ?)", [("format", "2"), (app.SEED_KEY, seed_key)]
        )
        db.executemany(
            "INSERT INTO cards VALUES (?, ?, ?)",
            ((k, c.to_bytes(), 0) for k, c in s.cards.items()),
        )
        db.executemany(
            "INSERT INTO merchants VALUES (?, ?, ?)",
            ((k, m.to_bytes(), 0) for k, m in s.merchants.items()),
        )
        db.executemany(
            "INSERT INTO transactions VALUES (?, ?, ?)",
            ((tid, m, t_us) for tid, m, _, t_us in s.transactions if m),
        )
        db.execute("INSERT INTO pending_labels VALUES ('tx-held', 1, 5)")
    db.close()
    return s


def test_a_state_file_without_terminals_is_migrated_and_its_terminals_seeded(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    store_settings = FeatureStoreSettings(var_dir=tmp_path)
    path = store_settings.data_path / layout.TRANSACTIONS_FILE
    path.parent.mkdir(parents=True)
    frame.to_parquet(path)
    state_file = tmp_path / "state.db"
    old = _format_2_file(state_file, frame, seed.fingerprint(path))
    card_id = next(iter(old.cards))
    state = StateStore(state_file)  # the migration happens on opening
    assert state.migrated_from == "2"
    assert state.meta("format") == state_format.FORMAT
    assert state.meta(state_format.TERMINALS_SEEDED) is None
    counts = state.counts()
    assert counts["terminals"] == 0 and counts["pending_labels"] == 1
    assert counts["cards"] == len(old.cards) and counts["merchants"] == len(old.merchants)
    some_tid, merchant_id, _, _ = old.transactions[0]
    assert state.entities_of(some_tid) == (merchant_id, "")

    updater = app.UpdaterApp(
        UpdaterSettings(var_dir=tmp_path, state_path=state_file),
        store_settings,
        EventLogSettings(var_dir=tmp_path),
        UpdaterMetrics(CollectorRegistry()),
    )
    updater._seed(state)  # the dataset is the one seeded from: only the terminals are new
    assert state.meta(state_format.TERMINALS_SEEDED) == seed.fingerprint(path)
    assert state.counts()["cards"] == len(old.cards)
    stored_card = state.card(card_id)
    assert stored_card is not None and stored_card.to_bytes() == old.cards[card_id].to_bytes()
    terminals = {key: state.terminal(key) for key in _terminals_of(frame)}
    _assert_states_match_batch(old.cards, old.merchants, terminals, frame)  # type: ignore[arg-type]
    entries = {tid: (m, t) for tid, m, t, _ in old.transactions}
    for tid, (merchant, terminal) in list(entries.items())[:200]:
        assert state.entities_of(tid) == (merchant, terminal)
    state.close()

    again = StateStore(state_file)  # migrated once: opens as format 3
    assert again.migrated_from is None and again.counts()["terminals"] == len(terminals)
    again.close()


def test_a_state_file_of_an_unknown_format_is_rebuilt(tmp_path: Path) -> None:
    state = StateStore(tmp_path / "s.db")
    state.save(cards=[("card-1", agg.CardState().to_bytes())])
    state.set_meta("format", "1")
    state.close()
    state = StateStore(tmp_path / "s.db")
    assert state.migrated_from is None and state.counts()["cards"] == 0
    assert state.meta("format") == state_format.FORMAT


def test_a_fraud_reported_after_the_terminals_newest_payment_moves_its_row(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    """The terminal's row is written as of the report, with the fraud counted once it is a
    label delay old: the batch table's row at that instant (docs/aggregation.md)."""
    busiest = frame["terminal_id"].value_counts().index[0]
    mine = frame[frame["terminal_id"] == busiest].tail(30)
    live = LiveAggregator(StateStore(tmp_path / "s.db"), 100, 100)
    for _, row in mine.iterrows():
        live.apply_decision(decision(row))
    live.rows()
    live.rows_written()
    victim = mine.iloc[-10]
    reported = mine["timestamp"].max() + pd.Timedelta(hours=1)
    applied = live.apply_outcome(outcome(str(victim["transaction_id"]), True, reported.timestamp()))
    assert (View.TERMINAL, Change.APPLIED) in applied.changes
    rows = {row.entity_id: row for row in live.rows().terminals}
    assert rows[busiest].event_s == pytest.approx(reported.timestamp())
    # The batch table, with the label, has a row at the report: the same one.
    want = _live_part(mine)
    want.loc[want["transaction_id"] == victim["transaction_id"], "is_fraud"] = True
    want.loc[want["transaction_id"] == victim["transaction_id"], "fraud_reported_at"] = reported
    table = agg.terminal_feature_table(want)
    at_report = table[table["event_timestamp"] == reported]
    assert len(at_report) == 0  # after the frame's newest payment: the batch has no row yet
    after = _live_part(mine.tail(1)).assign(
        transaction_id="after-the-report", timestamp=reported + pd.Timedelta(hours=1),
        terminal_id="elsewhere",
    )  # fmt: skip
    later = pd.concat([want, after])
    table = agg.terminal_feature_table(later)
    at_report = table[table["event_timestamp"] == reported].iloc[0]
    _assert_rows_equal(rows[busiest].values, at_report.to_dict(), busiest)


def test_a_seeded_fraud_reported_after_the_history_moves_its_terminals_row_when_due(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    """Labels the history carries come due after it (timestamp + delay, or a later
    ``fraud_reported_at``); the batch table has a terminal row at each once a payment is as
    late, and so does the live loop, whose clock is its newest payment."""
    cut = frame["timestamp"].max() - pd.Timedelta(days=5)
    history = frame[frame["timestamp"] <= cut]
    due = seed.replay(history).due
    cut_us = int(agg.timestamps_us(history["timestamp"]).max())
    assert len({t for t, _, _ in due}) >= 3 and all(r > cut_us for _, _, r in due)
    store = _seeded_store(tmp_path / "s.db", history)
    live = LiveAggregator(store, 10_000, 100)
    assert live.due_reports == len(due)
    # One payment, at a terminal of none of them, a minute after the middle report.
    middle_us = sorted(r for _, _, r in due)[len(due) // 2]
    moved = {t for t, _, r in due if r <= middle_us}
    clock = history[~history["terminal_id"].isin({t for t, _, _ in due})].iloc[-1].copy()
    clock["transaction_id"] = "the-clock"
    clock["timestamp"] = pd.Timestamp(middle_us + 60_000_000, unit="us", tz="UTC")
    live.apply_decision(decision(clock))
    assert live.due_reports == sum(1 for _, _, r in due if r > middle_us)
    rows = {row.entity_id: row for row in live.rows().terminals}
    assert set(rows) == moved | {clock["terminal_id"]}
    want = pd.concat([history, _live_part(pd.DataFrame([clock]))], ignore_index=True)
    table = agg.terminal_feature_table(want)
    newest = table.sort_values("event_timestamp").groupby("terminal_id").tail(1)
    for terminal_id in moved:
        at = newest[newest["terminal_id"] == terminal_id].iloc[0]
        assert rows[terminal_id].event_s == pytest.approx(at["event_timestamp"].timestamp())
        assert at["event_timestamp"] > cut  # a report, not a payment of the history
        _assert_rows_equal(rows[terminal_id].values, at.to_dict(), terminal_id)
    # Every state's row is the batch table's newest, the moved ones and the rest.
    cards, merchants, terminals = _all_states(
        live, want["card_id"].unique(), want["merchant_id"].unique(), _terminals_of(want)
    )
    _assert_states_match_batch(cards, merchants, terminals, want)

    # After a restart the reports already passed change nothing; the later ones still move.
    live.rows_written()
    live.snapshot_all()
    again = LiveAggregator(store, 10_000, 100)
    assert again.due_reports == len(due)
    clock2 = clock.copy()
    clock2["transaction_id"] = "the-clock-again"
    clock2["timestamp"] += pd.Timedelta(seconds=1)
    again.apply_decision(decision(clock2))
    assert {row.entity_id for row in again.rows().terminals} == {clock["terminal_id"]}
    last_us = max(r for _, _, r in due)
    clock3 = clock.copy()
    clock3["transaction_id"] = "the-clock-last"
    clock3["timestamp"] = pd.Timestamp(last_us, unit="us", tz="UTC")
    again.apply_decision(decision(clock3))
    assert again.due_reports == 0
    later = {t for t, _, r in due if r > middle_us + 1_000_000} - moved
    assert later and {row.entity_id for row in again.rows().terminals} >= later


def test_a_partition_moves_the_due_rows_of_its_own_merchants_only(
    frame: pd.DataFrame, tmp_path: Path
) -> None:
    cut = frame["timestamp"].max() - pd.Timedelta(days=5)
    history = frame[frame["timestamp"] <= cut]
    due = seed.replay(history).due
    base = _seeded_store(tmp_path / "base.db", history)
    mine = {m for _, m, _ in due[::2]}
    part = StateStore(tmp_path / "part.db", base=base)
    live = LiveAggregator(part, 10_000, 100, owns_merchant=mine.__contains__)
    assert live.due_reports == sum(1 for _, m, _ in due if m in mine) < len(due)
    cards_only = LiveAggregator(part, 10_000, 100, views=frozenset({View.CARD}))
    assert cards_only.due_reports == 0


def test_a_terminal_state_of_the_encoding_before_report_instants_decodes_with_none() -> None:
    state = agg.MerchantState()
    event = agg.TransactionEvent(
        transaction_id="t1", timestamp_s=1_700_000_000.0, card_id="c", merchant_id="m",
        amount_minor=1_000, currency="EUR", channel=featurespec.CARD_PRESENT, terminal_id="x",
    )  # fmt: skip
    state = agg.apply_terminal(state, event).state
    agg.apply_terminal_label(state, "t1", True, 1_700_000_000.0 + 8 * 86_400)
    assert state.reported_us == (1_700_000_000 + 8 * 86_400) * 1_000_000
    data = state.to_bytes()
    assert data[:2] == b"M2"
    again = agg.MerchantState.from_bytes(data)
    assert again.reported_us == state.reported_us
    assert agg.terminal_row(again) == agg.terminal_row(state)
    # M1: the same parts without the report instant (five integers, not six).
    before = b"M1" + data[2 : 2 + 5 * 8] + data[2 + 6 * 8 :]
    old = agg.MerchantState.from_bytes(before)
    assert old.reported_us == 0 and old.row_us == old.events.newest_us
