"""The model's features, defined once for training (vectorized) and serving (per request).

Store features are aggregates the feature service reads from the Feast online store; a
card's row is its state right after its latest transaction. Request features are derived
from the transaction being scored plus store features. ``model_vector`` (one request,
plain Python) and ``model_frame`` (a training frame, pandas) compute the same values in
the same order, so training and serving cannot drift apart.

Some store features only feed derived features and are not model inputs themselves:
``card_last_txn_s`` (an epoch timestamp, meaningless to the model and not even exact in
float32) feeds ``seconds_since_last_txn``; ``card_home_country`` and ``merchant_country``
(ISO 3166 numeric codes, arbitrary numbers to a tree) feed ``geo_mismatch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from services.common import currency as iso4217

if TYPE_CHECKING:
    import pandas as pd

CARD_VIEW = "card_features"
"""Feast feature view of the card aggregates (entity ``card``, join key ``card_id``)."""

MERCHANT_VIEW = "merchant_features"
"""Feast feature view of the merchant aggregates (entity ``merchant``, join key ``merchant_id``)."""

CARD_FEATURES: tuple[str, ...] = (
    "card_txn_count_1h",
    "card_txn_count_24h",
    "card_txn_count_7d",
    "card_amount_sum_24h",
    "card_amount_mean_7d",
    "card_amount_max_7d",
    "card_amount_mean_30d",
    "card_amount_std_30d",
    "card_distinct_merchants_24h",
    "card_small_txn_count_1h",
    "card_last_txn_s",
    "card_home_country",
)
"""Card aggregates in EUR, each including the card's latest transaction, in view order."""

MERCHANT_FEATURES: tuple[str, ...] = (
    "merchant_txn_count_7d",
    "merchant_amount_mean_28d",
    "merchant_fraud_rate_28d",
    "merchant_category",
    "merchant_country",
)
"""Merchant aggregates (fraud rate from labels known after a 7-day delay), in view order."""

STORE_FEATURES: tuple[str, ...] = CARD_FEATURES + MERCHANT_FEATURES
"""Every Feast-backed feature, in the order the feature service returns them."""

HELPER_FEATURES: tuple[str, ...] = ("card_last_txn_s", "card_home_country", "merchant_country")
"""Store features that only feed derived features and are left out of the model input."""

MODEL_STORE_FEATURES: tuple[str, ...] = tuple(n for n in STORE_FEATURES if n not in HELPER_FEATURES)
"""Store features the model takes as they are."""

REQUEST_FEATURES: tuple[str, ...] = (
    "amount_eur",
    "hour_of_day",
    "is_card_not_present",
    "seconds_since_last_txn",
    "amount_to_card_mean_7d",
    "geo_mismatch",
)
"""Features derived at request time from the transaction and the store features."""

MODEL_FEATURES: tuple[str, ...] = MODEL_STORE_FEATURES + REQUEST_FEATURES
"""The model's input columns, in order."""

SMALL_AMOUNT_EUR = 2.0
"""Amounts below this count as small (card testing) in ``card_small_txn_count_1h``."""

CURRENCY_EXPONENT: dict[str, int] = {
    "EUR": 2, "USD": 2, "GBP": 2, "CHF": 2, "SEK": 2, "NOK": 2, "DKK": 2, "PLN": 2,
    "CZK": 2, "HUF": 2, "RON": 2, "CAD": 2, "AUD": 2, "NZD": 2, "BRL": 2, "MXN": 2,
    "CNY": 2, "HKD": 2, "SGD": 2, "INR": 2, "THB": 2, "TRY": 2, "ZAR": 2, "AED": 2,
    "JPY": 0, "KRW": 0, "ISK": 0, "KWD": 3, "BHD": 3,
}  # fmt: skip
"""Minor-unit exponent (ISO 4217) of every currency with a rate in ``EUR_PER_UNIT``."""

EUR_PER_UNIT: dict[str, float] = {
    "EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.05, "SEK": 0.087, "NOK": 0.086,
    "DKK": 0.134, "PLN": 0.232, "CZK": 0.040, "HUF": 0.0025, "RON": 0.201, "CAD": 0.68,
    "AUD": 0.61, "NZD": 0.56, "BRL": 0.17, "MXN": 0.050, "CNY": 0.127, "HKD": 0.118,
    "SGD": 0.69, "INR": 0.011, "THB": 0.026, "TRY": 0.027, "ZAR": 0.050, "AED": 0.25,
    "JPY": 0.0061, "KRW": 0.00067, "ISK": 0.0066, "KWD": 3.0, "BHD": 2.44,
}  # fmt: skip
"""Fixed conversion rates: EUR per major unit. Frozen so that features never move with markets."""

FALLBACK_EUR_PER_UNIT = 1.0
"""Rate for a valid currency missing from ``EUR_PER_UNIT``: a neutral guess, not a conversion."""

FALLBACK_EXPONENT = 2
"""Exponent for a currency in neither table here nor ISO 4217 (the most common exponent)."""

# Minor units per major unit, precomputed so the request path does no exponentiation.
_MINOR_PER_MAJOR: dict[str, float] = {
    code: float(10**exp) for code, exp in (iso4217.EXPONENT | CURRENCY_EXPONENT).items()
}
_FALLBACK_MINOR_PER_MAJOR = float(10**FALLBACK_EXPONENT)


