"""Feature aggregation: batch tables equal the simulator's, a brute force, and event-by-event replay."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from datetime import date, timedelta
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest

from services.domain import aggregation as agg
from services.domain import featurespec
from services.domain.aggregation import Change, TransactionEvent, incremental
from services.pipelines import simulate

END = date(2026, 1, 15)
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
HOUR = 3_600.0
DAY = 86_400.0
REL = 1e-9


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> simulate.Simulation:
    return simulate.simulate(simulate.preset("small", end=END))


@pytest.fixture(scope="module")
def raw(sim: simulate.Simulation) -> pd.DataFrame:
    """The simulator's transactions: a raw frame with every optional column."""
    return sim.transactions.copy()


@pytest.fixture(scope="module")
def reported(raw: pd.DataFrame) -> pd.DataFrame:
    """``raw`` with fraud labels reported at varied times: early, on time and weeks late."""
    rng = np.random.default_rng(11)
    tx = raw.copy()
    delay_s = rng.choice([0.0, 3 * DAY, 7 * DAY, 9 * DAY, 20 * DAY], size=len(tx))
    jitter = rng.integers(0, 3_600, size=len(tx)).astype(float)
    tx["fraud_reported_at"] = tx["timestamp"] + pd.to_timedelta(delay_s + jitter, unit="s")
    tx.loc[~tx["is_fraud"], "fraud_reported_at"] = pd.NaT
    return tx


def _frame(rows: Iterable[dict[str, object]]) -> pd.DataFrame:
    """A raw transaction frame from short dicts (``t`` in epoch seconds)."""
    frame = pd.DataFrame(list(rows))
    micros = np.round(frame.pop("t").to_numpy(dtype=np.float64) * 1e6).astype(np.int64)
    frame["timestamp"] = pd.to_datetime(micros, unit="us", utc=True).astype("datetime64[us, UTC]")
    defaults: dict[str, object] = {
        "merchant_id": "m1",
        "card_id": "c1",
        "currency": "EUR",
        "channel": featurespec.CARD_NOT_PRESENT,
        "is_fraud": False,
    }
    for name, value in defaults.items():
        if name not in frame.columns:
            frame[name] = value
    return frame


def _event(tid: str, t: float, amount_minor: int = 1_000, **kw: object) -> TransactionEvent:
    fields: dict[str, object] = {
        "card_id": "c1",
        "merchant_id": "m1",
        "currency": "EUR",
        "channel": featurespec.CARD_NOT_PRESENT,
        "card_home_country": 276,
        "merchant_country": 276,
        "merchant_category": 5411,
    } | kw
    return TransactionEvent(tid, t, amount_minor=amount_minor, **fields)  # type: ignore[arg-type]


def _replay_cards(events: Iterable[TransactionEvent]) -> dict[str, agg.CardState]:
    states: dict[str, agg.CardState] = {}
    for event in events:
        states[event.card_id] = agg.apply_card(states.get(event.card_id), event).state
    return states


# --- comparisons --------------------------------------------------------------------------


def _last_rows(table: pd.DataFrame, key: str) -> pd.DataFrame:
    """Each entity's last row, indexed by entity (``groupby().last()`` would skip NaN)."""
    return table.groupby(key).tail(1).set_index(key)


def _assert_rows_close(got: pd.DataFrame, want: pd.DataFrame, names: Iterable[str]) -> None:
    """Equal counts and codes; floats within ``REL`` (std through its square, see the module)."""
    assert len(got) == len(want)
    for name in names:
        a = got[name].to_numpy(dtype=np.float64, na_value=np.nan)
        b = want[name].to_numpy(dtype=np.float64, na_value=np.nan)
        assert (np.isnan(a) == np.isnan(b)).all(), name
        a, b = np.nan_to_num(a), np.nan_to_num(b)
        if name == "card_amount_std_30d":
            scale = got["card_amount_mean_30d"].to_numpy() ** 2 + b**2
            bad = np.abs(a**2 - b**2) > REL * scale
        else:
            bad = np.abs(a - b) > REL * np.maximum(np.abs(b), 1e-12)
        assert not bad.any(), (name, got[bad].head(), want[bad].head())


# --- batch path -------------------------------------------------------------------------


def test_batch_tables_have_the_spec_columns(raw: pd.DataFrame) -> None:
    cards = agg.card_feature_table(raw)
    merchants = agg.merchant_feature_table(raw)
    terminals = agg.terminal_feature_table(raw)
    assert list(cards.columns) == ["card_id", "event_timestamp", *featurespec.CARD_FEATURES]
    assert list(merchants.columns) == [
        "merchant_id",
        "event_timestamp",
        *featurespec.MERCHANT_FEATURES,
    ]
    assert list(terminals.columns) == [
        "terminal_id",
        "event_timestamp",
        *featurespec.TERMINAL_FEATURES,
    ]
    for table in (cards, merchants, terminals):
        assert not table.isna().any().any()
    # A terminal without a counted fraud has fraud times, of none.
    none = terminals["terminal_known_fraud_first_s"].eq(featurespec.NO_KNOWN_FRAUD)
    assert (none == terminals["terminal_fraud_rate_28d"].eq(0)).all()
    assert (none == terminals["terminal_known_fraud_last_s"].eq(featurespec.NO_KNOWN_FRAUD)).all()
    # Codes are integers, as Feast declares them, whether or not some are unknown.
    assert cards["card_home_country"].dtype == "Int64"
    assert merchants["merchant_category"].dtype == "Int64"


