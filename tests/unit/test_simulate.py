"""The simulator: determinism, fraud mix, and feature tables that match their definition."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from services.domain import featurespec
from services.featurestore import layout
from services.pipelines import dataset, simulate

END = date(2026, 1, 15)


@pytest.fixture(scope="module")
def sim() -> simulate.Simulation:
    return simulate.simulate(simulate.preset("small", end=END))


@pytest.fixture(scope="module")
def data(sim: simulate.Simulation) -> dataset.Dataset:
    return dataset.Dataset.from_transactions(sim.transactions)


def test_same_seed_gives_identical_frames_and_bytes(
    data: dataset.Dataset, sim: simulate.Simulation, tmp_path: Path
) -> None:
    again = simulate.simulate(simulate.preset("small", end=END))
    pd.testing.assert_frame_equal(sim.transactions, again.transactions)
    again_data = dataset.Dataset.from_transactions(again.transactions)
    pd.testing.assert_frame_equal(data.card_features, again_data.card_features)
    pd.testing.assert_frame_equal(data.merchant_features, again_data.merchant_features)
    first = dataset.write(data, tmp_path / "a")
    second = dataset.write(again_data, tmp_path / "b")
    for name in layout.DATA_FILES:
        assert first[name].read_bytes() == second[name].read_bytes(), name


def test_another_seed_gives_other_data(sim: simulate.Simulation) -> None:
    other = simulate.simulate(simulate.preset("small", seed=8, end=END))
    assert not other.transactions["amount_minor"].equals(sim.transactions["amount_minor"])


def test_small_preset_size_window_and_columns(sim: simulate.Simulation) -> None:
    tx = sim.transactions
    assert 30_000 <= len(tx) <= 50_000
    assert {
        "transaction_id",
        "card_id",
        "merchant_id",
        "terminal_id",
        "amount_minor",
        "currency",
        "timestamp",
        "channel",
        "is_fraud",
        "fraud_scenario",
    } <= set(tx.columns)
    assert tx["transaction_id"].is_unique
    assert str(tx["timestamp"].dt.tz) == "UTC"
    end = pd.Timestamp(END, tz="UTC")
    assert tx["timestamp"].max() < end
    assert tx["timestamp"].min() >= end - pd.Timedelta(days=60)
    assert set(tx["channel"]) == {featurespec.CARD_PRESENT, featurespec.CARD_NOT_PRESENT}
    assert (tx["amount_minor"] > 0).all()
    assert set(tx["currency"]) >= {"EUR", "USD", "GBP", "CHF", "SEK", "JPY"}
    assert tx["timestamp"].is_monotonic_increasing


def test_fraud_is_about_one_percent_with_every_scenario(sim: simulate.Simulation) -> None:
    tx = sim.transactions
    assert 0.007 <= tx["is_fraud"].mean() <= 0.015
    shares = tx["fraud_scenario"].value_counts(normalize=True)
    for scenario, share in simulate.SCENARIOS.items():
        assert share * 0.6 <= shares[scenario] <= share * 1.6, scenario
    assert (tx["is_fraud"] == (tx["fraud_scenario"] != simulate.LEGIT)).all()


def test_scenarios_look_like_their_story(sim: simulate.Simulation) -> None:
    tx = sim.transactions
    hours = tx["timestamp"].dt.hour
    eur = (
        tx["amount_minor"]
        / tx["currency"].map(featurespec.minor_per_major)
        * tx["currency"].map(featurespec.eur_per_unit)
    )
    legit = tx["fraud_scenario"] == simulate.LEGIT
    testing = tx["fraud_scenario"] == "card_testing"
    assert (eur[testing] < featurespec.SMALL_AMOUNT_EUR).mean() > 0.6
    odd = tx["fraud_scenario"] == "odd_hour"
    # Night at home: 00-04 UTC in Europe, later for the few US cardholders.
    assert (hours[odd] < 5).mean() > 0.8
    assert eur[odd].median() > 3 * eur[legit].median()
    assert eur[tx["fraud_scenario"] == "compromised_card"].median() > 3 * eur[legit].median()


def test_card_timestamps_strictly_increase(data: dataset.Dataset, sim: simulate.Simulation) -> None:
    cards = data.card_features
    assert len(cards) == len(sim.transactions)
    same_card = cards["card_id"].to_numpy()[1:] == cards["card_id"].to_numpy()[:-1]
    steps = np.diff(cards["event_timestamp"].astype("int64").to_numpy())
    assert (steps[same_card] > 0).all()
    merchants = data.merchant_features
    assert not merchants.duplicated(["merchant_id", "event_timestamp"]).any()


def test_feature_tables_have_the_spec_columns(
    data: dataset.Dataset, sim: simulate.Simulation
) -> None:
    assert list(data.card_features.columns) == [
        "card_id",
        "event_timestamp",
        *featurespec.CARD_FEATURES,
    ]
    assert list(data.merchant_features.columns) == [
        "merchant_id",
        "event_timestamp",
        *featurespec.MERCHANT_FEATURES,
    ]
    assert not data.card_features.isna().any().any()
    assert not data.merchant_features.isna().any().any()


def _naive_card_row(history: pd.DataFrame, at: pd.Timestamp) -> dict[str, float]:
    """The card aggregates after the transaction at ``at``, by brute force."""

    def window(span: timedelta) -> pd.DataFrame:
        return history[(history["timestamp"] > at - span) & (history["timestamp"] <= at)]

    h1, d1, d7, d30 = (window(timedelta(hours=1)), window(timedelta(days=1)),
                       window(timedelta(days=7)), window(timedelta(days=30)))  # fmt: skip
    return {
        "card_txn_count_1h": len(h1),
        "card_txn_count_24h": len(d1),
        "card_txn_count_7d": len(d7),
        "card_amount_sum_24h": d1["eur"].sum(),
        "card_amount_mean_7d": d7["eur"].mean(),
        "card_amount_max_7d": d7["eur"].max(),
        "card_amount_mean_30d": d30["eur"].mean(),
        "card_amount_std_30d": d30["eur"].std(ddof=0),
        "card_distinct_merchants_24h": d1["merchant_id"].nunique(),
        "card_small_txn_count_1h": int((h1["eur"] < featurespec.SMALL_AMOUNT_EUR).sum()),
        "card_last_txn_s": at.timestamp(),
    }


def test_card_aggregates_match_a_brute_force_computation(
    data: dataset.Dataset, sim: simulate.Simulation
) -> None:
    tx = sim.transactions.copy()
    tx["eur"] = [
        featurespec.amount_eur(int(a), str(c))
        for a, c in zip(tx["amount_minor"], tx["currency"], strict=True)
    ]
    # Busy cards and card-testing victims exercise the windows hardest.
    busiest = tx["card_id"].value_counts().index[:3].tolist()
    tested = tx.loc[tx["fraud_scenario"] == "card_testing", "card_id"].unique()[:2].tolist()
    features = data.card_features.set_index(["card_id", "event_timestamp"])
    for card in busiest + tested:
        history = tx[tx["card_id"] == card]
        for at in history["timestamp"]:
            stored = features.loc[(card, at)]
            for name, value in _naive_card_row(history, at).items():
                assert stored[name] == pytest.approx(value, rel=1e-9, abs=1e-9), (card, at, name)


def test_merchant_fraud_rate_only_uses_labels_a_week_old(
    data: dataset.Dataset, sim: simulate.Simulation
) -> None:
    tx = sim.transactions
    merchants = data.merchant_features
    merchant = tx.loc[tx["fraud_scenario"] == "compromised_terminal", "merchant_id"].iat[0]
    history = tx[tx["merchant_id"] == merchant]
    rows = merchants[merchants["merchant_id"] == merchant]
    for _, row in rows.sample(40, random_state=0, replace=True).iterrows():
        at = row["event_timestamp"]
        known = history[
            (history["timestamp"] > at - pd.Timedelta(days=35))
            & (history["timestamp"] <= at - pd.Timedelta(days=7))
        ]
        expected = known["is_fraud"].mean() if len(known) else 0.0
        assert row["merchant_fraud_rate_28d"] == pytest.approx(expected)
        assert (
            row["merchant_txn_count_7d"]
            == (
                (history["timestamp"] > at - pd.Timedelta(days=7)) & (history["timestamp"] <= at)
            ).sum()
        )


def test_presets_and_validation() -> None:
    assert simulate.preset("small", seed=3).seed == 3
    with pytest.raises(ValueError, match="unknown preset"):
        simulate.preset("huge")
    with pytest.raises(ValueError):
        simulate.simulate(simulate.SimulationParams(n_customers=100, n_merchants=30, days=30))
