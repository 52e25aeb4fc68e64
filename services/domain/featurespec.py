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
from collections.abc import Collection, Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple

from services.domain.money import amount_eur, eur_per_unit, minor_per_major

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

CARD_VIEW = "card_features"
"""Feast feature view of the card aggregates (entity ``card``, join key ``card_id``)."""

MERCHANT_VIEW = "merchant_features"
"""Feast feature view of the merchant aggregates (entity ``merchant``, join key ``merchant_id``)."""

TERMINAL_VIEW = "terminal_features"
"""Feast feature view of the terminal aggregates (entity ``terminal``, join key ``terminal_id``)."""

CARD_PRESENT = "card_present"
"""``channel`` of a transaction at a physical terminal."""
CARD_NOT_PRESENT = "card_not_present"
"""``channel`` of an online (e-commerce) transaction."""


class FeatureStatus(IntEnum):
    """Whether a store feature's value can be trusted; numbered as ``fraud.v1.FeatureStatus``."""

    PRESENT = 1
    """Read from the store and fresh."""
    MISSING = 2
    """Unknown entity or a null value."""
    STALE = 3
    """Older than its view's freshness limit."""


class FeatureRead(NamedTuple):
    """One store feature as read: its value, status and event time."""

    value: float | None
    """The stored value; None when missing."""
    status: FeatureStatus
    """Present, missing or stale."""
    event_s: float | None
    """Event time of the stored row (epoch seconds); None when missing."""


MISSING_READ = FeatureRead(None, FeatureStatus.MISSING, None)
"""The read of a feature the store does not hold."""

CARD_FEATURES: tuple[str, ...] = (
    "card_txn_count_1h",
    "card_txn_count_24h",
    "card_txn_count_7d",
    "card_txn_count_30d",
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

RISK_WINDOWS: tuple[str, ...] = ("1d", "7d", "28d")
"""Windows of the fraud rates of merchants and terminals; each ends one label delay ago."""


def _risk(entity: str) -> tuple[str, ...]:
    """Volume over 1 and 7 days, then each window's fraud rate and its number of transactions."""
    names = [f"{entity}_txn_count_1d", f"{entity}_txn_count_7d"]
    for window in RISK_WINDOWS:
        names += [f"{entity}_fraud_rate_{window}", f"{entity}_labelled_txn_count_{window}"]
    return tuple(names)


MERCHANT_FEATURES: tuple[str, ...] = (
    *_risk("merchant"),
    "merchant_amount_mean_28d",
    "merchant_category",
    "merchant_country",
)
"""Merchant aggregates (fraud rates from labels known after a 7-day delay), in view order."""

TERMINAL_FEATURES: tuple[str, ...] = (
    *_risk("terminal"),
    "terminal_known_fraud_first_s",
    "terminal_known_fraud_last_s",
)
"""Terminal aggregates, as the merchant's risk features, then the times (epoch seconds) of the
earliest and the latest fraud its 28-day fraud rate counts (``NO_KNOWN_FRAUD`` while it counts
none); missing when a payment names no terminal. A compromised terminal (a skimmer) shows here
long before its merchant's rates move."""

NO_KNOWN_FRAUD = 0.0
"""A terminal's fraud times while its 28-day fraud rate counts no fraud. The absence of a
fraud is a value, not a missing feature: a known terminal reads every feature present."""

NO_KNOWN_FRAUD_DAYS = 365.0
"""The days since a terminal's known fraud when it has none: beyond any window a fraud rate
counts, so that a tree puts "none" past "long ago"."""

STORE_FEATURES: tuple[str, ...] = CARD_FEATURES + MERCHANT_FEATURES + TERMINAL_FEATURES
"""Every Feast-backed feature, in the order the feature service returns them."""

HELPER_FEATURES: tuple[str, ...] = (
    "card_last_txn_s",
    "card_home_country",
    "merchant_country",
    "terminal_known_fraud_first_s",
    "terminal_known_fraud_last_s",
)
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
    "amount_to_card_mean_30d",
    "amount_to_card_mean_1d",
    "card_mean_7d_to_30d",
    "card_max_7d_to_mean_30d",
    "amount_zscore_30d",
    *(
        f"{entity}_fraud_count_{window}"
        for entity in ("terminal", "merchant")
        for window in RISK_WINDOWS
    ),
)
"""Features derived at request time from the transaction and the store features: the
card's spending pattern (this amount against the card's last day, its recent weeks against
its month, a run of unusually large payments) and the known frauds of the terminal and the
merchant (rate × labelled transactions: a count says "a skimmer was seen here" where a rate
over three payments says little)."""

