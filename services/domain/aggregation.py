"""Card and merchant feature aggregation, defined once: a batch path and an incremental path.

The batch path (``card_feature_table``, ``merchant_feature_table``) turns a frame of raw
transactions (``RAW_COLUMNS``) into the tables the offline store serves: one row per
(entity, timestamp) holding the entity's aggregates right after every transaction of that
instant, columns ``card_id|merchant_id``, ``event_timestamp``, then
``featurespec.CARD_FEATURES`` / ``featurespec.MERCHANT_FEATURES`` in order; terminals
(``terminal_feature_table``, rows of transactions that name one) the same with
``terminal_id`` and ``featurespec.TERMINAL_FEATURES``. The incremental path (``apply_card``,
``apply_merchant``, ``apply_terminal``, ``apply_label``, ``apply_terminal_label``) keeps a
small state per entity and returns, for every event, the entity's row as of its newest
transaction: the same row the batch table holds at that (entity, timestamp).

Semantics shared by both paths:

* Amounts are in EUR, converted exactly as serving converts them (``featurespec.amount_eur``).
* Windows are half-open, ``(t - width, t]``, at microsecond resolution; a card row includes
  the card's own transactions at ``t``. Card windows: 1 h, 24 h, 7 d, 30 d; merchant and
  terminal volume windows: 1 d, 7 d (merchants also 28 d for the mean amount).
* Risk (merchants and terminals): ``*_fraud_rate_<w>`` at ``t`` covers the entity's
  transactions in ``(t - delay - w, t - delay]`` for ``w`` in 1 d, 7 d, 28 d (``delay`` =
  ``LABEL_DELAY`` unless given): frauds among them whose label was reported by ``t``, over
  all of them (``*_labelled_txn_count_<w>``, which tells how much evidence the rate rests
  on); 0 when there are none. A label is reported at ``fraud_reported_at``, by default the
  transaction time plus the delay, so by default every fraud in those windows counts
  (chargebacks reveal fraud about a week late, and training must not see labels serving
  cannot know).
* ``card_home_country``, ``merchant_country`` and ``merchant_category`` are the latest known
  value (by timestamp, then transaction id) among the entity's transactions up to ``t``;
  missing while none is known: nullable ``Int64`` columns in the batch tables (a null in the
  store, as Feast's Int64 declares), NaN in an incremental row.
* Transactions of one instant are ordered by transaction id wherever order matters (only
  for "latest known"): the result never depends on input or arrival order.

Floating point: the batch path sums windows as differences of per-entity prefix sums, the
incremental path sums each window afresh; the two agree within 1e-9 relative for every
feature. ``card_amount_std_30d`` is the square root of ``mean(x²) - mean(x)²`` in both, a
difference of nearly equal terms when the amounts are nearly equal, so the two paths agree
through its square: ``|std_a² - std_b²| ≤ 1e-9 · mean(x²)``.

The incremental state is bounded: events older than the longest window (30 d for cards,
delay + 28 d for merchants and terminals) relative to the entity's newest event are evicted,
and at most ``MAX_CARD_EVENTS`` / ``MAX_MERCHANT_EVENTS`` events are kept; evictions by that cap make
the entity's windows inexact and are counted (``Update.evicted_by_cap`` and the state's
``evicted_by_cap``) so that they can be exported as a metric. The batch path has no cap.
"""

from __future__ import annotations

import bisect
import enum
import math
import operator
import struct
import sys
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import accumulate
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from services.domain import featurespec, money

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

_US = 1_000_000
_HOUR_US = 3_600 * _US
_DAY_US = 24 * _HOUR_US

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


