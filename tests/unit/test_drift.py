"""Drift scenarios: reproducible, and each changes what it says and nothing else."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from services.domain import featurespec, money
from services.pipelines import drift, simulate


@pytest.fixture(scope="module")
def history() -> pd.DataFrame:
    sim = simulate.simulate(simulate.SimulationParams(n_customers=300, n_merchants=120, days=10))
    return sim.transactions


def _eur(frame: pd.DataFrame) -> np.ndarray:
    return np.asarray(
        [
            money.amount_eur(int(a), c)
            for a, c in zip(frame["amount_minor"], frame["currency"], strict=True)
        ]
    )


def test_a_seed_gives_the_same_traffic(history: pd.DataFrame) -> None:
    for scenario in drift.SCENARIOS:
        a = drift.traffic(history, scenario, 500, seed=3)
        b = drift.traffic(history, scenario, 500, seed=3)
        pd.testing.assert_frame_equal(a, b)
        assert a["transaction_id"].is_unique
    with pytest.raises(ValueError, match="unknown drift scenario"):
        drift.traffic(history, "weather", 10)


def test_shifted_is_larger_card_not_present_and_abroad(history: pd.DataFrame) -> None:
    base = drift.traffic(history, "none", 2000, seed=1)
    shifted = drift.traffic(history, "shifted", 2000, seed=1)
    ratio = np.median(_eur(shifted) / _eur(base))
    assert 4.9 < ratio < 5.1
    assert (shifted["channel"] == featurespec.CARD_NOT_PRESENT).all()
    country = history.drop_duplicates("merchant_id").set_index("merchant_id")["merchant_country"]
    home = history.drop_duplicates("card_id").set_index("card_id")["card_home_country"]
    abroad = (
        country.loc[shifted["merchant_id"]].to_numpy() != home.loc[shifted["card_id"]].to_numpy()
    )
    assert abroad.all()
    # Untouched: the cards and the time of day.
    assert (shifted["card_id"] == base["card_id"]).all()
    assert (shifted["timestamp"] == base["timestamp"]).all()


def test_dcc_changes_the_request_but_not_the_model_inputs(history: pd.DataFrame) -> None:
    base = drift.traffic(history, "none", 2000, seed=2)
    dcc = drift.traffic(history, "dcc", 2000, seed=2)
    assert (dcc["currency"] != base["currency"]).mean() > 0.9
    # Rounded to the other currency's minor unit: the model's amount moves by half of one.
    half_unit = np.asarray(
        [money.eur_per_unit(c) / money.minor_per_major(c) / 2 for c in dcc["currency"]]
    )
    assert (np.abs(_eur(dcc) - _eur(base)) <= half_unit + 1e-9).all()
    for column in ("card_id", "merchant_id", "terminal_id", "timestamp", "channel"):
        assert (dcc[column] == base[column]).all(), column


def test_new_merchants_are_unknown_and_new_fraud_only_relabels(history: pd.DataFrame) -> None:
    base = drift.traffic(history, "none", 2000, seed=4)
    unknown = drift.traffic(history, "new_merchants", 2000, seed=4)
    assert not unknown["merchant_id"].isin(history["merchant_id"]).any()
    relabelled = drift.traffic(history, "new_fraud", 2000, seed=4)
    assert relabelled["is_fraud"].mean() > base["is_fraud"].mean() + 0.03
    for column in ("card_id", "merchant_id", "amount_minor", "currency", "timestamp", "channel"):
        assert (relabelled[column] == base[column]).all(), column