MODEL_FEATURES: tuple[str, ...] = MODEL_STORE_FEATURES + REQUEST_FEATURES
"""The model's input columns, in order."""

OPTIONAL_FEATURES: tuple[str, ...] = (
    "terminal_days_since_first_known_fraud",
    "terminal_days_since_last_known_fraud",
)
"""Features derived at request time that a version may add but the default inputs leave out:
how long the terminal's known fraud episode has run, the days from the earliest and the
latest fraud its 28-day fraud rate counts to the payment (``NO_KNOWN_FRAUD_DAYS`` while it
counts none).
They raised average precision on the Handbook's data, where a compromised terminal stays so
for four weeks, and not on the default data (docs/training.md)."""

SERVABLE_FEATURES: tuple[str, ...] = MODEL_FEATURES + HELPER_FEATURES + OPTIONAL_FEATURES
"""Every input a version may name, in the order ``model_vector`` computes them with
``helpers``: the model features, then the store's helper features as read, then the optional
derived features. A version's own ``feature_order`` is any selection of these
(``input_positions``)."""

_SERVABLE_AT = {name: i for i, name in enumerate(SERVABLE_FEATURES)}


class UnservableFeatures(ValueError):
    """A feature order names inputs that neither the feature service nor the request gives."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(
            f"no part of the mesh produces {', '.join(repr(n) for n in names)} "
            f"(servable: {len(SERVABLE_FEATURES)} features, docs/architecture.md)"
        )
        self.names = names
        """The unservable names, in the order's order."""


class FeatureChoiceError(ValueError):
    """A feature added to the default inputs is unknown, already one of them, or named twice;
    the message names it and lists what may be added."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(
            f"{name!r} {problem}; a version may add any of "
            f"{', '.join(ADDABLE_FEATURES)} to the {len(MODEL_FEATURES)} default inputs"
        )
        self.name = name
        """The refused name."""


ADDABLE_FEATURES: tuple[str, ...] = tuple(n for n in SERVABLE_FEATURES if n not in MODEL_FEATURES)
"""Servable features a version may take besides the default inputs (``trained_order``)."""


def trained_order(added: Sequence[str]) -> tuple[str, ...]:
    """The input order of a version trained with ``added`` features besides the default ones:
    ``MODEL_FEATURES``, then each added feature in the order given. Raises
    ``FeatureChoiceError`` for a name that is not servable, already a default input, or
    given twice."""
    for i, name in enumerate(added):
        if name in MODEL_FEATURES:
            raise FeatureChoiceError(name, "is already a default input")
        if name not in _SERVABLE_AT:
            raise FeatureChoiceError(name, "is not a servable feature")
        if name in added[:i]:
            raise FeatureChoiceError(name, "is named twice")
    return MODEL_FEATURES + tuple(added)


def input_positions(order: Sequence[str]) -> tuple[int, ...] | None:
    """Where each of ``order``'s inputs sits in ``SERVABLE_FEATURES``: None when ``order`` is
    ``MODEL_FEATURES`` itself (the vector as ``model_vector`` computes it); raises
    ``UnservableFeatures`` naming every input nobody can produce."""
    if tuple(order) == MODEL_FEATURES:
        return None
    unknown = [name for name in order if name not in _SERVABLE_AT]
    if unknown:
        raise UnservableFeatures(unknown)
    return tuple(_SERVABLE_AT[name] for name in order)


def missing_inputs(
    positions: Sequence[int] | None, store: Mapping[str, float | None], amount: float
) -> list[int]:
    """``missing_features`` in a version's own order (``input_positions``): the positions of
    its inputs that took their defaults for this store read and a payment of ``amount``."""
    missing = missing_features(store, amount)
    if positions is None:
        return missing
    at_servable = set(missing)
    for name in HELPER_FEATURES:
        value = store.get(name)
        if value is None or value != value:
            at_servable.add(_SERVABLE_AT[name])
    for name, helper in _EPISODE:
        value = store.get(helper)
        if value is None or value != value:
            at_servable.add(_SERVABLE_AT[name])
    return [j for j, i in enumerate(positions) if i in at_servable]


SMALL_AMOUNT_EUR = 2.0
"""Amounts below this count as small (card testing) in ``card_small_txn_count_1h``."""


def model_vector(
    store: Mapping[str, float | None],
    *,
    amount_minor: int,
    currency: str,
    timestamp_s: float,
    card_not_present: bool,
    defaults: Mapping[str, float],
    helpers: bool = False,
) -> list[float]:
    """The model input in ``MODEL_FEATURES`` order for one transaction (``SERVABLE_FEATURES``
    order with ``helpers``: the helper store features appended as read, then the optional
    derived features).

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

    mean_30d = get("card_amount_mean_30d")
    if mean_30d is not None and mean_30d > 0.0:
        append(amount / mean_30d)
    else:
        append(defaults["amount_to_card_mean_30d"])

    _append_spending(vector, store, amount, defaults)
    _append_fraud_counts(vector, store, defaults)
    if helpers:
        for name in HELPER_FEATURES:
            value = get(name)
            append(defaults[name] if value is None or value != value else float(value))
        for name, helper in _EPISODE:
            at = get(helper)
            if at is None or at != at:
                append(defaults[name])
            elif at <= NO_KNOWN_FRAUD:
                append(NO_KNOWN_FRAUD_DAYS)
            else:
                # A payment stamped before the fraud (clock skew) counts as the same instant.
                append(max(0.0, timestamp_s - at) / 86_400.0)
    return vector