def test_batch_ignores_input_order(raw: pd.DataFrame) -> None:
    shuffled = raw.sample(frac=1.0, random_state=3).reset_index(drop=True)
    for table in (
        agg.card_feature_table,
        agg.merchant_feature_table,
        agg.terminal_feature_table,
    ):
        pd.testing.assert_frame_equal(table(shuffled), table(raw), rtol=1e-12)


def test_missing_optional_columns_give_null_codes_and_no_terminal_rows(
    raw: pd.DataFrame,
) -> None:
    bare = raw[list(agg.REQUIRED_COLUMNS)]
    cards = agg.card_feature_table(bare)
    merchants = agg.merchant_feature_table(bare)
    assert cards["card_home_country"].dtype == "Int64"
    assert cards["card_home_country"].isna().all()
    assert merchants["merchant_category"].isna().all()
    assert merchants["merchant_country"].dtype == "Int64"
    terminals = agg.terminal_feature_table(bare)
    assert len(terminals) == 0
    assert list(terminals.columns) == [
        "terminal_id",
        "event_timestamp",
        *featurespec.TERMINAL_FEATURES,
    ]
    # The other aggregates do not depend on the optional columns.
    full = agg.merchant_feature_table(raw)
    pd.testing.assert_frame_equal(
        merchants.drop(columns=["merchant_category", "merchant_country"]),
        full.drop(columns=["merchant_category", "merchant_country"]),
    )
    # Rows without a terminal are left out of the terminal table.
    some = raw.assign(terminal_id=raw["terminal_id"].where(raw.index % 3 != 0, None))
    assert len(agg.terminal_feature_table(some)) < len(agg.terminal_feature_table(raw))


def test_amounts_convert_exactly_as_serving() -> None:
    tx = _frame(
        {"transaction_id": f"t{i}", "t": T0 + i, "amount_minor": m, "currency": c}
        for i, (m, c) in enumerate([(1999, "EUR"), (1234, "JPY"), (1001, "KWD"), (7, "XXX")])
    )
    want = [
        featurespec.amount_eur(int(m), str(c))
        for m, c in zip(tx.amount_minor, tx.currency, strict=True)
    ]
    assert agg.amounts_eur(tx).tolist() == want


def test_batch_validates_its_input() -> None:
    tx = _frame([{"transaction_id": "a", "t": T0, "amount_minor": 100}])
    with pytest.raises(ValueError, match="lack column"):
        agg.card_feature_table(tx.drop(columns=["channel"]))
    naive = tx.assign(timestamp=tx["timestamp"].dt.tz_localize(None))
    with pytest.raises(ValueError, match="timezone-aware"):
        agg.merchant_feature_table(naive)


# --- brute force on hostile data: ties, missing codes, late reports ------------------------


def _hostile_frame(seed: int, n: int = 400) -> pd.DataFrame:
    """Few entities, timestamps on a coarse grid (many ties), codes often missing or changing."""
    rng = np.random.default_rng(seed)
    step = rng.choice([600.0, 3_600.0, 0.5], size=n, p=[0.6, 0.3, 0.1])
    t = T0 + np.round(rng.uniform(0, 50 * DAY, size=n) / step) * step
    is_fraud = rng.random(n) < 0.15
    report = rng.choice([0.0, 2 * DAY, 7 * DAY, 12 * DAY, np.nan], size=n)
    frame = _frame(
        {
            "transaction_id": f"tx-{rng.integers(10**6):06d}-{i}",
            "t": float(t[i]),
            "card_id": f"c{rng.integers(3)}",
            "merchant_id": f"m{rng.integers(3)}",
            # 0: account verifications, traffic like any payment.
            "amount_minor": int(rng.choice([0, 5, 150, 2_000, 99_999])),
            "currency": str(rng.choice(["EUR", "JPY", "GBP"])),
            "is_fraud": bool(is_fraud[i]),
            "card_home_country": rng.choice([276.0, 250.0, np.nan]),
            "merchant_country": rng.choice([826.0, np.nan]),
            "merchant_category": rng.choice([5411.0, 5999.0, np.nan, np.nan]),
            "terminal_id": rng.choice(["t0", "t1", "t2", "t3", None]),
        }
        for i in range(n)
    )
    frame["fraud_reported_at"] = frame["timestamp"] + pd.to_timedelta(report, unit="s")
    # Every entity starts unknown, so rows before its first known code hold NaN.
    for entity, code in (("card_id", "card_home_country"), ("merchant_id", "merchant_category")):
        frame.loc[frame.groupby(entity)["timestamp"].idxmin(), code] = np.nan
    return frame


