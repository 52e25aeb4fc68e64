"""The raw transaction schema, its event form and the windows both aggregation paths share.

The semantics of the windows, rates and codes are in ``docs/aggregation.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from services.domain import money

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# --- the raw transaction schema ---------------------------------------------------------

RAW_COLUMNS: dict[str, str] = {
    "transaction_id": "str: unique id of the transaction",
    "timestamp": "datetime64 UTC: when it happened (microsecond resolution is used)",
    "card_id": "str: the paying card",
    "merchant_id": "str: the accepting merchant",
    "amount_minor": "int64: amount in minor units of currency",
    "currency": "str: ISO 4217 code",
    "channel": "str: card_present or card_not_present",
    "is_fraud": "bool: the transaction's label (missing counts as legitimate in the fraud "
    "rates; training leaves a transaction without a label out of its periods)",
    "fraud_reported_at": "datetime64 UTC, optional: when the label became known "
    "(missing: timestamp + label delay)",
    "terminal_id": "str, optional: the terminal that took the payment (unique across merchants)",
    "card_home_country": "ISO 3166 numeric, optional (missing: null)",
    "merchant_country": "ISO 3166 numeric, optional (missing: null)",
    "merchant_category": "MCC, optional (missing: null)",
}
"""Canonical raw transaction columns and their meaning; the batch path reads these."""

REQUIRED_COLUMNS: tuple[str, ...] = (
    "transaction_id",
    "timestamp",
    "card_id",
    "merchant_id",
    "amount_minor",
    "currency",
    "channel",
    "is_fraud",
)
"""Columns every raw transaction frame has; the others in ``RAW_COLUMNS`` may be absent."""


# --- windows ----------------------------------------------------------------------------

US = 1_000_000
"""Microseconds per second: both paths count time in integer epoch microseconds."""
HOUR_US = 3_600 * US
"""An hour in microseconds."""
DAY_US = 24 * HOUR_US
"""A day in microseconds."""

LABEL_DELAY = timedelta(days=7)
"""Default time between a transaction and the moment its label is known."""
FRAUD_RATE_WINDOW = timedelta(days=28)
"""Longest span of transactions a fraud rate covers, ending one label delay ago."""
RISK_WINDOWS: tuple[tuple[str, timedelta], ...] = (
    ("1d", timedelta(days=1)),
    ("7d", timedelta(days=7)),
    ("28d", FRAUD_RATE_WINDOW),
)
"""Suffix and span of each fraud-rate window of merchants and terminals (longest last)."""
CARD_HORIZON = timedelta(days=30)
"""Longest card window: older card events never count again."""

MAX_CARD_EVENTS = 5_000
"""Most events a card state keeps (a card with more in 30 days is a bot; its windows undercount)."""
MAX_MERCHANT_EVENTS = 50_000
"""Most events a merchant state keeps (~1 500 a day over 35 days); beyond, windows undercount."""
MAX_PENDING_LABELS = 10_000
"""Most labels a merchant state holds for transactions it has not seen yet."""


def micros_of(delta: timedelta) -> int:
    """``delta`` in whole microseconds, exactly (no float on the way)."""
    return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds


CARD_HORIZON_US = micros_of(CARD_HORIZON)
"""``CARD_HORIZON`` in microseconds."""
FRAUD_WINDOW_US = micros_of(FRAUD_RATE_WINDOW)
"""``FRAUD_RATE_WINDOW`` in microseconds."""
LABEL_DELAY_US = micros_of(LABEL_DELAY)
"""``LABEL_DELAY`` in microseconds."""
RISK_WINDOWS_US = tuple((suffix, micros_of(width)) for suffix, width in RISK_WINDOWS)
"""``RISK_WINDOWS`` with spans in microseconds."""


def amounts_eur(tx: pd.DataFrame) -> np.ndarray:
    """EUR value of every row's ``amount_minor`` in its ``currency`` (as ``featurespec.amount_eur``)."""
    import numpy as np
    import pandas as pd

    codes, currencies = pd.factorize(tx["currency"].to_numpy(dtype=object))
    scale = np.array([money.minor_per_major(str(c)) for c in currencies], dtype=np.float64)
    rate = np.array([money.eur_per_unit(str(c)) for c in currencies], dtype=np.float64)
    minor = tx["amount_minor"].to_numpy(dtype=np.int64)
    # The same two operations in the same order as amount_eur, so the bits agree.
    return minor / scale[codes] * rate[codes]


