"""The feature spec: names and order, defaults, scalar = vectorized, statuses as in the proto."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from services.domain import featurespec as fs

CURRENCIES = ["EUR", "USD", "GBP", "CHF", "SEK", "JPY", "KWD", "NGN", "JOD"]


def defaults() -> dict[str, float]:
    """Distinctive defaults, so a test can tell which one was used."""
    return {name: 1000.0 + i for i, name in enumerate(fs.MODEL_FEATURES)}


def test_model_features_are_store_features_then_request_features() -> None:
    assert fs.MODEL_FEATURES == fs.MODEL_STORE_FEATURES + fs.REQUEST_FEATURES
    assert len(set(fs.MODEL_FEATURES)) == len(fs.MODEL_FEATURES)
    assert fs.STORE_FEATURES == fs.CARD_FEATURES + fs.MERCHANT_FEATURES + fs.TERMINAL_FEATURES
    assert set(fs.HELPER_FEATURES) <= set(fs.STORE_FEATURES)
    assert not set(fs.HELPER_FEATURES) & set(fs.MODEL_FEATURES)


def test_missing_store_features_take_defaults() -> None:
    d = defaults()
    vector = fs.model_vector(
        {},
        amount_minor=5000,
        currency="EUR",
        timestamp_s=1_700_000_000.0,
        card_not_present=True,
        defaults=d,
    )
    named = dict(zip(fs.MODEL_FEATURES, vector, strict=True))
    for name in fs.MODEL_STORE_FEATURES:
        assert named[name] == d[name]
    # Derived from missing inputs: their own defaults.
    for name in (
        "seconds_since_last_txn",
        "amount_to_card_mean_7d",
        "geo_mismatch",
        "amount_to_card_mean_30d",
        "card_mean_7d_to_30d",
        "card_max_7d_to_mean_30d",
        "amount_zscore_30d",
        "terminal_fraud_count_1d",
        "merchant_fraud_count_28d",
    ):
        assert named[name] == d[name]
    # Derived from the transaction alone: always computed. A card without a stored day has
    # this payment alone in it.
    assert named["amount_to_card_mean_1d"] == 1.0
    assert named["amount_eur"] == 50.0
    assert named["hour_of_day"] == 22.0  # 2023-11-14 22:13:20 UTC
    assert named["is_card_not_present"] == 1.0


def test_present_store_features_and_derived_values() -> None:
    store: dict[str, float | None] = {
        name: float(i + 1) for i, name in enumerate(fs.STORE_FEATURES)
    }
    store.update(
        card_last_txn_s=1_700_000_000.0 - 90.0,
        card_amount_mean_7d=25.0,
        card_amount_mean_30d=50.0,
        card_home_country=276.0,
        merchant_country=840.0,
    )
    vector = fs.model_vector(
        store,
        amount_minor=10_000,
        currency="EUR",
        timestamp_s=1_700_000_000.0,
        card_not_present=False,
        defaults=defaults(),
    )
    named = dict(zip(fs.MODEL_FEATURES, vector, strict=True))
    for name in fs.MODEL_STORE_FEATURES:
        assert named[name] == store[name]
    assert named["seconds_since_last_txn"] == 90.0
    assert named["amount_to_card_mean_7d"] == 4.0
    assert named["amount_to_card_mean_30d"] == 2.0
    assert named["geo_mismatch"] == 1.0
    assert named["is_card_not_present"] == 0.0


def test_spending_pattern_and_known_fraud_counts() -> None:
    store: dict[str, float | None] = {
        "card_amount_sum_24h": 60.0,
        "card_txn_count_24h": 2.0,
        "card_amount_mean_7d": 30.0,
        "card_amount_max_7d": 90.0,
        "card_amount_mean_30d": 20.0,
        "card_amount_std_30d": 16.0,
        "terminal_fraud_rate_7d": 0.25,
        "terminal_labelled_txn_count_7d": 12.0,
        "merchant_fraud_rate_1d": 0.0,
        "merchant_labelled_txn_count_1d": 0.0,
    }
    vector = fs.model_vector(
        store,
        amount_minor=10_000,
        currency="EUR",
        timestamp_s=1_700_000_000.0,
        card_not_present=False,
        defaults=defaults(),
    )
    named = dict(zip(fs.MODEL_FEATURES, vector, strict=True))
    # 100 against the day's (60 + 100) / 3.
    assert named["amount_to_card_mean_1d"] == 100.0 / (160.0 / 3.0)
    assert named["card_mean_7d_to_30d"] == 1.5
    assert named["card_max_7d_to_mean_30d"] == 4.5
    assert named["amount_zscore_30d"] == 5.0
    assert named["terminal_fraud_count_7d"] == 3.0
    # No labelled payment yet: no known fraud, not a missing value.
    assert named["merchant_fraud_count_1d"] == 0.0


def test_nan_counts_as_missing_and_clock_skew_as_zero() -> None:
    d = defaults()
    store = {
        "card_txn_count_1h": math.nan,
        "card_last_txn_s": 1_700_000_100.0,  # after the transaction
        "card_amount_mean_7d": 0.0,  # no usable mean
        "card_home_country": 276.0,
        "merchant_country": math.nan,
    }
    vector = fs.model_vector(
        store,
        amount_minor=100,
        currency="EUR",
        timestamp_s=1_700_000_000.0,
        card_not_present=False,
        defaults=d,
    )
    named = dict(zip(fs.MODEL_FEATURES, vector, strict=True))
    assert named["card_txn_count_1h"] == d["card_txn_count_1h"]
    assert named["seconds_since_last_txn"] == 0.0
    assert named["amount_to_card_mean_7d"] == d["amount_to_card_mean_7d"]
    assert named["geo_mismatch"] == d["geo_mismatch"]


def _sample(n: int, seed: int) -> pd.DataFrame:
    """Random transactions with store features, about a fifth of each missing."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            name: np.where(rng.random(n) < 0.2, np.nan, rng.lognormal(2.0, 1.5, n))
            for name in fs.STORE_FEATURES
        }
    )
    countries = np.array([276.0, 250.0, 840.0, 392.0])
    for name in ("card_home_country", "merchant_country"):
        frame[name] = np.where(rng.random(n) < 0.2, np.nan, rng.choice(countries, n))
    for name in ("card_amount_mean_7d", "card_amount_mean_30d", "card_amount_std_30d"):
        frame[name] = np.where(rng.random(n) < 0.05, 0.0, frame[name])
    for name in ("card_amount_sum_24h", "card_txn_count_24h"):
        frame[name] = np.where(rng.random(n) < 0.05, 0.0, frame[name])
    timestamp_s = 1_790_000_000.0 + rng.integers(0, 90 * 86_400, n)
    frame["timestamp_s"] = timestamp_s
    frame["card_last_txn_s"] = np.where(
        rng.random(n) < 0.2, np.nan, timestamp_s - rng.integers(-60, 40 * 86_400, n)
    )
    # A terminal's fraud times: missing, none counted (a value), or some days before.
    first = timestamp_s - rng.integers(7 * 86_400, 35 * 86_400, n)
    episode = rng.choice(["missing", "none", "known"], n, p=[0.2, 0.4, 0.4])
    for name, at in (("first", first), ("last", first + rng.integers(0, 7 * 86_400, n))):
        frame[f"terminal_known_fraud_{name}_s"] = np.select(
            [episode == "missing", episode == "none"], [np.nan, fs.NO_KNOWN_FRAUD], at
        )
    # Some zero amounts (account verifications), also against a card mean of zero.
    frame["amount_minor"] = np.where(rng.random(n) < 0.05, 0, rng.integers(1, 5_000_000, n))
    frame["currency"] = rng.choice(CURRENCIES, n)
    frame["card_not_present"] = rng.random(n) < 0.3
    return frame