def _latest(history: pd.DataFrame, name: str) -> float:
    known = history.dropna(subset=[name]).sort_values(["timestamp", "transaction_id"])
    return float(known[name].iloc[-1]) if len(known) else math.nan


def _brute_cards(tx: pd.DataFrame) -> pd.DataFrame:
    tx = tx.assign(eur=agg.amounts_eur(tx))
    rows = []
    for (card, at), _ in tx.groupby(["card_id", "timestamp"]):
        mine = tx[(tx["card_id"] == card) & (tx["timestamp"] <= at)]

        def window(
            span: timedelta, mine: pd.DataFrame = mine, at: pd.Timestamp = at
        ) -> pd.DataFrame:
            return mine[mine["timestamp"] > at - span]

        h1, d1 = window(timedelta(hours=1)), window(timedelta(days=1))
        d7, d30 = window(timedelta(days=7)), window(timedelta(days=30))
        rows.append(
            {
                "card_id": card,
                "event_timestamp": at,
                "card_txn_count_1h": len(h1),
                "card_txn_count_24h": len(d1),
                "card_txn_count_7d": len(d7),
                "card_txn_count_30d": len(d30),
                "card_amount_sum_24h": d1["eur"].sum(),
                "card_amount_mean_7d": d7["eur"].mean(),
                "card_amount_max_7d": d7["eur"].max(),
                "card_amount_mean_30d": d30["eur"].mean(),
                "card_amount_std_30d": d30["eur"].std(ddof=0),
                "card_distinct_merchants_24h": d1["merchant_id"].nunique(),
                "card_small_txn_count_1h": int((h1["eur"] < featurespec.SMALL_AMOUNT_EUR).sum()),
                "card_last_txn_s": math.floor(at.timestamp()),
                "card_home_country": _latest(mine, "card_home_country"),
            }
        )
    return pd.DataFrame(rows)


def _brute_risk(
    tx: pd.DataFrame, mine: pd.DataFrame, at: pd.Timestamp, prefix: str, delay: timedelta
) -> dict[str, float]:
    """Volume and delayed fraud rates of one entity's history ``mine`` at ``at``."""
    reported = tx["fraud_reported_at"].fillna(tx["timestamp"] + delay)
    row: dict[str, float] = {
        f"{prefix}_txn_count_1d": len(mine[mine["timestamp"] > at - timedelta(days=1)]),
        f"{prefix}_txn_count_7d": len(mine[mine["timestamp"] > at - timedelta(days=7)]),
    }
    for suffix, width in agg.RISK_WINDOWS:
        known = mine[(mine["timestamp"] > at - delay - width) & (mine["timestamp"] <= at - delay)]
        frauds = (known["is_fraud"] & (reported[known.index] <= at)).sum()
        row[f"{prefix}_fraud_rate_{suffix}"] = frauds / len(known) if len(known) else 0.0
        row[f"{prefix}_labelled_txn_count_{suffix}"] = len(known)
    return row


def _brute_merchants(tx: pd.DataFrame, delay: timedelta) -> pd.DataFrame:
    tx = tx.assign(eur=agg.amounts_eur(tx))
    rows = []
    for (merchant, at), _ in tx.groupby(["merchant_id", "timestamp"]):
        mine = tx[(tx["merchant_id"] == merchant) & (tx["timestamp"] <= at)]
        d28 = mine[mine["timestamp"] > at - timedelta(days=28)]
        rows.append(
            {
                "merchant_id": merchant,
                "event_timestamp": at,
                **_brute_risk(tx, mine, at, "merchant", delay),
                "merchant_amount_mean_28d": d28["eur"].mean(),
                "merchant_category": _latest(mine, "merchant_category"),
                "merchant_country": _latest(mine, "merchant_country"),
            }
        )
    return pd.DataFrame(rows)