def timestamps_us(values: pd.Series) -> np.ndarray:
    """Epoch microseconds (int64, floored) of a timezone-aware datetime64 column."""
    import numpy as np
    import pandas as pd

    if not isinstance(values.dtype, pd.DatetimeTZDtype):
        raise ValueError(f"{values.name} must be a timezone-aware datetime64 column (UTC)")
    raw = np.asarray(values.array.asi8, dtype=np.int64)
    unit = values.dtype.unit
    if unit == "ns":
        return np.floor_divide(raw, 1_000)
    return raw * {"s": US, "ms": 1_000, "us": 1}[unit]


@dataclass(frozen=True, slots=True)
class TransactionEvent:
    """One transaction as the incremental path takes it (a decision event's request fields)."""

    transaction_id: str
    """Unique id; an id seen twice counts once."""
    timestamp_s: float
    """Epoch seconds (UTC), used at the nearest microsecond."""
    card_id: str
    """The paying card."""
    merchant_id: str
    """The accepting merchant."""
    amount_minor: int
    """Amount in minor units of ``currency``."""
    currency: str
    """ISO 4217 code."""
    channel: str
    """``featurespec.CARD_PRESENT`` or ``CARD_NOT_PRESENT`` (carried for the event's consumers)."""
    card_home_country: int | None = None
    """ISO 3166 numeric code of the card's home country, when known."""
    merchant_country: int | None = None
    """ISO 3166 numeric code of the merchant's country, when known."""
    merchant_category: int | None = None
    """The merchant's MCC, when known."""
    is_fraud: bool | None = None
    """The label when already known (a replay); it counts as reported at time + label delay."""
    terminal_id: str | None = None
    """The terminal that took the payment, when known (``apply_terminal`` keys by it)."""


FeatureRow = dict[str, float]
"""Feature name → value: ints for counts, seconds and codes (NaN when unknown), floats else."""


def event_micros(event: TransactionEvent) -> int:
    """The event's timestamp in epoch microseconds."""
    if not math.isfinite(event.timestamp_s):
        raise ValueError(f"timestamp_s of {event.transaction_id!r} is not finite")
    return round(event.timestamp_s * US)


def events_from_frame(tx: pd.DataFrame) -> Iterator[TransactionEvent]:
    """One ``TransactionEvent`` per row of a raw transaction frame, in the frame's order."""
    import numpy as np

    n = len(tx)
    micros = timestamps_us(tx["timestamp"])

    def optional(name: str) -> list[int | None]:
        if name not in tx.columns:
            return [None] * n
        values = tx[name].to_numpy(dtype=np.float64, na_value=np.nan)
        return [None if v != v else int(v) for v in values.tolist()]

    labels = tx["is_fraud"].tolist()
    if "terminal_id" in tx.columns:
        terminals = [t if isinstance(t, str) and t else None for t in tx["terminal_id"].tolist()]
    else:
        terminals = [None] * n
    columns = zip(
        tx["transaction_id"].tolist(),
        micros.tolist(),
        tx["card_id"].tolist(),
        tx["merchant_id"].tolist(),
        tx["amount_minor"].tolist(),
        tx["currency"].tolist(),
        tx["channel"].tolist(),
        optional("card_home_country"),
        optional("merchant_country"),
        optional("merchant_category"),
        labels,
        terminals,
        strict=True,
    )
    for (
        tid,
        t_us,
        card,
        merchant,
        minor,
        currency,
        channel,
        home,
        country,
        mcc,
        label,
        terminal,
    ) in columns:
        yield TransactionEvent(
            transaction_id=str(tid),
            timestamp_s=t_us / US,
            card_id=str(card),
            merchant_id=str(merchant),
            amount_minor=int(minor),
            currency=str(currency),
            channel=str(channel),
            card_home_country=home,
            merchant_country=country,
            merchant_category=mcc,
            is_fraud=None if label is None or label != label else bool(label),
            terminal_id=terminal,
        )