def _append_spending(
    vector: list[float], store: Mapping[str, float | None], amount: float,
    defaults: Mapping[str, float],
) -> None:  # fmt: skip
    """``model_vector``'s card spending-pattern features, appended in order."""
    get = store.get
    append = vector.append
    # The card's mean over its last day with this payment in it: a card without a stored
    # day (new, or missing) has this payment alone, a ratio of 1.
    sum_24h = get("card_amount_sum_24h")
    count_24h = get("card_txn_count_24h")
    day_sum = amount + (0.0 if sum_24h is None or sum_24h != sum_24h else sum_24h)
    day_count = 1.0 + (0.0 if count_24h is None or count_24h != count_24h else count_24h)
    mean_1d = day_sum / day_count
    append(amount / mean_1d if mean_1d > 0.0 else defaults["amount_to_card_mean_1d"])

    mean_7d = get("card_amount_mean_7d")
    mean_30d = get("card_amount_mean_30d")
    # ``mean_30d > 0.0`` is False for NaN; a NaN numerator gives NaN, then the default.
    if mean_30d is not None and mean_30d > 0.0 and mean_7d is not None and mean_7d == mean_7d:
        append(mean_7d / mean_30d)
    else:
        append(defaults["card_mean_7d_to_30d"])
    max_7d = get("card_amount_max_7d")
    if mean_30d is not None and mean_30d > 0.0 and max_7d is not None and max_7d == max_7d:
        append(max_7d / mean_30d)
    else:
        append(defaults["card_max_7d_to_mean_30d"])
    std_30d = get("card_amount_std_30d")
    if mean_30d is not None and mean_30d == mean_30d and std_30d is not None and std_30d > 0.0:
        append((amount - mean_30d) / std_30d)
    else:
        append(defaults["amount_zscore_30d"])


def _append_fraud_counts(
    vector: list[float], store: Mapping[str, float | None], defaults: Mapping[str, float]
) -> None:
    """``model_vector``'s known fraud counts of the terminal and the merchant, in order."""
    for entity in ("terminal", "merchant"):
        for window in RISK_WINDOWS:
            rate = store.get(f"{entity}_fraud_rate_{window}")
            known = store.get(f"{entity}_labelled_txn_count_{window}")
            if rate is None or known is None or rate != rate or known != known:
                vector.append(defaults[f"{entity}_fraud_count_{window}"])
            else:
                vector.append(rate * known)


