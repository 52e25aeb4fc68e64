"""Checking and normalizing one batch of an import: every row against serving's rules.

``normalize`` turns a batch of the file's columns (any Arrow types: text, numbers, dates,
timestamps) into the canonical raw schema (``ARROW_TYPES``) and gives each row the first
reason it fails for (None: the row is fine). Ids follow ``domain.validation``, currencies
``domain.money``; amounts become minor units of their currency, timestamps UTC microseconds,
labels booleans, missing optional values their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from services.domain import featurespec, money
from services.domain.validation import id_problem
from services.pipelines.dataimport.schema import DEFAULT_CHANNEL, DEFAULT_CURRENCY

CODES = ("card_home_country", "merchant_country", "merchant_category")
"""Optional numeric codes (ISO 3166 numeric countries, MCC)."""
_MAX_CODE = 9_999
# A zone after the time of day: Z, ±HH, ±HHMM or ±HH:MM.
_ZONE = r"[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"
# Plausible epoch seconds: 1970 up to 2200. Milliseconds would be far beyond it.
_MAX_EPOCH_S = 7_258_118_400
_STRING = pa.string()
_TIME = pa.timestamp("us", tz="UTC")
ARROW_TYPES: dict[str, pa.DataType] = {
    "transaction_id": _STRING,
    "timestamp": _TIME,
    "card_id": _STRING,
    "merchant_id": _STRING,
    "amount_minor": pa.int64(),
    "currency": _STRING,
    "channel": _STRING,
    "is_fraud": pa.bool_(),
    "fraud_reported_at": _TIME,
    "terminal_id": _STRING,
    **dict.fromkeys(CODES, pa.int64()),
    "fraud_scenario": _STRING,
}
"""The canonical raw schema: column → Arrow type of the accepted rows."""
ROW = "__row"
"""Column of each accepted row's position in the file (kept until the checks end)."""


class Reasons:
    """The first reason each row of a batch fails for (None: the row is fine so far)."""

    def __init__(self, n: int) -> None:
        self.values = np.full(n, None, dtype=object)

    def flag(self, mask: np.ndarray, reason: str) -> None:
        self.values[mask & pd.isna(self.values)] = reason


def normalize(
    batch: Mapping[str, pa.Array], columns: Mapping[str, str]
) -> tuple[pd.DataFrame, np.ndarray]:
    """One batch in the canonical raw schema (accepted rows only) and each row's reason."""
    n = len(next(iter(batch.values())))
    reasons = Reasons(n)
    out: dict[str, np.ndarray | pd.api.extensions.ExtensionArray] = {}
    for name in ("transaction_id", "card_id", "merchant_id"):
        out[name] = _ids(batch[name], name, reasons, required=True)
    out["timestamp"] = _times(batch["timestamp"], "timestamp", reasons, required=True)

    currency = (
        _text(batch["currency"]) if "currency" in batch else pd.Series([None] * n, dtype=object)
    )
    currency = currency.where(currency.notna() & (currency != ""), DEFAULT_CURRENCY)
    known = {c: money.is_known(c) for c in pd.unique(currency)}
    reasons.flag(~currency.map(known).to_numpy(dtype=bool), "unknown currency")
    out["currency"] = currency.to_numpy(dtype=object)
    out["amount_minor"] = _amounts(batch, currency, reasons)

    if "channel" in batch:
        channel = _text(batch["channel"]).str.strip().str.lower()
        channel = channel.where(channel.notna() & (channel != ""), DEFAULT_CHANNEL)
        valid = channel.isin([featurespec.CARD_PRESENT, featurespec.CARD_NOT_PRESENT])
        reasons.flag(~valid.to_numpy(dtype=bool), "unknown channel")
        out["channel"] = channel.to_numpy(dtype=object)
    else:
        out["channel"] = np.full(n, DEFAULT_CHANNEL, dtype=object)
    out["is_fraud"] = _labels(batch["is_fraud"], reasons)
    if "fraud_reported_at" in batch:
        out["fraud_reported_at"] = _times(
            batch["fraud_reported_at"], "fraud_reported_at", reasons, required=False
        )
    if "terminal_id" in batch:
        out["terminal_id"] = _ids(batch["terminal_id"], "terminal_id", reasons, required=False)
    for name in CODES:
        if name in batch:
            out[name] = _codes(batch[name], name, reasons)
    if "fraud_scenario" in batch:
        scenario = _text(batch["fraud_scenario"])
        out["fraud_scenario"] = scenario.where(scenario != "", None).to_numpy(dtype=object)
    ok = pd.isna(reasons.values)
    frame = pd.DataFrame({name: values[ok] for name, values in out.items()})
    return frame, reasons.values