def _micros_of(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * _US + delta.microseconds


_CARD_HORIZON_US = _micros_of(CARD_HORIZON)
_FRAUD_WINDOW_US = _micros_of(FRAUD_RATE_WINDOW)
_LABEL_DELAY_US = _micros_of(LABEL_DELAY)
_RISK_WINDOWS_US = tuple((suffix, _micros_of(width)) for suffix, width in RISK_WINDOWS)

# --- batch path -------------------------------------------------------------------------


def card_feature_table(tx: pd.DataFrame) -> pd.DataFrame:
    """Card aggregates after every (card, timestamp) of ``tx``; rows sorted by card, then time."""
    import numpy as np
    import pandas as pd

    rows = _Rows.sort(tx, "card_id")
    eur, t = rows.eur, rows.t
    hi = rows.end
    lo_1h, lo_24h = rows.after(_HOUR_US), rows.after(_DAY_US)
    lo_7d, lo_30d = rows.after(7 * _DAY_US), rows.after(_CARD_HORIZON_US)
    n_7d, n_30d = hi - lo_7d, hi - lo_30d
    first = rows.first
    mean_30d = _window_sum(eur, lo_30d, hi, first) / n_30d
    var_30d = _window_sum(eur * eur, lo_30d, hi, first) / n_30d - mean_30d**2
    small = (eur < featurespec.SMALL_AMOUNT_EUR).astype(np.int64)
    merchant = pd.factorize(rows.column("merchant_id"))[0].astype(np.int64)
    keep = rows.last_of_instant
    columns = {
        "card_id": rows.ids,
        "event_timestamp": t,
        "card_txn_count_1h": hi - lo_1h,
        "card_txn_count_24h": hi - lo_24h,
        "card_txn_count_7d": n_7d,
        "card_txn_count_30d": n_30d,
        "card_amount_sum_24h": _window_sum(eur, lo_24h, hi, first),
        "card_amount_mean_7d": _window_sum(eur, lo_7d, hi, first) / n_7d,
        "card_amount_max_7d": _window_max(eur, lo_7d),
        "card_amount_mean_30d": mean_30d,
        # Population std (0 for a single transaction); clipped: cancellation can go below 0.
        "card_amount_std_30d": np.sqrt(np.maximum(var_30d, 0.0)),
        "card_distinct_merchants_24h": _window_distinct(rows.code, merchant, t, lo_24h),
        "card_small_txn_count_1h": _window_sum(small, lo_1h, hi, first),
        "card_last_txn_s": np.floor_divide(t, _US),
        "card_home_country": rows.latest_known("card_home_country"),
    }
    return _table(columns, keep, featurespec.CARD_FEATURES)


def merchant_feature_table(tx: pd.DataFrame, label_delay: timedelta = LABEL_DELAY) -> pd.DataFrame:
    """Merchant aggregates after every (merchant, timestamp); rows sorted by merchant, then time."""
    rows = _Rows.sort(tx, "merchant_id")
    hi, first = rows.end, rows.first
    lo_28d = rows.after(28 * _DAY_US)
    columns = {
        "merchant_id": rows.ids,
        "event_timestamp": rows.t,
        **_risk_columns(rows, "merchant", _micros_of(label_delay)),
        "merchant_amount_mean_28d": _window_sum(rows.eur, lo_28d, hi, first) / (hi - lo_28d),
        "merchant_category": rows.latest_known("merchant_category"),
        "merchant_country": rows.latest_known("merchant_country"),
    }
    return _table(columns, rows.last_of_instant, featurespec.MERCHANT_FEATURES)


def terminal_feature_table(tx: pd.DataFrame, label_delay: timedelta = LABEL_DELAY) -> pd.DataFrame:
    """Terminal aggregates after every (terminal, timestamp) of the transactions that name a
    terminal (none without a ``terminal_id`` column); rows sorted by terminal, then time."""
    import pandas as pd

    if "terminal_id" in tx.columns:
        named = tx["terminal_id"].notna().to_numpy() & (tx["terminal_id"] != "").to_numpy()
        tx = tx[named]
    else:
        tx = tx.iloc[:0].assign(terminal_id=pd.Series([], dtype=object))
    rows = _Rows.sort(tx, "terminal_id")
    columns = {
        "terminal_id": rows.ids,
        "event_timestamp": rows.t,
        **_risk_columns(rows, "terminal", _micros_of(label_delay)),
    }
    return _table(columns, rows.last_of_instant, featurespec.TERMINAL_FEATURES)


def _risk_columns(rows: _Rows, prefix: str, delay_us: int) -> dict[str, np.ndarray]:
    """Volume and label-delayed fraud rates of a merchant or terminal (see the module doc)."""
    import numpy as np

    hi, first = rows.end, rows.first
    columns = {
        f"{prefix}_txn_count_1d": hi - rows.after(_DAY_US),
        f"{prefix}_txn_count_7d": hi - rows.after(7 * _DAY_US),
    }
    fraud = rows.fraud
    flags = fraud.astype(np.int64)
    reported = rows.reported_us(delay_us)
    known_hi = rows.after(delay_us)
    for suffix, width_us in _RISK_WINDOWS_US:
        known_lo = rows.after(delay_us + width_us)
        known = known_hi - known_lo
        frauds = _window_sum(flags, known_lo, known_hi, first)
        frauds = frauds - _unreported_frauds(rows, fraud, reported, delay_us, width_us)
        rate = np.divide(frauds, known, out=np.zeros(len(rows.t)), where=known > 0)
        columns[f"{prefix}_fraud_rate_{suffix}"] = rate
        columns[f"{prefix}_labelled_txn_count_{suffix}"] = known
    return columns


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
    return raw * {"s": _US, "ms": 1_000, "us": 1}[unit]


class _Rows:
    """Raw transactions sorted by (entity, timestamp, transaction id), with window lookups.

    Windows are found by binary search over one int64 key per row, entity-major: the key is
    entity code * (distinct timestamps + 1) + rank of the timestamp, which fits in int64 for
    any realistic size where entity * epoch-microseconds would not.
    """

    def __init__(
        self, tx: pd.DataFrame, order: np.ndarray, code: np.ndarray, ids: np.ndarray, t: np.ndarray
    ) -> None:
        import numpy as np

        self._tx = tx
        self.order = order
        self.code = code[order]
        self.ids = ids[self.code]
        self.t = t[order]
        n = len(order)
        # Binary searches run much faster over ascending needles, so ranks are looked up in
        # global time order and scattered back.
        self._by_time = np.argsort(self.t, kind="stable")
        sorted_t = self.t[self._by_time]
        new = np.r_[True, sorted_t[1:] != sorted_t[:-1]] if n else np.zeros(0, dtype=bool)
        self.times = sorted_t[new]
        rank = np.empty(n, dtype=np.int64)
        rank[self._by_time] = np.cumsum(new) - 1
        self.base = self.code * np.int64(len(self.times) + 1)
        self.key = self.base + rank
        self.first = _first_rows(self.code)
        self.end = np.searchsorted(self.key, self.key, side="right")
        self.last_of_instant = (
            np.r_[self.key[1:] != self.key[:-1], True] if n else np.zeros(0, dtype=bool)
        )
        self.eur = amounts_eur(tx)[order]

    @classmethod
    def sort(cls, tx: pd.DataFrame, entity: str) -> _Rows:
        """Sorts ``tx`` by ``entity``, time and transaction id."""
        import numpy as np
        import pandas as pd

        missing = [c for c in REQUIRED_COLUMNS if c not in tx.columns]
        if missing:
            raise ValueError(f"raw transactions lack column(s) {missing}")
        if tx[entity].isna().any():
            raise ValueError(f"{entity} has missing values")
        code, ids = pd.factorize(tx[entity].to_numpy(dtype=object), sort=True)
        code = code.astype(np.int64)
        t = timestamps_us(tx["timestamp"])
        order = np.lexsort((t, code))
        order = _order_ties_by_id(order, code, t, tx["transaction_id"].to_numpy(dtype=object))
        return cls(tx, order, code, np.asarray(ids, dtype=object), t)

    def column(self, name: str) -> np.ndarray:
        """A raw column in row order."""
        return self._tx[name].to_numpy()[self.order]

    def after(self, width_us: int) -> np.ndarray:
        """Per row at t: the first row of its entity whose timestamp is later than t - width."""
        import numpy as np

        rank = np.empty(len(self.t), dtype=np.int64)
        needles = self.t[self._by_time] - width_us
        rank[self._by_time] = np.searchsorted(self.times, needles, side="right")
        # Entity-major keys with ranks ascending inside each entity: ascending needles.
        return np.searchsorted(self.key, self.base + rank, side="left")

    @property
    def fraud(self) -> np.ndarray:
        """Each row's label as bools; missing labels count as legitimate."""
        import numpy as np
        import pandas as pd

        labels = self._tx["is_fraud"].to_numpy()[self.order]
        return np.where(pd.isna(labels), False, labels).astype(bool)

    def reported_us(self, delay_us: int) -> np.ndarray:
        """Each row's label report time: ``fraud_reported_at``, else timestamp + delay."""
        import numpy as np

        default = self.t + delay_us
        if "fraud_reported_at" not in self._tx.columns:
            return default
        column = self._tx["fraud_reported_at"]
        missing = column.isna().to_numpy()[self.order]
        return np.where(missing, default, timestamps_us(column)[self.order])

    def latest_known(self, name: str) -> np.ndarray:
        """Per row: the latest non-missing value of ``name`` in its entity so far (float, NaN)."""
        import numpy as np

        n = len(self.t)
        if name not in self._tx.columns:
            return np.full(n, np.nan)
        values = self._tx[name].to_numpy(dtype=np.float64, na_value=np.nan)[self.order]
        index = np.where(np.isnan(values), -1, np.arange(n))
        last = np.maximum.accumulate(index) if n else index
        ok = last >= self.first
        return np.where(ok, values[np.where(ok, last, 0)], np.nan)


def _order_ties_by_id(
    order: np.ndarray, code: np.ndarray, t: np.ndarray, ids: np.ndarray
) -> np.ndarray:
    """Reorders rows of one (entity, timestamp) by transaction id; other rows stay put."""
    import numpy as np

    c, s = code[order], t[order]
    same = (c[1:] == c[:-1]) & (s[1:] == s[:-1])
    if not same.any():
        return order
    tied = np.r_[same, False] | np.r_[False, same]
    group = np.cumsum(np.r_[True, ~same])[tied]
    rows = order[tied]
    rank = np.empty(len(rows), dtype=np.int64)
    rank[np.argsort(ids[rows], kind="stable")] = np.arange(len(rows))
    order = order.copy()
    order[tied] = rows[np.lexsort((rank, group))]
    return order


def _unreported_frauds(
    rows: _Rows, fraud: np.ndarray, reported: np.ndarray, delay_us: int, width_us: int
) -> np.ndarray:
    """Per row at t: frauds inside its fraud-rate window of ``width_us`` reported after t.

    Only frauds reported later than timestamp + delay can be such; each one is inside the
    window of its entity's rows with t in [t_j + delay, t_j + delay + width) and unreported
    for those with t < reported_j: a range of rows, marked with a difference array.
    """
    import numpy as np

    n = len(rows.t)
    late = np.flatnonzero(fraud & (reported > rows.t + delay_us))
    if len(late) == 0:
        return np.zeros(n, dtype=np.int64)
    t_j = rows.t[late]
    stop = np.minimum(t_j + delay_us + width_us, reported[late])

    def first_at_or_after(bound: np.ndarray) -> np.ndarray:
        # The first row of row j's entity with t >= bound (times are integers).
        ranks = np.searchsorted(rows.times, bound - 1, side="right")
        return np.searchsorted(rows.key, rows.base[late] + ranks, side="left")

    start, end = first_at_or_after(t_j + delay_us), first_at_or_after(stop)
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, start, 1)
    np.add.at(diff, end, -1)
    return np.cumsum(diff[:n])