def test_vectorized_frame_equals_model_vector_row_by_row() -> None:
    sample = _sample(3000, seed=1)
    raw = fs.model_frame(sample)
    d = fs.population_defaults(raw)
    frame = fs.model_frame(sample, d)
    assert list(frame.columns) == list(fs.MODEL_FEATURES)
    assert not frame.isna().any().any()
    store_columns = sample[list(fs.STORE_FEATURES)]
    for i, row in enumerate(store_columns.itertuples(index=False)):
        store = {
            name: None if math.isnan(value) else value
            for name, value in zip(fs.STORE_FEATURES, row, strict=True)
        }
        expected = fs.model_vector(
            store,
            amount_minor=int(sample["amount_minor"].iat[i]),
            currency=str(sample["currency"].iat[i]),
            timestamp_s=float(sample["timestamp_s"].iat[i]),
            card_not_present=bool(sample["card_not_present"].iat[i]),
            defaults=d,
        )
        # Same arithmetic in the same order: equal to the last bit, not just close.
        assert frame.iloc[i].tolist() == expected, f"row {i} differs"


def test_missing_features_are_where_the_frame_holds_nan() -> None:
    sample = _sample(2000, seed=4)
    frame = fs.model_frame(sample)
    raw, amounts = frame.to_numpy(), frame["amount_eur"].to_numpy()
    store_columns = sample[list(fs.STORE_FEATURES)]
    for i, row in enumerate(store_columns.itertuples(index=False)):
        store = {
            name: None if math.isnan(value) else value
            for name, value in zip(fs.STORE_FEATURES, row, strict=True)
        }
        assert (
            fs.missing_features(store, float(amounts[i]))
            == np.flatnonzero(np.isnan(raw[i])).tolist()
        ), i
    # A payment of a card with no stored day is that day's mean: only a zero amount has none.
    computed = ("amount_eur", "hour_of_day", "is_card_not_present")
    assert fs.missing_features({}, 10.0) == [
        i for i, name in enumerate(fs.MODEL_FEATURES)
        if name not in (*computed, "amount_to_card_mean_1d")
    ]  # fmt: skip
    assert fs.missing_features({}, 0.0) == [
        i for i, name in enumerate(fs.MODEL_FEATURES) if name not in computed
    ]