_EPISODE = (
    ("terminal_days_since_first_known_fraud", "terminal_known_fraud_first_s"),
    ("terminal_days_since_last_known_fraud", "terminal_known_fraud_last_s"),
)
"""The terminal's fraud episode features and the store time each is measured from."""

_STORE_POSITIONS = tuple(enumerate(MODEL_STORE_FEATURES))
_AT = {name: i for i, name in enumerate(MODEL_FEATURES)}


def missing_features(store: Mapping[str, float | None], amount: float) -> list[int]:
    """Positions in ``MODEL_FEATURES`` of the values ``model_vector`` takes from the defaults
    for this store read and a payment of ``amount`` (EUR): where ``model_frame`` (without
    defaults) holds NaN."""
    get = store.get
    missing = []
    for i, name in _STORE_POSITIONS:
        value = get(name)
        if value is None or value != value:
            missing.append(i)
    last = get("card_last_txn_s")
    if last is None or last != last:
        missing.append(_AT["seconds_since_last_txn"])
    mean_7d = get("card_amount_mean_7d")
    if not (mean_7d is not None and mean_7d > 0.0):
        missing.append(_AT["amount_to_card_mean_7d"])
    home, country = get("card_home_country"), get("merchant_country")
    if home is None or country is None or home != home or country != country:
        missing.append(_AT["geo_mismatch"])
    mean_30d = get("card_amount_mean_30d")
    if not (mean_30d is not None and mean_30d > 0.0):
        missing.append(_AT["amount_to_card_mean_30d"])
    missing += _missing_spending(store, amount)
    for entity in ("terminal", "merchant"):
        for window in RISK_WINDOWS:
            rate = get(f"{entity}_fraud_rate_{window}")
            known = get(f"{entity}_labelled_txn_count_{window}")
            if rate is None or known is None or rate != rate or known != known:
                missing.append(_AT[f"{entity}_fraud_count_{window}"])
    return sorted(missing)


def _missing_spending(store: Mapping[str, float | None], amount: float) -> list[int]:
    """``missing_features`` of the card spending-pattern features (``_append_spending``)."""
    get = store.get
    missing = []
    sum_24h, count_24h = get("card_amount_sum_24h"), get("card_txn_count_24h")
    day_sum = amount + (0.0 if sum_24h is None or sum_24h != sum_24h else sum_24h)
    day_count = 1.0 + (0.0 if count_24h is None or count_24h != count_24h else count_24h)
    if not day_sum / day_count > 0.0:
        missing.append(_AT["amount_to_card_mean_1d"])
    mean_7d, mean_30d = get("card_amount_mean_7d"), get("card_amount_mean_30d")
    max_7d, std_30d = get("card_amount_max_7d"), get("card_amount_std_30d")
    usable_30d = mean_30d is not None and mean_30d > 0.0
    if not (usable_30d and mean_7d is not None and mean_7d == mean_7d):
        missing.append(_AT["card_mean_7d_to_30d"])
    if not (usable_30d and max_7d is not None and max_7d == max_7d):
        missing.append(_AT["card_max_7d_to_mean_30d"])
    if not (
        mean_30d is not None and mean_30d == mean_30d and std_30d is not None and std_30d > 0.0
    ):
        missing.append(_AT["amount_zscore_30d"])
    return missing


FRAME_INPUTS: tuple[str, ...] = ("amount_minor", "currency", "timestamp_s", "card_not_present")
"""Transaction columns ``model_frame`` needs besides ``STORE_FEATURES``."""