def _first_rows(entity: np.ndarray) -> np.ndarray:
    """For rows sorted by entity: the index of each row's entity's first row."""
    import numpy as np

    n = len(entity)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.r_[True, entity[1:] != entity[:-1]]
    return np.maximum.accumulate(np.where(starts, np.arange(n), 0))


def _window_sum(
    values: np.ndarray, lo: np.ndarray, hi: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """Sum of ``values[lo:hi]`` for each row; ``first`` is the row's entity's first row.

    Cumulative sums restart at each entity, so they stay small and the differences exact
    to ~1e-12 instead of carrying the rounding of a sum over the whole table.
    """
    import numpy as np
    import pandas as pd

    local = pd.Series(values).groupby(first).cumsum().to_numpy()
    prefix = np.concatenate([np.zeros(1, dtype=local.dtype), local])

    def upto(k: np.ndarray) -> np.ndarray:
        return np.where(k > first, prefix[k], 0)

    return upto(hi) - upto(lo)


def _by_reach(lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ordered by how far back their window reaches (rows lo..i), longest first.

    Returns the order and the reaches in that order, so that the rows reaching back at
    least ``lag`` rows are a prefix: lag-by-lag loops then cost the windows' total size.
    """
    import numpy as np

    reach = np.arange(len(lo)) - lo
    order = np.argsort(-reach, kind="stable")
    return order, reach[order]


def _longest(reach: np.ndarray) -> int:
    return int(reach[0]) if len(reach) else 0


def _rows_reaching(order: np.ndarray, reach: np.ndarray, lag: int) -> np.ndarray:
    import numpy as np

    return order[: int(np.searchsorted(-reach, -lag, side="right"))]


def _window_max(values: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Max of ``values[lo:i+1]`` for each row i; windows are short, so lag by lag."""
    import numpy as np

    out = values.copy()
    order, reach = _by_reach(lo)
    for lag in range(1, _longest(reach) + 1):
        rows = _rows_reaching(order, reach, lag)
        out[rows] = np.maximum(out[rows], values[rows - lag])
    return out


def _window_distinct(
    entity: np.ndarray, other: np.ndarray, t: np.ndarray, lo: np.ndarray
) -> np.ndarray:
    """Distinct ``other`` values among rows lo..i of each row i (same entity, sorted by t).

    Row j counts for row i when it is the last occurrence of its value up to time t_i,
    i.e. when the next row of the same (entity, other) pair comes after t_i.
    """
    import numpy as np

    n = len(t)
    pair_order = np.lexsort((np.arange(n), other, entity))
    same_pair = (entity[pair_order][1:] == entity[pair_order][:-1]) & (
        other[pair_order][1:] == other[pair_order][:-1]
    )
    next_t = np.full(n, np.iinfo(np.int64).max)
    next_t[pair_order[:-1][same_pair]] = t[pair_order[1:][same_pair]]
    out = np.ones(n, dtype=np.int64)  # the row itself is always the last occurrence up to t_i
    order, reach = _by_reach(lo)
    for lag in range(1, _longest(reach) + 1):
        rows = _rows_reaching(order, reach, lag)
        out[rows] += next_t[rows - lag] > t[rows]
    return out


_CODES = frozenset({"card_home_country", "merchant_category", "merchant_country"})


def _table(
    columns: dict[str, np.ndarray], keep: np.ndarray, features: tuple[str, ...]
) -> pd.DataFrame:
    """The kept rows as a frame: entity id, ``event_timestamp``, then ``features`` in order."""
    import pandas as pd

    entity, timestamp = list(columns)[:2]
    out: dict[str, object] = {
        entity: columns[entity][keep],
        timestamp: _utc(columns[timestamp][keep]),
    }
    for name in features:
        values = columns[name][keep]
        out[name] = _codes(values) if name in _CODES else values
    # Fresh arrays: no copy, and no consolidation into 2-D blocks (a full copy of the table).
    return pd.DataFrame(out, copy=False)


def _codes(values: np.ndarray) -> pd.arrays.IntegerArray:
    """Codes as a nullable Int64 array: the integers Feast declares, null where unknown."""
    import numpy as np
    import pandas as pd

    unknown = np.isnan(values)
    return pd.arrays.IntegerArray(np.where(unknown, 0, values).astype(np.int64), unknown)


def _utc(micros: np.ndarray) -> pd.Series:
    import pandas as pd

    return pd.Series(micros.astype("datetime64[us]")).dt.tz_localize("UTC")


# --- incremental path: events, rows, updates --------------------------------------------


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


class Change(enum.StrEnum):
    """What an event did to an entity's state (a metric label)."""

    APPLIED = "applied"
    """Counted, as the entity's newest event (or tied with it)."""
    LATE = "late"
    """Counted, merged before the entity's newest event."""
    DUPLICATE = "duplicate"
    """Already counted (transaction id seen) or a label no newer than the one held."""
    TOO_OLD = "too_old"
    """Older than every window at the entity's newest event: ignored."""
    PENDING = "pending"
    """A label for a transaction not seen yet: held until it arrives."""


S = TypeVar("S")


class Update(Generic[S]):
    """The result of applying one event: the state, its row and what happened.

    The row is computed when first read, from the state as it is then: read it before the
    next event changes the same state. A consumer that applies many events and stores rows
    once per batch (the live updater) never reads it and computes each entity's row once."""

    __slots__ = ("_compute", "_row", "change", "evicted_by_cap", "state")

    def __init__(
        self,
        state: S,
        compute: Callable[[S], FeatureRow | None],
        change: Change,
        evicted_by_cap: int,
    ) -> None:
        self.state = state
        """The entity's state (the one passed in, updated in place, or a new one)."""
        self.change = change
        """What the event did."""
        self.evicted_by_cap = evicted_by_cap
        """Events evicted by this update because the state was full (windows now undercount)."""
        self._compute: Callable[[S], FeatureRow | None] | None = compute
        self._row: FeatureRow | None = None

    @property
    def row(self) -> FeatureRow | None:
        """The entity's feature row as of its newest transaction; None before its first one."""
        compute = self._compute
        if compute is not None:
            self._row = compute(self.state)
            self._compute = None
        return self._row


def event_micros(event: TransactionEvent) -> int:
    """The event's timestamp in epoch microseconds."""
    if not math.isfinite(event.timestamp_s):
        raise ValueError(f"timestamp_s of {event.transaction_id!r} is not finite")
    return round(event.timestamp_s * _US)


def _seconds_to_micros(seconds: float) -> int:
    if not math.isfinite(seconds):
        raise ValueError("timestamp is not finite")
    return round(seconds * _US)


_NEVER = -(2**63)
_NAN = float("nan")


@dataclass(slots=True)
class LatestCode:
    """A code with the (timestamp, transaction id) it was last seen at."""

    value: int | None = None
    """The code; None while unknown."""
    at_us: int = _NEVER
    """Timestamp of the transaction that carried it."""
    at_id: str = ""
    """Id of the transaction that carried it (orders transactions of one instant)."""

    def offer(self, value: int | None, at_us: int, at_id: str) -> None:
        """Takes ``value`` if it is known and at least as new as the held one."""
        if value is not None and (at_us, at_id) >= (self.at_us, self.at_id):
            self.value, self.at_us, self.at_id = int(value), at_us, at_id

    def feature(self) -> float:
        """The value as a feature: the code, or NaN."""
        return _NAN if self.value is None else self.value


@dataclass(slots=True)
class Events:
    """An entity's recent events, sorted by (timestamp, transaction id)."""

    times_us: list[int] = field(default_factory=list)
    """Epoch microseconds, ascending."""
    ids: list[str] = field(default_factory=list)
    """Transaction ids, parallel to ``times_us``."""
    eur: list[float] = field(default_factory=list)
    """Amounts in EUR, parallel to ``times_us``."""
    where: dict[str, int] = field(default_factory=dict)
    """Transaction id → timestamp, for idempotency and labels."""

    def __len__(self) -> int:
        return len(self.times_us)

    @property
    def newest_us(self) -> int:
        """Timestamp of the newest event (the state must not be empty)."""
        return self.times_us[-1]

    def insert(self, t_us: int, tid: str, eur: float) -> tuple[int, bool]:
        """Inserts one event in order; returns its index and whether it is the newest."""
        times, ids = self.times_us, self.ids
        if not times or (t_us, tid) > (times[-1], ids[-1]):
            k = len(times)
        else:
            k = bisect.bisect_right(times, t_us)
            while k > 0 and times[k - 1] == t_us and ids[k - 1] > tid:
                k -= 1
        times.insert(k, t_us)
        ids.insert(k, tid)
        self.eur.insert(k, eur)
        self.where[tid] = t_us
        return k, k == len(times) - 1

    def drop_first(self, k: int) -> list[str]:
        """Removes the ``k`` oldest events; returns their ids."""
        if k <= 0:
            return []
        gone = self.ids[:k]
        del self.times_us[:k], self.ids[:k], self.eur[:k]
        where = self.where
        for tid in gone:
            del where[tid]
        return gone

    def evict(self, horizon_us: int, cap: int) -> tuple[list[str], int]:
        """Drops events at or before newest - horizon, then the oldest beyond ``cap``.

        Returns the dropped ids and how many went by the cap.
        """
        times = self.times_us
        if times[0] > times[-1] - horizon_us and len(times) <= cap:
            return [], 0
        k = bisect.bisect_right(times, times[-1] - horizon_us)
        over = max(0, len(times) - k - cap)
        return self.drop_first(k + over), over

    def since(self, bound_us: int) -> int:
        """Index of the first event later than ``bound_us``."""
        return bisect.bisect_right(self.times_us, bound_us)


# --- cards --------------------------------------------------------------------------------


@dataclass(slots=True)
class CardState:
    """A card's events of the last 30 days and what the row needs besides them."""

    events: Events = field(default_factory=Events)
    """Transactions of the last 30 days."""
    merchants: list[str] = field(default_factory=list)
    """Merchant of each event, parallel to ``events``."""
    home_country: LatestCode = field(default_factory=LatestCode)
    """Latest known ISO 3166 numeric home country."""
    duplicates: int = 0
    """Events ignored because their transaction id was already counted."""
    too_old: int = 0
    """Events ignored because they were older than every window."""
    evicted_by_cap: int = 0
    """Events evicted because the state held ``MAX_CARD_EVENTS``."""

    def to_bytes(self) -> bytes:
        """A compact, versioned binary encoding (``from_bytes`` reads it back)."""
        out = _Writer(b"C1")
        out.ints(self.duplicates, self.too_old, self.evicted_by_cap)
        out.latest(self.home_country)
        out.events(self.events)
        out.interned(self.merchants)
        return out.bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> CardState:
        """Decodes ``to_bytes`` output."""
        read = _Reader(data, b"C1")
        duplicates, too_old, evicted = read.ints(3)
        home = read.latest()
        events = read.events()
        merchants = read.interned(len(events))
        read.done()
        return cls(events, merchants, home, duplicates, too_old, evicted)


def card_row(state: CardState) -> FeatureRow | None:
    """The card's features as of its newest event (``featurespec.CARD_FEATURES`` order)."""
    ev = state.events
    times = ev.times_us
    n = len(times)
    if n == 0:
        return None
    newest = times[-1]
    eur = ev.eur
    since = bisect.bisect_right
    lo_1h, lo_24h = since(times, newest - _HOUR_US), since(times, newest - _DAY_US)
    lo_7d, lo_30d = since(times, newest - 7 * _DAY_US), since(times, newest - _CARD_HORIZON_US)
    week = eur[lo_7d:]
    month = eur[lo_30d:]
    n_30d = n - lo_30d
    mean_30d = sum(month) / n_30d
    var_30d = sum(map(operator.mul, month, month)) / n_30d - mean_30d * mean_30d
    small = featurespec.SMALL_AMOUNT_EUR
    return {
        "card_txn_count_1h": n - lo_1h,
        "card_txn_count_24h": n - lo_24h,
        "card_txn_count_7d": n - lo_7d,
        "card_txn_count_30d": n_30d,
        "card_amount_sum_24h": sum(eur[lo_24h:]),
        "card_amount_mean_7d": sum(week) / len(week),
        "card_amount_max_7d": max(week),
        "card_amount_mean_30d": mean_30d,
        "card_amount_std_30d": math.sqrt(max(var_30d, 0.0)),
        "card_distinct_merchants_24h": len(set(state.merchants[lo_24h:])),
        "card_small_txn_count_1h": sum(1 for x in eur[lo_1h:] if x < small),
        "card_last_txn_s": newest // _US,
        "card_home_country": state.home_country.feature(),
    }


def apply_card(state: CardState | None, event: TransactionEvent) -> Update[CardState]:
    """Counts one transaction in its card's state (None: a new card); returns the new row.

    No I/O, clock or global state: the result depends on the state and the event only, and
    the state is updated in place. An event older than the card's newest is merged at its
    time; one at or before newest - 30 d is ignored (``Change.TOO_OLD``); a transaction id
    already counted is ignored (``Change.DUPLICATE``).
    """
    t_us = event_micros(event)
    eur = featurespec.amount_eur(event.amount_minor, event.currency)
    if state is None:
        state = CardState()
    ev = state.events
    tid = event.transaction_id
    if tid in ev.where:
        state.duplicates += 1
        return Update(state, card_row, Change.DUPLICATE, 0)
    if ev.times_us and t_us <= ev.newest_us - _CARD_HORIZON_US:
        state.too_old += 1
        return Update(state, card_row, Change.TOO_OLD, 0)
    k, newest = ev.insert(t_us, tid, eur)
    state.merchants.insert(k, event.merchant_id)
    state.home_country.offer(event.card_home_country, t_us, tid)
    gone, capped = ev.evict(_CARD_HORIZON_US, MAX_CARD_EVENTS)
    if gone:
        del state.merchants[: len(gone)]
    state.evicted_by_cap += capped
    return Update(state, card_row, Change.APPLIED if newest else Change.LATE, capped)


# --- merchants ----------------------------------------------------------------------------


class Label(NamedTuple):
    """An outcome for one transaction and when it was reported."""

    is_fraud: bool
    """True for fraud, False for a legitimate verdict."""
    reported_us: int
    """Epoch microseconds of the report."""


@dataclass(slots=True)
class MerchantState:
    """A merchant's (or a terminal's) events within its longest window (label delay + 28
    days) and labels; a terminal's state leaves the codes unknown."""

    label_delay_us: int = _LABEL_DELAY_US
    """Time from a transaction to the moment its label may be used (see the module docstring)."""
    events: Events = field(default_factory=Events)
    """Transactions within the horizon."""
    labels: dict[str, Label] = field(default_factory=dict)
    """Labels of transactions in ``events``: frauds, and legitimate outcomes reported later."""
    pending: dict[str, Label] = field(default_factory=dict)
    """Labels of transactions not seen yet."""
    category: LatestCode = field(default_factory=LatestCode)
    """Latest known MCC."""
    country: LatestCode = field(default_factory=LatestCode)
    """Latest known ISO 3166 numeric country."""
    duplicates: int = 0
    """Events and labels ignored because they were already counted."""
    too_old: int = 0
    """Events and labels ignored because they were older than every window."""
    evicted_by_cap: int = 0
    """Events evicted because the state held ``MAX_MERCHANT_EVENTS``."""
    labels_dropped: int = 0
    """Pending labels dropped because ``MAX_PENDING_LABELS`` were held."""

    @property
    def horizon_us(self) -> int:
        """Age beyond which an event counts in no window."""
        return self.label_delay_us + _FRAUD_WINDOW_US

    def to_bytes(self) -> bytes:
        """A compact, versioned binary encoding (``from_bytes`` reads it back)."""
        out = _Writer(b"M1")
        out.ints(
            self.label_delay_us,
            self.duplicates,
            self.too_old,
            self.evicted_by_cap,
            self.labels_dropped,
        )
        out.latest(self.category)
        out.latest(self.country)
        out.events(self.events)
        out.labels(self.labels)
        out.labels(self.pending)
        return out.bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> MerchantState:
        """Decodes ``to_bytes`` output."""
        read = _Reader(data, b"M1")
        delay, duplicates, too_old, evicted, dropped = read.ints(5)
        category, country = read.latest(), read.latest()
        events = read.events()
        labels, pending = read.labels(), read.labels()
        read.done()
        return cls(
            delay,
            events,
            labels,
            pending,
            category,
            country,
            duplicates,
            too_old,
            evicted,
            dropped,
        )


def merchant_row(state: MerchantState) -> FeatureRow | None:
    """The merchant's features as of its newest event (``featurespec.MERCHANT_FEATURES`` order)."""
    ev = state.events
    n = len(ev)
    if n == 0:
        return None
    lo_28d = ev.since(ev.newest_us - 28 * _DAY_US)
    risk = _risk_row(state, "merchant")
    row = {name: risk.get(name, _NAN) for name in featurespec.MERCHANT_FEATURES}
    row["merchant_amount_mean_28d"] = sum(ev.eur[lo_28d:]) / (n - lo_28d)
    row["merchant_category"] = state.category.feature()
    row["merchant_country"] = state.country.feature()
    return row


def terminal_row(state: MerchantState) -> FeatureRow | None:
    """The terminal's features as of its newest event (``featurespec.TERMINAL_FEATURES`` order)."""
    if len(state.events) == 0:
        return None
    return _risk_row(state, "terminal")


def _risk_row(state: MerchantState, prefix: str) -> FeatureRow:
    """Volume and label-delayed fraud rates as of the newest event (see the module doc)."""
    ev = state.events
    n = len(ev)
    newest = ev.newest_us
    row: FeatureRow = {
        f"{prefix}_txn_count_1d": n - ev.since(newest - _DAY_US),
        f"{prefix}_txn_count_7d": n - ev.since(newest - 7 * _DAY_US),
    }
    known_until = newest - state.label_delay_us
    until = ev.since(known_until)
    where = ev.where
    fraud_times = [
        where[tid]
        for tid, label in state.labels.items()
        if label.is_fraud and label.reported_us <= newest
    ]
    for suffix, width_us in _RISK_WINDOWS_US:
        known_from = known_until - width_us
        known = until - ev.since(known_from)
        frauds = sum(1 for t_us in fraud_times if known_from < t_us <= known_until)
        row[f"{prefix}_fraud_rate_{suffix}"] = frauds / known if known else 0.0
        row[f"{prefix}_labelled_txn_count_{suffix}"] = known
    return row


def _newer(label: Label, held: Label) -> bool:
    """Whether ``label`` replaces ``held``: a later report, or another verdict at the same time."""
    return label.reported_us > held.reported_us or (
        label.reported_us == held.reported_us and label != held
    )


def _put_label(state: MerchantState, tid: str, label: Label, *, keep_legit: bool) -> bool:
    """Holds ``label`` for a counted transaction unless a newer one is held; True if changed.

    A legitimate label with nothing to overrule changes no count; it is kept only when
    ``keep_legit`` (an explicit outcome, which overrules an older fraud report arriving late).
    """
    held = state.labels.get(tid)
    if held is None:
        if not label.is_fraud and not keep_legit:
            return False
    elif not _newer(label, held):
        return False
    state.labels[tid] = label
    return True


def apply_merchant(state: MerchantState | None, event: TransactionEvent) -> Update[MerchantState]:
    """Counts one transaction in its merchant's state (None: a new merchant); returns the new row.

    Same rules as ``apply_card``, with the merchant's horizon (label delay + 28 d). The
    event's ``is_fraud``, when given, is a label reported at timestamp + label delay; a
    label that ``apply_label`` held for this transaction applies now.
    """
    return _apply_risk(state, event, merchant_row, codes=True)


def apply_terminal(state: MerchantState | None, event: TransactionEvent) -> Update[MerchantState]:
    """Counts one transaction in the state of its terminal (``event.terminal_id``, which the
    caller checks is set); the same rules as ``apply_merchant``, the terminal's row."""
    return _apply_risk(state, event, terminal_row, codes=False)


def _apply_risk(
    state: MerchantState | None,
    event: TransactionEvent,
    row: Callable[[MerchantState], FeatureRow | None],
    *,
    codes: bool,
) -> Update[MerchantState]:
    t_us = event_micros(event)
    eur = featurespec.amount_eur(event.amount_minor, event.currency)
    if state is None:
        state = MerchantState()
    ev = state.events
    tid = event.transaction_id
    if tid in ev.where:
        state.duplicates += 1
        return Update(state, row, Change.DUPLICATE, 0)
    if ev.times_us and t_us <= ev.newest_us - state.horizon_us:
        state.too_old += 1
        return Update(state, row, Change.TOO_OLD, 0)
    _, newest = ev.insert(t_us, tid, eur)
    if codes:
        state.category.offer(event.merchant_category, t_us, tid)
        state.country.offer(event.merchant_country, t_us, tid)
    held = state.pending.pop(tid, None)
    if event.is_fraud is not None:
        implied = Label(bool(event.is_fraud), t_us + state.label_delay_us)
        _put_label(state, tid, implied, keep_legit=False)
    if held is not None:
        _put_label(state, tid, held, keep_legit=True)
    capped = _evict_merchant(state)
    return Update(state, row, Change.APPLIED if newest else Change.LATE, capped)


def _evict_merchant(state: MerchantState) -> int:
    gone, capped = state.events.evict(state.horizon_us, MAX_MERCHANT_EVENTS)
    for tid in gone:
        state.labels.pop(tid, None)
    state.evicted_by_cap += capped
    return capped


def _hold_pending(state: MerchantState, tid: str, label: Label) -> None:
    """Holds a label for a transaction not seen yet, within ``MAX_PENDING_LABELS``."""
    pending = state.pending
    pending[tid] = label
    if len(pending) <= MAX_PENDING_LABELS:
        return
    # A label reported at r is for a transaction at or before r: once r is beyond the
    # horizon its transaction can only arrive too old, so such labels go first.
    if state.events.times_us:
        oldest = state.events.newest_us - state.horizon_us
        for stale in [k for k, v in pending.items() if v.reported_us <= oldest]:
            del pending[stale]
    while len(pending) > MAX_PENDING_LABELS:
        del pending[min(pending, key=lambda k: pending[k].reported_us)]
        state.labels_dropped += 1


def apply_label(
    state: MerchantState | None, transaction_id: str, is_fraud: bool, reported_at_s: float
) -> Update[MerchantState]:
    """Records an outcome for one of the merchant's transactions, reported at ``reported_at_s``.

    The label counts in rows at or after ``reported_at_s`` whose fraud-rate windows hold the
    transaction (the delay rule of the batch path): one reported after the merchant's newest
    transaction first shows in the row of its next one, exactly as training sees it. The
    returned row is the row as of the newest transaction. Of two labels for one transaction the
    later report wins. A label for a transaction not seen yet is held (``Change.PENDING``)
    until it arrives, or until it is too old to matter; at most ``MAX_PENDING_LABELS``.
    """
    return _apply_label(state, transaction_id, is_fraud, reported_at_s, merchant_row)


def apply_terminal_label(
    state: MerchantState | None, transaction_id: str, is_fraud: bool, reported_at_s: float
) -> Update[MerchantState]:
    """``apply_label`` for the state of the transaction's terminal; returns the terminal's row."""
    return _apply_label(state, transaction_id, is_fraud, reported_at_s, terminal_row)


def _apply_label(
    state: MerchantState | None,
    transaction_id: str,
    is_fraud: bool,
    reported_at_s: float,
    row: Callable[[MerchantState], FeatureRow | None],
) -> Update[MerchantState]:
    label = Label(bool(is_fraud), _seconds_to_micros(reported_at_s))
    if state is None:
        state = MerchantState()
    ev = state.events
    if transaction_id in ev.where:
        if not _put_label(state, transaction_id, label, keep_legit=True):
            state.duplicates += 1
            return Update(state, row, Change.DUPLICATE, 0)
        return Update(state, row, Change.APPLIED, 0)
    if ev.times_us and label.reported_us <= ev.newest_us - state.horizon_us:
        state.too_old += 1
        return Update(state, row, Change.TOO_OLD, 0)
    held = state.pending.get(transaction_id)
    if held is not None and not _newer(label, held):
        state.duplicates += 1
        return Update(state, row, Change.DUPLICATE, 0)
    _hold_pending(state, transaction_id, label)
    return Update(state, row, Change.PENDING, 0)


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
            timestamp_s=t_us / _US,
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


# --- binary encoding of states ------------------------------------------------------------

_LITTLE = sys.byteorder == "little"


def _le(values: array) -> bytes:
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


class _Writer:
    """Little-endian builder of a state's bytes."""

    def __init__(self, magic: bytes) -> None:
        self._parts: list[bytes] = [magic]

    def ints(self, *values: int) -> None:
        self._parts.append(struct.pack(f"<{len(values)}q", *values))

    def strs(self, values: list[str]) -> None:
        encoded = [v.encode() for v in values]
        self._parts.append(struct.pack("<I", len(encoded)))
        self._parts.append(_le(array("I", [len(b) for b in encoded])))
        self._parts.append(b"".join(encoded))

    def latest(self, latest: LatestCode) -> None:
        known = latest.value is not None
        self.ints(int(known), latest.value if latest.value is not None else 0, latest.at_us)
        self.strs([latest.at_id])

    def events(self, events: Events) -> None:
        self.strs(events.ids)
        self._parts.append(_le(array("q", events.times_us)))
        self._parts.append(_le(array("d", events.eur)))

    def interned(self, values: list[str]) -> None:
        table: dict[str, int] = {}
        index = array("I", [table.setdefault(v, len(table)) for v in values])
        self.strs(list(table))
        self._parts.append(_le(index))

    def labels(self, labels: dict[str, Label]) -> None:
        self.strs(list(labels))
        self._parts.append(bytes(int(v.is_fraud) for v in labels.values()))
        self._parts.append(_le(array("q", [v.reported_us for v in labels.values()])))

    def bytes(self) -> bytes:
        return b"".join(self._parts)


class _Reader:
    """Reads what ``_Writer`` wrote, checking the magic and the length."""

    def __init__(self, data: bytes, magic: bytes) -> None:
        if data[: len(magic)] != magic:
            raise ValueError(f"not a {magic!r} state encoding")
        self._data = memoryview(data)
        self._at = len(magic)

    def _take(self, size: int) -> memoryview:
        end = self._at + size
        if end > len(self._data):
            raise ValueError("truncated state encoding")
        chunk = self._data[self._at : end]
        self._at = end
        return chunk

    def _array(self, typecode: str, count: int) -> array:
        values = array(typecode)
        values.frombytes(self._take(count * values.itemsize))
        if not _LITTLE:
            values.byteswap()
        return values

    def ints(self, count: int) -> tuple[int, ...]:
        return struct.unpack(f"<{count}q", self._take(8 * count))

    def strs(self) -> list[str]:
        (count,) = struct.unpack("<I", self._take(4))
        lengths = self._array("I", count)
        blob = bytes(self._take(sum(lengths)))
        ends = list(accumulate(lengths))
        starts = [0, *ends][:-1]
        text = blob.decode()
        if len(text) == len(blob):
            # ASCII (the usual ids): byte offsets are character offsets, one decode suffices.
            return [text[a:b] for a, b in zip(starts, ends, strict=True)]
        return [blob[a:b].decode() for a, b in zip(starts, ends, strict=True)]

    def latest(self) -> LatestCode:
        known, value, at_us = self.ints(3)
        (at_id,) = self.strs()
        return LatestCode(value if known else None, at_us, at_id)

    def events(self) -> Events:
        ids = self.strs()
        times = self._array("q", len(ids)).tolist()
        eur = self._array("d", len(ids)).tolist()
        return Events(times, ids, eur, dict(zip(ids, times, strict=True)))

    def interned(self, count: int) -> list[str]:
        table = self.strs()
        return [table[i] for i in self._array("I", count)]

    def labels(self) -> dict[str, Label]:
        ids = self.strs()
        flags = bytes(self._take(len(ids)))
        reported = self._array("q", len(ids)).tolist()
        return {tid: Label(bool(f), r) for tid, f, r in zip(ids, flags, reported, strict=True)}

    def done(self) -> None:
        if self._at != len(self._data):
            raise ValueError("trailing bytes after the state encoding")