def test_model_matrix_fills_as_model_frame_does() -> None:
    sample = _sample(2000, seed=3)
    raw = fs.model_frame(sample)
    rows = np.arange(len(sample)) % 3 != 0
    d = fs.population_defaults(raw, rows=rows)
    assert d == fs.population_defaults(raw[rows])
    want = fs.model_frame(sample, d).to_numpy(dtype=np.float32)
    assert np.array_equal(fs.model_matrix(raw, d, np.float32), want)


def test_a_trained_order_is_the_default_inputs_then_the_added_ones() -> None:
    assert fs.trained_order(()) == fs.MODEL_FEATURES
    added = ("merchant_country", "card_home_country")
    assert fs.trained_order(added) == (*fs.MODEL_FEATURES, *added)
    assert set(fs.ADDABLE_FEATURES) == set(fs.SERVABLE_FEATURES) - set(fs.MODEL_FEATURES)


@pytest.mark.parametrize(
    ("added", "problem"),
    [
        (("shoe_size",), "'shoe_size' is not a servable feature"),
        (("merchant_country", "amount_eur"), "'amount_eur' is already a default input"),
        (("merchant_country", "merchant_country"), "'merchant_country' is named twice"),
    ],
)
def test_a_refused_added_feature_is_named_with_what_may_be_added(
    added: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(fs.FeatureChoiceError) as caught:
        fs.trained_order(added)
    message = str(caught.value)
    assert message.startswith(problem), message
    assert caught.value.name == problem.split("'")[1]
    for name in fs.ADDABLE_FEATURES:
        assert name in message


def test_the_frame_with_helpers_equals_model_vector_with_helpers_row_by_row() -> None:
    sample = _sample(1500, seed=5)
    raw = fs.model_frame(sample, helpers=True)
    assert list(raw.columns) == list(fs.SERVABLE_FEATURES)
    # The helper columns are the store's values as read, NaN where missing.
    for name in fs.HELPER_FEATURES:
        assert np.array_equal(raw[name].to_numpy(), sample[name].to_numpy(), equal_nan=True)
    assert raw[list(fs.MODEL_FEATURES)].equals(fs.model_frame(sample))
    # A version's own frame: the default inputs and the addable features it names.
    named = ("terminal_days_since_last_known_fraud", "card_home_country")
    subset = fs.model_frame(sample, helpers=named)
    assert list(subset.columns) == [*fs.MODEL_FEATURES, "card_home_country", named[0]]
    assert subset.equals(raw[list(subset.columns)])
    order = fs.trained_order(
        ("merchant_country", "terminal_days_since_last_known_fraud", "card_home_country")
    )
    d = fs.population_defaults(raw, names=order)
    assert set(d) == set(order)
    matrix = fs.model_matrix(raw, d, np.float64, names=order)
    store_columns = sample[list(fs.STORE_FEATURES)]
    for i, row in enumerate(store_columns.itertuples(index=False)):
        store = {
            name: None if math.isnan(value) else value
            for name, value in zip(fs.STORE_FEATURES, row, strict=True)
        }
        computed = fs.model_vector(
            store,
            amount_minor=int(sample["amount_minor"].iat[i]),
            currency=str(sample["currency"].iat[i]),
            timestamp_s=float(sample["timestamp_s"].iat[i]),
            card_not_present=bool(sample["card_not_present"].iat[i]),
            defaults={name: 0.0 for name in fs.SERVABLE_FEATURES} | d,
            helpers=True,
        )
        named = dict(zip(fs.SERVABLE_FEATURES, computed, strict=True))
        # Training's row in the version's order is serving's vector picked by name.
        assert matrix[i].tolist() == [named[name] for name in order], f"row {i} differs"


def test_population_defaults_are_medians_of_present_values() -> None:
    raw = fs.model_frame(_sample(500, seed=2))
    d = fs.population_defaults(raw)
    assert set(d) == set(fs.MODEL_FEATURES)
    assert d["card_txn_count_1h"] == raw["card_txn_count_1h"].dropna().median()


def test_feature_status_numbers_are_the_protos() -> None:
    from fraud.v1 import features_pb2

    for status in fs.FeatureStatus:
        assert features_pb2.FeatureStatus.Value(f"FEATURE_STATUS_{status.name}") == status


def test_the_terminal_episode_is_the_days_since_its_known_frauds_and_only_on_request() -> None:
    now = 1_790_000_000.0
    store = {
        "terminal_known_fraud_first_s": now - 3 * 86_400,
        "terminal_known_fraud_last_s": now - 43_200,
    }
    defaults = {name: -1.0 for name in fs.SERVABLE_FEATURES}
    payment = {
        "amount_minor": 1_000,
        "currency": "EUR",
        "timestamp_s": now,
        "card_not_present": False,
    }
    default_inputs = fs.model_vector(store, defaults=defaults, **payment)
    assert len(default_inputs) == len(fs.MODEL_FEATURES)  # not a default input
    named = dict(
        zip(
            fs.SERVABLE_FEATURES,
            fs.model_vector(store, defaults=defaults, helpers=True, **payment),
            strict=True,
        )
    )
    assert named["terminal_days_since_first_known_fraud"] == 3.0
    assert named["terminal_days_since_last_known_fraud"] == 0.5
    # A terminal whose 28-day rate counts no fraud has no times: the version's defaults.
    named = dict(
        zip(
            fs.SERVABLE_FEATURES,
            fs.model_vector({}, defaults=defaults, helpers=True, **payment),
            strict=True,
        )
    )
    assert named["terminal_days_since_first_known_fraud"] == -1.0
    # One whose rate counts none has the times of none: a value, beyond any window.
    none = {helper: fs.NO_KNOWN_FRAUD for _, helper in fs._EPISODE}
    named = dict(
        zip(
            fs.SERVABLE_FEATURES,
            fs.model_vector(none, defaults=defaults, helpers=True, **payment),
            strict=True,
        )
    )
    assert named["terminal_days_since_first_known_fraud"] == fs.NO_KNOWN_FRAUD_DAYS
    assert named["terminal_days_since_last_known_fraud"] == fs.NO_KNOWN_FRAUD_DAYS
    order = fs.trained_order(
        ("terminal_days_since_first_known_fraud", "terminal_days_since_last_known_fraud")
    )
    positions = fs.input_positions(order)
    assert fs.missing_inputs(positions, {}, 10.0)[-2:] == [len(order) - 2, len(order) - 1]
    assert len(order) - 1 not in fs.missing_inputs(positions, store, 10.0)
    assert len(order) - 1 not in fs.missing_inputs(positions, none, 10.0)
    assert "terminal_days_since_last_known_fraud" in fs.ADDABLE_FEATURES