def minor_per_major(currency: str) -> float:
    """Minor units in one major unit of ``currency`` (100.0 for EUR, 1.0 for JPY)."""
    return _MINOR_PER_MAJOR.get(currency, _FALLBACK_MINOR_PER_MAJOR)


def eur_per_unit(currency: str) -> float:
    """EUR value of one major unit of ``currency``; ``FALLBACK_EUR_PER_UNIT`` if unknown."""
    return EUR_PER_UNIT.get(currency, FALLBACK_EUR_PER_UNIT)


def amount_eur(amount_minor: int, currency: str) -> float:
    """Converts an amount in minor units of ``currency`` to EUR with the fixed rate table."""
    return (
        amount_minor
        / _MINOR_PER_MAJOR.get(currency, _FALLBACK_MINOR_PER_MAJOR)
        * EUR_PER_UNIT.get(currency, FALLBACK_EUR_PER_UNIT)
    )


def model_vector(
    store: Mapping[str, float | None],
    *,
    amount_minor: int,
    currency: str,
    timestamp_s: float,
    card_not_present: bool,
    defaults: Mapping[str, float],
) -> list[float]:
    """The model input in ``MODEL_FEATURES`` order for one transaction.

    ``store`` maps store feature names to values; None (or NaN, or an absent name) marks a
    missing or stale value, replaced by ``defaults[name]``. A derived feature whose inputs
    are missing takes ``defaults[derived_name]``.
    """
    get = store.get
    vector: list[float] = []
    append = vector.append
    for name in MODEL_STORE_FEATURES:
        value = get(name)
        # ``value != value`` is the allocation-free NaN test.
        append(defaults[name] if value is None or value != value else float(value))

    amount = amount_eur(amount_minor, currency)
    append(amount)
    append((timestamp_s // 3600.0) % 24.0)
    append(1.0 if card_not_present else 0.0)

    last = get("card_last_txn_s")
    if last is None or last != last:
        append(defaults["seconds_since_last_txn"])
    else:
        # A transaction stamped before the card's latest one (clock skew) counts as immediate.
        append(max(0.0, timestamp_s - last))

    mean_7d = get("card_amount_mean_7d")
    # The comparison is False for NaN too.
    if mean_7d is not None and mean_7d > 0.0:
        append(amount / mean_7d)
    else:
        append(defaults["amount_to_card_mean_7d"])

    home = get("card_home_country")
    country = get("merchant_country")
    if home is None or country is None or home != home or country != country:
        append(defaults["geo_mismatch"])
    else:
        append(1.0 if home != country else 0.0)
    return vector


FRAME_INPUTS: tuple[str, ...] = ("amount_minor", "currency", "timestamp_s", "card_not_present")
"""Transaction columns ``model_frame`` needs besides ``STORE_FEATURES``."""


def model_frame(df: pd.DataFrame, defaults: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Vectorized ``model_vector``: one row of ``MODEL_FEATURES`` (float64) per row of ``df``.

    ``df`` holds ``STORE_FEATURES`` (NaN where missing or stale) and ``FRAME_INPUTS``
    (``timestamp_s`` as epoch seconds). With ``defaults``, missing values are filled exactly
    as ``model_vector`` fills them; without, they stay NaN (to compute the defaults from).
    """
    import numpy as np
    import pandas as pd

    def store(name: str) -> np.ndarray:
        return df[name].to_numpy(dtype=np.float64, na_value=np.nan)

    out = pd.DataFrame({name: store(name) for name in MODEL_STORE_FEATURES}, index=df.index)
    currencies = df["currency"].astype(str)
    scale = currencies.map(minor_per_major).to_numpy(dtype=np.float64)
    rate = currencies.map(eur_per_unit).to_numpy(dtype=np.float64)
    amount = df["amount_minor"].to_numpy(dtype=np.float64) / scale * rate
    timestamp_s = df["timestamp_s"].to_numpy(dtype=np.float64)
    out["amount_eur"] = amount
    out["hour_of_day"] = (timestamp_s // 3600.0) % 24.0
    out["is_card_not_present"] = df["card_not_present"].to_numpy(dtype=bool).astype(np.float64)
    out["seconds_since_last_txn"] = np.maximum(0.0, timestamp_s - store("card_last_txn_s"))
    mean_7d = store("card_amount_mean_7d")
    with np.errstate(invalid="ignore", divide="ignore"):
        out["amount_to_card_mean_7d"] = np.where(mean_7d > 0.0, amount / mean_7d, np.nan)
    home, country = store("card_home_country"), store("merchant_country")
    out["geo_mismatch"] = np.where(
        np.isnan(home) | np.isnan(country), np.nan, (home != country).astype(np.float64)
    )
    if defaults is not None:
        out = out.fillna({name: float(defaults[name]) for name in MODEL_FEATURES})
    return out[list(MODEL_FEATURES)]


def population_defaults(frame: pd.DataFrame) -> dict[str, float]:
    """Median of each model feature over the non-missing values of a ``model_frame``."""
    defaults: dict[str, float] = {}
    for name in MODEL_FEATURES:
        median = float(frame[name].median(skipna=True))
        defaults[name] = 0.0 if math.isnan(median) else median
    return defaults