def _text(array: pa.Array) -> pd.Series:
    """Any column as text (integers as their digits); nulls as None."""
    if not pa.types.is_string(array.type) and not pa.types.is_large_string(array.type):
        if pa.types.is_floating(array.type):
            # 12.0 → "12": float ids come from integer columns with nulls.
            as_int = pc.cast(array, pa.int64(), safe=False)
            exact = pc.equal(pc.cast(as_int, array.type), array)
            array = pc.if_else(exact, pc.cast(as_int, _STRING), pc.cast(array, _STRING))
        else:
            array = pc.cast(array, _STRING)
    return pd.Series(array.to_pandas(), dtype=object)


def _ids(array: pa.Array, name: str, reasons: Reasons, *, required: bool) -> np.ndarray:
    """An id column checked with serving's rule (``validation.id_problem``)."""
    values = _text(array)
    missing = (values.isna() | (values == "")).to_numpy()
    if required:
        reasons.flag(missing, f"missing {name}")
    problems = {v: id_problem(v) for v in pd.unique(values[~missing])}
    found = values.map(problems)
    for problem in pd.unique(found.dropna()):
        reasons.flag((found == problem).to_numpy(), f"{name} {problem}")
    out = values.to_numpy(dtype=object)
    out[missing] = None
    return out


def _times(
    array: pa.Array, name: str, reasons: Reasons, *, required: bool
) -> pd.api.extensions.ExtensionArray:
    """UTC timestamps (microseconds) from timestamps, dates, epoch seconds or ISO 8601 text."""
    n = len(array)
    micros = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    kind = array.type
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        # Zone-aware values are stored in UTC already; naive ones are taken as UTC.
        target = pa.timestamp("us", tz=kind.tz) if pa.types.is_timestamp(kind) else None
        cast = pc.cast(array, target or pa.timestamp("us"), safe=False)
        as_int = pc.cast(cast, pa.int64())
        valid = ~np.asarray(pc.is_null(as_int).to_numpy(zero_copy_only=False), dtype=bool)
        micros = np.asarray(pc.fill_null(as_int, 0).to_numpy(), dtype=np.int64)
        missing = ~valid
    else:
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            seconds = pd.Series(array.to_pandas(), dtype=np.float64)
            text = None
        else:
            text = _text(array).str.strip()
            seconds = pd.to_numeric(text, errors="coerce")
        missing = seconds.isna().to_numpy()
        if text is not None:
            missing = (text.isna() | (text == "")).to_numpy()
        numeric = seconds.notna().to_numpy()
        in_range = numeric & (seconds.abs() < _MAX_EPOCH_S).to_numpy()
        micros[in_range] = np.round(seconds.to_numpy()[in_range] * 1e6).astype(np.int64)
        valid |= in_range
        reasons.flag(numeric & ~in_range, f"{name} out of range (epoch seconds expected)")
        if text is not None:
            iso = ~numeric & ~missing
            if iso.any():
                # Zoned and naive text apart: in one call pandas reads a naive value after a
                # zoned one in that zone, where naive means UTC here.
                zoned = text.str.contains(_ZONE, regex=True, na=False).to_numpy()
                for group in (iso & zoned, iso & ~zoned):
                    if not group.any():
                        continue
                    parsed = pd.to_datetime(
                        text[group], format="ISO8601", utc=True, errors="coerce"
                    )
                    good = parsed.notna().to_numpy()
                    stamps = parsed[good].astype("datetime64[us, UTC]")
                    rows = np.flatnonzero(group)
                    micros[rows[good]] = stamps.array.asi8
                    valid[rows[good]] = True
    if required:
        reasons.flag(missing, f"missing {name}")
    reasons.flag(~valid & ~missing, f"unparseable {name}")
    values = pd.Series(pd.to_datetime(micros, unit="us", utc=True)).astype("datetime64[us, UTC]")
    return values.where(valid).array