def _brute_terminals(tx: pd.DataFrame, delay: timedelta) -> pd.DataFrame:
    """A terminal's row at each of its payments' instants, and at each report of a fraud's
    label (up to the frame's newest payment) at an instant without one of its payments."""
    named = tx[tx["terminal_id"].notna()]
    reported = tx["fraud_reported_at"].fillna(tx["timestamp"] + delay)
    instants = set(zip(named["terminal_id"], named["timestamp"], strict=True))
    frauds = named[named["is_fraud"]]
    for terminal, r in zip(frauds["terminal_id"], reported[frauds.index], strict=True):
        if r <= tx["timestamp"].max():
            instants.add((terminal, r))
    rows = []
    for terminal, at in sorted(instants):
        mine = named[(named["terminal_id"] == terminal) & (named["timestamp"] <= at)]
        # The frauds the 28-day rate counts: inside its window and reported by now.
        window = mine[
            (mine["timestamp"] > at - delay - agg.FRAUD_RATE_WINDOW)
            & (mine["timestamp"] <= at - delay)
        ]
        counted = window[window["is_fraud"] & (reported[window.index] <= at)]["timestamp"]
        seconds = [t.value / 1e9 for t in counted]
        rows.append(
            {
                "terminal_id": terminal,
                "event_timestamp": at,
                **_brute_risk(tx, mine, at, "terminal", delay),
                "terminal_known_fraud_first_s": min(seconds, default=featurespec.NO_KNOWN_FRAUD),
                "terminal_known_fraud_last_s": max(seconds, default=featurespec.NO_KNOWN_FRAUD),
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", [1, 2])
def test_batch_equals_a_brute_force_on_ties_gaps_and_late_reports(seed: int) -> None:
    tx = _hostile_frame(seed)
    assert tx.duplicated(["card_id", "timestamp"]).any()  # the data has ties to cover
    cards = agg.card_feature_table(tx)
    assert not cards.duplicated(["card_id", "event_timestamp"]).any()
    _assert_rows_close(cards, _brute_cards(tx), featurespec.CARD_FEATURES)
    assert cards["card_home_country"].isna().any()
    assert cards["card_home_country"].dtype == "Int64"
    for delay in (agg.LABEL_DELAY, timedelta(days=3)):
        merchants = agg.merchant_feature_table(tx, label_delay=delay)
        _assert_rows_close(merchants, _brute_merchants(tx, delay), featurespec.MERCHANT_FEATURES)
        terminals = agg.terminal_feature_table(tx, label_delay=delay)
        _assert_rows_close(terminals, _brute_terminals(tx, delay), featurespec.TERMINAL_FEATURES)
        assert (terminals["terminal_fraud_rate_1d"] > 0).any()
        assert terminals["terminal_known_fraud_first_s"].gt(featurespec.NO_KNOWN_FRAUD).any()


@pytest.mark.parametrize("seed", [1, 2])
def test_incremental_equals_the_brute_force_on_hostile_data(seed: int) -> None:
    tx = _hostile_frame(seed)
    tx = tx.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)
    events = list(agg.events_from_frame(tx.assign(is_fraud=None)))
    _assert_replay_matches(tx, events, _tables(tx))


class _Tables(NamedTuple):
    """The batch tables of one frame."""

    cards: pd.DataFrame
    merchants: pd.DataFrame
    terminals: pd.DataFrame


def _tables(tx: pd.DataFrame) -> _Tables:
    return _Tables(
        agg.card_feature_table(tx), agg.merchant_feature_table(tx), agg.terminal_feature_table(tx)
    )


# --- incremental replay vs batch ------------------------------------------------------------


class _Outcome(NamedTuple):
    """A label as the outcome feed delivers it."""

    reported_s: float
    merchant_id: str
    transaction_id: str
    is_fraud: bool
    terminal_id: str | None = None


def _label_feed(tx: pd.DataFrame) -> list[_Outcome]:
    """Every fraud's label, at its report time (default: transaction time + label delay)."""
    frauds = tx[tx["is_fraud"]]
    reported = frauds["fraud_reported_at"].fillna(frauds["timestamp"] + agg.LABEL_DELAY)
    terminals = frauds["terminal_id"] if "terminal_id" in frauds else [None] * len(frauds)
    return [
        _Outcome(r.timestamp(), m, tid, True, term if isinstance(term, str) else None)
        for r, m, tid, term in zip(
            reported, frauds["merchant_id"], frauds["transaction_id"], terminals, strict=True
        )
    ]


def _assert_replay_matches(
    tx: pd.DataFrame, events: list[TransactionEvent], tables: _Tables
) -> None:
    """Replays ``events`` (time order) and the label feed; every row equals the batch row.

    A label goes before transactions of its own instant (reported at t counts at t). A row
    is compared once its instant is complete: after the last transaction of that
    (entity, timestamp), the batch row's definition.
    """
    feed: list[tuple[float, int, TransactionEvent | _Outcome]] = [
        (e.timestamp_s, 1, e) for e in events
    ]
    feed += [(o.reported_s, 0, o) for o in _label_feed(tx)]
    feed.sort(key=lambda item: (item[0], item[1]))
    ties = {
        key: tx.groupby([key, "timestamp"]).size()
        for key in ("card_id", "merchant_id", "terminal_id")
    }
    cards: dict[str, agg.CardState] = {}
    merchants: dict[str, agg.MerchantState] = {}
    terminals: dict[str, agg.MerchantState] = {}
    rows: dict[str, list[dict[str, object]]] = {key: [] for key in ties}
    moved: dict[tuple[str, pd.Timestamp], agg.FeatureRow] = {}
    """Terminal rows moved by a label, by (terminal, instant): the last one of an instant."""
    newest = tx["timestamp"].max()

    def record(key: str, entity: str, times: list[int], row: agg.FeatureRow | None) -> None:
        at = pd.Timestamp(times[-1], unit="us", tz="UTC")
        if times.count(times[-1]) == ties[key][(entity, at)]:
            assert row is not None
            rows[key].append({key: entity, "event_timestamp": at, **row})

    for _, _, item in feed:
        if isinstance(item, _Outcome):
            up = agg.apply_label(
                merchants.get(item.merchant_id), item.transaction_id, item.is_fraud, item.reported_s
            )
            merchants[item.merchant_id] = up.state
            if up.row is not None:
                record("merchant_id", item.merchant_id, up.state.events.times_us, up.row)
            if item.terminal_id is not None:
                up = agg.apply_terminal_label(
                    terminals.get(item.terminal_id),
                    item.transaction_id,
                    item.is_fraud,
                    item.reported_s,
                )
                terminals[item.terminal_id] = up.state
                state = up.state
                if up.row is not None and state.row_us > state.events.newest_us:
                    # A label reported after the terminal's newest payment moves its row:
                    # the batch table's row at the report, unless a payment of the terminal
                    # is at that instant (its row is the one after the payment) or the
                    # report comes after the frame's newest payment (no row yet).
                    at = pd.Timestamp(state.row_us, unit="us", tz="UTC")
                    if (item.terminal_id, at) not in ties["terminal_id"] and at <= newest:
                        moved[(item.terminal_id, at)] = up.row
                elif up.row is not None:
                    record("terminal_id", item.terminal_id, up.state.events.times_us, up.row)
            continue
        c = agg.apply_card(cards.get(item.card_id), item)
        m = agg.apply_merchant(merchants.get(item.merchant_id), item)
        assert c.change is Change.APPLIED and m.change is Change.APPLIED
        cards[item.card_id], merchants[item.merchant_id] = c.state, m.state
        record("card_id", item.card_id, c.state.events.times_us, c.row)
        record("merchant_id", item.merchant_id, m.state.events.times_us, m.row)
        if item.terminal_id is not None:
            t = agg.apply_terminal(terminals.get(item.terminal_id), item)
            assert t.change is Change.APPLIED
            terminals[item.terminal_id] = t.state
            record("terminal_id", item.terminal_id, t.state.events.times_us, t.row)

    for (terminal, at), row in moved.items():
        rows["terminal_id"].append({"terminal_id": terminal, "event_timestamp": at, **row})
    for key, table, names in (
        ("card_id", tables.cards, featurespec.CARD_FEATURES),
        ("merchant_id", tables.merchants, featurespec.MERCHANT_FEATURES),
        ("terminal_id", tables.terminals, featurespec.TERMINAL_FEATURES),
    ):
        got = pd.DataFrame(rows[key])
        want = got[[key, "event_timestamp"]].merge(
            table, on=[key, "event_timestamp"], how="left", validate="many_to_one"
        )
        assert want[names[0]].notna().all()
        _assert_rows_close(got, want, names)
        # Every batch row was reached by the replay.
        assert set(zip(table[key], table["event_timestamp"], strict=True)) == set(
            zip(got[key], got["event_timestamp"], strict=True)
        )


def test_event_by_event_replay_equals_batch_over_the_small_preset(
    reported: pd.DataFrame,
) -> None:
    tx = reported
    tables = _tables(tx)
    # Late reports hold some fraud back: the rates differ from the default rule's.
    on_time = agg.merchant_feature_table(tx.drop(columns=["fraud_reported_at"]))
    for window in featurespec.RISK_WINDOWS:
        rate = f"merchant_fraud_rate_{window}"
        got = tables.merchants[rate]
        assert (got < on_time[rate]).any() and (got <= on_time[rate]).all()
    # Labels only through the outcome feed, as the live loop receives them.
    events = list(agg.events_from_frame(tx.assign(is_fraud=None)))
    _assert_replay_matches(tx, events, tables)


def test_labels_carried_by_events_follow_the_default_delay_rule(raw: pd.DataFrame) -> None:
    merchants: dict[str, agg.MerchantState] = {}
    terminals: dict[str, agg.MerchantState] = {}
    last: dict[str, agg.FeatureRow] = {}
    last_terminal: dict[str, agg.FeatureRow] = {}
    for event in agg.events_from_frame(raw):
        up = agg.apply_merchant(merchants.get(event.merchant_id), event)
        merchants[event.merchant_id] = up.state
        assert up.row is not None and event.terminal_id is not None
        last[event.merchant_id] = up.row
        up = agg.apply_terminal(terminals.get(event.terminal_id), event)
        terminals[event.terminal_id] = up.state
        assert up.row is not None
        last_terminal[event.terminal_id] = up.row
    want = _last_rows(agg.merchant_feature_table(raw), "merchant_id")
    got = pd.DataFrame.from_dict(last, orient="index").loc[want.index]
    _assert_rows_close(got, want, featurespec.MERCHANT_FEATURES)
    assert want["merchant_fraud_rate_28d"].gt(0).any()
    # Labels carried by events move no row at their report (apply_terminal_label does):
    # the terminal's last row as of a payment.
    terminals_table = agg.terminal_feature_table(raw)
    paid = set(zip(raw["terminal_id"], raw["timestamp"], strict=True))
    at_payments = [
        key in paid
        for key in zip(
            terminals_table["terminal_id"], terminals_table["event_timestamp"], strict=True
        )
    ]
    want = _last_rows(terminals_table[at_payments], "terminal_id")
    got = pd.DataFrame.from_dict(last_terminal, orient="index").loc[want.index]
    _assert_rows_close(got, want, featurespec.TERMINAL_FEATURES)
    assert want["terminal_fraud_rate_7d"].gt(0).any()


def test_shuffled_late_and_duplicated_events_give_the_same_final_rows(
    reported: pd.DataFrame,
) -> None:
    """Arrival up to 6 h late, 5% delivered twice, labels early or late, states persisted."""
    rng = np.random.default_rng(5)
    tx = reported
    events = list(agg.events_from_frame(tx.assign(is_fraud=None)))
    arrivals: list[tuple[float, TransactionEvent | _Outcome]] = []
    for event in events:
        arrivals.append((event.timestamp_s + rng.uniform(0, 6 * HOUR), event))
        if rng.random() < 0.05:
            arrivals.append((event.timestamp_s + rng.uniform(0, 12 * HOUR), event))
    for outcome in _label_feed(tx):
        # Some labels overtake their transaction and wait as pending ones.
        arrival = outcome.reported_s + rng.uniform(-6 * HOUR, 2 * HOUR)
        arrivals.append((arrival, outcome))
        if rng.random() < 0.2:
            arrivals.append((arrival + HOUR, outcome))
    arrivals.sort(key=lambda a: a[0])

    cards: dict[str, agg.CardState] = {}
    merchants: dict[str, agg.MerchantState] = {}
    changes: dict[Change, int] = dict.fromkeys(Change, 0)
    for _, item in arrivals:
        if isinstance(item, _Outcome):
            up_label = agg.apply_label(
                merchants.get(item.merchant_id), item.transaction_id, item.is_fraud, item.reported_s
            )
            merchants[item.merchant_id] = up_label.state
            changes[up_label.change] += 1
            continue
        card = cards.get(item.card_id)
        if card is not None and rng.random() < 0.1:
            card = agg.CardState.from_bytes(card.to_bytes())
        merchant_state = merchants.get(item.merchant_id)
        if merchant_state is not None and rng.random() < 0.1:
            merchant_state = agg.MerchantState.from_bytes(merchant_state.to_bytes())
        c = agg.apply_card(card, item)
        m = agg.apply_merchant(merchant_state, item)
        cards[item.card_id], merchants[item.merchant_id] = c.state, m.state
        changes[c.change] += 1
        changes[m.change] += 1

    # Every path was taken, and nothing was too old for the windows.
    assert changes[Change.LATE] > 0 and changes[Change.DUPLICATE] > 0
    assert changes[Change.PENDING] > 0 and changes[Change.TOO_OLD] == 0
    card_rows = {k: agg.card_row(state) for k, state in cards.items()}
    merchant_rows = {k: agg.merchant_row(state) for k, state in merchants.items()}
    assert not any(s.evicted_by_cap for s in cards.values())
    assert not any(s.evicted_by_cap or s.pending for s in merchants.values())
    for rows, table, key, names in (
        (card_rows, agg.card_feature_table(tx), "card_id", featurespec.CARD_FEATURES),
        (
            merchant_rows,
            agg.merchant_feature_table(tx),
            "merchant_id",
            featurespec.MERCHANT_FEATURES,
        ),
    ):
        want = _last_rows(table, key)
        got = pd.DataFrame.from_dict(rows, orient="index").loc[want.index]
        _assert_rows_close(got, want, names)


def test_zero_amounts_are_payments_of_nothing_in_batch_and_replay_alike() -> None:
    """Account verifications (amount 0) count in every window and as small payments, and
    pull the card's mean down; a window of verifications only has mean and spread 0."""
    rows = [(5_000, 0.0), (0, 31 * DAY), (0, 31 * DAY + 60), (0, 31 * DAY + 120)]
    rows += [(2_500, 32 * DAY), (0, 32 * DAY + 60)]
    tx = _frame(
        {"transaction_id": f"v{i}", "t": T0 + dt, "amount_minor": m, "terminal_id": "t1"}
        for i, (m, dt) in enumerate(rows)
    )
    tx["fraud_reported_at"] = pd.Series(pd.NaT, index=tx.index, dtype="datetime64[us, UTC]")
    tables = _tables(tx)
    _assert_replay_matches(tx, list(agg.events_from_frame(tx.assign(is_fraud=None))), tables)
    cards = tables.cards  # one card: a row per transaction, in time order
    only_zeros = cards.iloc[3]  # three verifications; the 50 EUR payment is 31 days back
    assert only_zeros["card_txn_count_1h"] == 3 and only_zeros["card_small_txn_count_1h"] == 3
    assert only_zeros["card_amount_mean_30d"] == 0.0 == only_zeros["card_amount_std_30d"]
    assert only_zeros["card_amount_max_7d"] == 0.0
    last = cards.iloc[-1]
    assert last["card_amount_mean_7d"] == pytest.approx(25.0 / 5)
    assert last["card_small_txn_count_1h"] == 1


# --- window edges, ties, eviction, idempotency, late events --------------------------------


def test_windows_are_half_open_at_microsecond_resolution() -> None:
    state: agg.CardState | None = None
    for tid, t in (("a", T0), ("b", T0 + 0.000001), ("c", T0 + HOUR)):
        up = agg.apply_card(state, _event(tid, t))
        state = up.state
    assert up.row is not None
    # (t - 1 h, t]: "a" is exactly one hour old and out; "b" one microsecond younger and in.
    assert up.row["card_txn_count_1h"] == 2
    assert up.row["card_txn_count_24h"] == 3
    batch = agg.card_feature_table(
        _frame(
            {"transaction_id": k, "t": t, "amount_minor": 1_000}
            for k, t in (("a", T0), ("b", T0 + 0.000001), ("c", T0 + HOUR))
        )
    )
    assert batch["card_txn_count_1h"].tolist() == [1, 2, 2]


def test_an_instant_with_several_transactions_is_one_row_covering_all() -> None:
    tx = _frame(
        [
            {"transaction_id": "b", "t": T0, "amount_minor": 100, "card_home_country": 250},
            {"transaction_id": "a", "t": T0, "amount_minor": 300, "card_home_country": 276},
            {"transaction_id": "c", "t": T0 - 60, "amount_minor": 50},
        ]
    )
    table = agg.card_feature_table(tx)
    assert len(table) == 2
    row = table.iloc[-1]
    assert row["card_txn_count_1h"] == 3
    assert row["card_amount_max_7d"] == 3.0
    # Latest known within an instant: the greatest transaction id, "b".
    assert row["card_home_country"] == 250
    assert pd.isna(table.iloc[0]["card_home_country"])
    # Any arrival order gives the same row.
    for order in (["c", "a", "b"], ["b", "a", "c"], ["a", "c", "b"]):
        events = {e.transaction_id: e for e in agg.events_from_frame(tx)}
        state = _replay_cards(events[k] for k in order)["c1"]
        got = agg.card_row(state)
        assert got is not None
        assert got["card_home_country"] == 250 and got["card_txn_count_1h"] == 3
        assert state.events.ids == ["c", "a", "b"]  # by time, then transaction id


def test_old_events_are_evicted_and_the_cap_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    state = agg.apply_card(None, _event("old", T0)).state
    up = agg.apply_card(state, _event("new", T0 + 30 * DAY))
    # Exactly 30 days old is outside (t - 30 d, t]: evicted from the state.
    assert up.state.events.ids == ["new"]
    assert up.row is not None and up.row["card_txn_count_7d"] == 1

    monkeypatch.setattr(incremental, "MAX_CARD_EVENTS", 3)
    full: agg.CardState | None = None
    capped = 0
    for i in range(5):
        up = agg.apply_card(full, _event(f"t{i}", T0 + i))
        full, capped = up.state, capped + up.evicted_by_cap
    assert up.state.events.ids == ["t2", "t3", "t4"]
    assert capped == up.state.evicted_by_cap == 2
    assert up.row is not None and up.row["card_txn_count_1h"] == 3


def test_a_transaction_id_counts_once() -> None:
    first = agg.apply_card(None, _event("a", T0, 500))
    again = agg.apply_card(first.state, _event("a", T0 + 10, 900))
    assert again.change is Change.DUPLICATE
    assert again.row == first.row
    assert again.state.duplicates == 1
    merchant = agg.apply_merchant(None, _event("a", T0))
    assert agg.apply_merchant(merchant.state, _event("a", T0)).change is Change.DUPLICATE


def test_late_events_merge_at_their_time_or_are_ignored_when_too_old() -> None:
    state = agg.apply_card(None, _event("now", T0 + 40 * DAY, 1_000)).state
    # Inside the 1 h window: every window changes.
    inside = agg.apply_card(state, _event("late-1", T0 + 40 * DAY - 60, 100, merchant_id="m2"))
    assert inside.change is Change.LATE
    assert inside.row is not None
    assert inside.row["card_txn_count_1h"] == 2
    assert inside.row["card_distinct_merchants_24h"] == 2
    assert inside.row["card_last_txn_s"] == int(T0 + 40 * DAY)
    # Ten days old: only the 30-day window sees it.
    before = dict(inside.row)
    ten = agg.apply_card(inside.state, _event("late-10d", T0 + 30 * DAY, 4_000))
    assert ten.change is Change.LATE and ten.row is not None
    changed = {k for k in before if before[k] != ten.row[k]}
    assert changed == {"card_txn_count_30d", "card_amount_mean_30d", "card_amount_std_30d"}
    # Thirty days old: too old for every window; nothing changes.
    size = len(ten.state.events)
    old = agg.apply_card(ten.state, _event("late-30d", T0 + 10 * DAY))
    assert old.change is Change.TOO_OLD and old.row == ten.row
    assert len(old.state.events) == size and old.state.too_old == 1


def test_codes_are_the_latest_known_and_nan_while_unknown() -> None:
    up = agg.apply_merchant(None, _event("a", T0, merchant_country=None, merchant_category=None))
    assert up.row is not None and math.isnan(up.row["merchant_country"])
    up = agg.apply_merchant(up.state, _event("b", T0 + 60, merchant_category=5999))
    up = agg.apply_merchant(up.state, _event("c", T0 + 120, merchant_category=None))
    # A late event does not overrule a newer known value.
    up = agg.apply_merchant(up.state, _event("d", T0 + 30, merchant_category=4111))
    assert up.row is not None
    assert up.row["merchant_category"] == 5999 and up.row["merchant_country"] == 276


def test_labels_count_once_reported_and_matured() -> None:
    delay = agg.LABEL_DELAY.total_seconds()
    state = agg.apply_merchant(None, _event("fraud", T0)).state
    # Reported before its transaction arrives: held, then applied.
    pending = agg.apply_label(None, "early", True, T0 + 100)
    assert pending.change is Change.PENDING and pending.row is None
    state2 = agg.apply_merchant(pending.state, _event("early", T0)).state
    assert "early" in state2.labels and not state2.pending

    # Reported 10 days after the transaction (3 days after the delay).
    up = agg.apply_label(state, "fraud", True, T0 + 10 * DAY)
    assert up.change is Change.APPLIED
    up = agg.apply_merchant(up.state, _event("x", T0 + delay + 1))
    assert up.row is not None and up.row["merchant_fraud_rate_28d"] == 0.0  # not reported yet
    up = agg.apply_merchant(up.state, _event("y", T0 + 10 * DAY))
    assert up.row is not None and up.row["merchant_fraud_rate_28d"] == 1.0  # 1 of 1 matured
    # An older report changes nothing; a later legitimate verdict wins.
    assert agg.apply_label(up.state, "fraud", False, T0 + 9 * DAY).change is Change.DUPLICATE
    assert agg.apply_label(up.state, "fraud", True, T0 + 10 * DAY).change is Change.DUPLICATE
    legit = agg.apply_label(up.state, "fraud", False, T0 + 10 * DAY + 1)
    assert legit.change is Change.APPLIED
    up = agg.apply_merchant(legit.state, _event("z", T0 + 10 * DAY + 2))
    assert up.row is not None and up.row["merchant_fraud_rate_28d"] == 0.0
    # A label older than the merchant's horizon is ignored.
    far = agg.apply_merchant(up.state, _event("far", T0 + 60 * DAY)).state
    assert agg.apply_label(far, "gone", True, T0 + 20 * DAY).change is Change.TOO_OLD


def test_a_pending_label_keeps_the_latest_report() -> None:
    state = agg.apply_merchant(None, _event("a", T0)).state
    state = agg.apply_label(state, "p", False, T0 + 2 * DAY).state
    older = agg.apply_label(state, "p", True, T0 + DAY)
    assert older.change is Change.DUPLICATE
    up = agg.apply_merchant(older.state, _event("p", T0 + 60))
    assert up.state.labels["p"].is_fraud is False


def test_pending_labels_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incremental, "MAX_PENDING_LABELS", 2)
    state = agg.apply_merchant(None, _event("a", T0)).state
    for i in range(4):
        state = agg.apply_label(state, f"p{i}", True, T0 + i).state
    assert sorted(state.pending) == ["p2", "p3"] and state.labels_dropped == 2