def model_frame(
    df: pd.DataFrame,
    defaults: Mapping[str, float] | None = None,
    *,
    helpers: bool | Collection[str] = False,
) -> pd.DataFrame:
    """Vectorized ``model_vector``: one row of ``MODEL_FEATURES`` (float64) per row of ``df``
    (``SERVABLE_FEATURES`` with ``helpers``: the helper store features appended as read, then
    the optional derived features; only those it names when ``helpers`` is a collection of
    ``ADDABLE_FEATURES``, in ``SERVABLE_FEATURES`` order, so a version's frame holds no column
    it does not take).

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
    mean_7d, mean_30d = store("card_amount_mean_7d"), store("card_amount_mean_30d")
    with np.errstate(invalid="ignore", divide="ignore"):
        out["amount_to_card_mean_7d"] = np.where(mean_7d > 0.0, amount / mean_7d, np.nan)
        out["amount_to_card_mean_30d"] = np.where(mean_30d > 0.0, amount / mean_30d, np.nan)
    sum_24h, count_24h = store("card_amount_sum_24h"), store("card_txn_count_24h")
    mean_1d = (amount + np.nan_to_num(sum_24h, nan=0.0)) / (1.0 + np.nan_to_num(count_24h, nan=0.0))
    max_7d, std_30d = store("card_amount_max_7d"), store("card_amount_std_30d")
    with np.errstate(invalid="ignore", divide="ignore"):
        out["amount_to_card_mean_1d"] = np.where(mean_1d > 0.0, amount / mean_1d, np.nan)
        # NaN in an input gives NaN, a missing value, as in model_vector.
        out["card_mean_7d_to_30d"] = np.where(mean_30d > 0.0, mean_7d / mean_30d, np.nan)
        out["card_max_7d_to_mean_30d"] = np.where(mean_30d > 0.0, max_7d / mean_30d, np.nan)
        out["amount_zscore_30d"] = np.where(std_30d > 0.0, (amount - mean_30d) / std_30d, np.nan)
    for entity in ("terminal", "merchant"):
        for window in RISK_WINDOWS:
            out[f"{entity}_fraud_count_{window}"] = store(f"{entity}_fraud_rate_{window}") * store(
                f"{entity}_labelled_txn_count_{window}"
            )
    home, country = store("card_home_country"), store("merchant_country")
    out["geo_mismatch"] = np.where(
        np.isnan(home) | np.isnan(country), np.nan, (home != country).astype(np.float64)
    )
    if helpers is True or helpers is False:
        extra = ADDABLE_FEATURES if helpers else ()
    else:
        extra = tuple(n for n in ADDABLE_FEATURES if n in helpers)
    names = MODEL_FEATURES + extra
    if extra:
        for name in HELPER_FEATURES:
            if name in extra:
                out[name] = store(name)
        for name, helper in _EPISODE:
            if name not in extra:
                continue
            at = store(helper)
            out[name] = np.where(
                at <= NO_KNOWN_FRAUD,
                NO_KNOWN_FRAUD_DAYS,
                np.maximum(0.0, timestamp_s - at) / 86_400.0,
            )
    if defaults is not None:
        out = out.fillna({name: float(defaults[name]) for name in names})
    return out[list(names)]


def population_defaults(
    frame: pd.DataFrame, rows: np.ndarray | None = None, names: Sequence[str] = MODEL_FEATURES
) -> dict[str, float]:
    """Median of each of ``names`` over the non-missing values of a ``model_frame`` (of the
    ``rows`` a boolean mask selects, when given; one column is copied at a time)."""
    import pandas as pd

    defaults: dict[str, float] = {}
    for name in names:
        values = frame[name] if rows is None else pd.Series(frame[name].to_numpy()[rows])
        median = float(values.median(skipna=True))
        defaults[name] = 0.0 if math.isnan(median) else median
    return defaults


def model_matrix(
    raw: pd.DataFrame,
    defaults: Mapping[str, float],
    dtype: type = float,
    names: Sequence[str] = MODEL_FEATURES,
) -> np.ndarray:
    """The input matrix of ``names`` (a version's feature order) from a ``model_frame``
    without defaults: missing values filled as ``model_vector`` fills them, column by column
    into one array of ``dtype``."""
    import numpy as np

    out: np.ndarray = np.empty((len(raw), len(names)), dtype=dtype)
    for i, name in enumerate(names):
        column = raw[name].to_numpy(dtype=np.float64)
        out[:, i] = np.where(np.isnan(column), float(defaults[name]), column)
    return out