def _amounts(batch: Mapping[str, pa.Array], currency: pd.Series, reasons: Reasons) -> np.ndarray:
    """Amounts in minor units of each row's currency, whole and not negative."""
    if "amount_minor" in batch:
        column, name = batch["amount_minor"], "amount_minor"
        value = _numbers(column)
        scaled = value.to_numpy()
    else:
        column, name = batch["amount"], "amount"
        value = _numbers(column)
        scale = currency.map(money.minor_per_major).to_numpy(dtype=np.float64)
        # Major units to the nearest minor unit (12.345 EUR → 1235 cents, within rounding).
        scaled = np.round(value.to_numpy() * scale)
    missing = _absent(column)
    reasons.flag(missing, f"missing {name}")
    finite = np.isfinite(scaled)
    reasons.flag(~finite & ~missing, f"unparseable {name}")
    whole = finite & (np.floor(scaled) == scaled)
    reasons.flag(finite & ~whole, f"{name} is not a whole number of minor units")
    # Zero is an account verification (and a card tester's favourite): traffic, kept.
    reasons.flag(whole & (scaled < 0), f"negative {name}")
    reasons.flag(whole & (scaled >= 2.0**62), f"{name} too large")
    ok = whole & (scaled >= 0) & (scaled < 2.0**62)
    return np.where(ok, scaled, 0).astype(np.int64)


def _numbers(array: pa.Array) -> pd.Series:
    """Numbers (NaN where absent or not a number)."""
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        return pd.Series(array.to_pandas(), dtype=np.float64)
    if pa.types.is_decimal(array.type):
        return pd.Series(pc.cast(array, pa.float64()).to_pandas(), dtype=np.float64)
    return pd.to_numeric(_text(array).str.strip(), errors="coerce").astype(np.float64)


def _absent(array: pa.Array) -> np.ndarray:
    """Null or empty cells."""
    nulls = np.asarray(pc.is_null(array).to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_string(array.type):
        empty = np.asarray(
            pc.fill_null(pc.equal(pc.utf8_trim_whitespace(array), ""), False).to_numpy(
                zero_copy_only=False
            ),
            dtype=bool,
        )
        return nulls | empty
    return nulls


_TRUE = frozenset({"1", "true", "t", "yes", "y", "1.0"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "0.0"})


def _labels(array: pa.Array, reasons: Reasons) -> np.ndarray:
    """is_fraud as booleans from 0/1 or true/false (any case)."""
    if pa.types.is_boolean(array.type):
        reasons.flag(_absent(array), "missing is_fraud")
        return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)
    text = _text(array).str.strip().str.lower()
    missing = (text.isna() | (text == "")).to_numpy()
    truth = text.isin(_TRUE).to_numpy()
    falsity = text.isin(_FALSE).to_numpy()
    reasons.flag(missing, "missing is_fraud")
    reasons.flag(~truth & ~falsity & ~missing, "is_fraud is not 0/1 or true/false")
    return truth


def _codes(array: pa.Array, name: str, reasons: Reasons) -> pd.arrays.IntegerArray:
    """An optional numeric code (ISO 3166 numeric, MCC): whole, 0 to 9999; null where absent."""
    value = _numbers(array)
    missing = _absent(array)
    v = value.to_numpy()
    good = np.isfinite(v) & (np.floor(v) == v) & (v >= 0) & (v <= _MAX_CODE)
    reasons.flag(~good & ~missing, f"{name} is not a code from 0 to {_MAX_CODE}")
    return pd.arrays.IntegerArray(np.where(good, v, 0).astype(np.int64), ~good)