def test_states_round_trip_through_bytes() -> None:
    card: agg.CardState | None = None
    merchant: agg.MerchantState | None = None
    for i in range(50):
        event = _event(
            f"tx-{i}", T0 + i * 977.5, 100 + i, merchant_id=f"m{i % 4}", is_fraud=i % 7 == 0
        )
        card = agg.apply_card(card, event).state
        merchant = agg.apply_merchant(merchant, replace(event, merchant_id="m1")).state
    assert card is not None and merchant is not None
    merchant = agg.apply_label(merchant, "later", False, T0 + DAY).state
    merchant = agg.apply_label(merchant, "tx-3", False, T0 + DAY).state
    card_bytes, merchant_bytes = card.to_bytes(), merchant.to_bytes()
    assert agg.CardState.from_bytes(card_bytes) == card
    assert agg.MerchantState.from_bytes(merchant_bytes) == merchant
    assert len(card_bytes) < 50 * 40  # ids, times and amounts; merchants interned
    for bad in (b"", b"X1" + card_bytes[2:], card_bytes[:-1], card_bytes + b"\0"):
        with pytest.raises(ValueError):
            agg.CardState.from_bytes(bad)
    with pytest.raises(ValueError):
        agg.MerchantState.from_bytes(card_bytes)


def test_events_need_a_finite_time() -> None:
    with pytest.raises(ValueError, match="not finite"):
        agg.apply_card(None, _event("a", math.nan))
