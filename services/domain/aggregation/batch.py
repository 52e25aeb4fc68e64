"""The batch path: feature tables of a whole raw transaction frame (``docs/aggregation.md``)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from services.domain import featurespec
from services.domain.aggregation.schema import (
    CARD_HORIZON_US,
    DAY_US,
    FRAUD_WINDOW_US,
    HOUR_US,
    LABEL_DELAY,
    REQUIRED_COLUMNS,
    RISK_WINDOWS_US,
    US,
    amounts_eur,
    micros_of,
    timestamps_us,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


def card_feature_table(tx: pd.DataFrame) -> pd.DataFrame:
    """Card aggregates after every (card, timestamp) of ``tx``; rows sorted by card, then time."""
    import numpy as np
    import pandas as pd

    rows = _Rows.sort(tx, "card_id")
    eur, t = rows.eur, rows.t
    hi = rows.end
    lo_1h, lo_24h = rows.after(HOUR_US), rows.after(DAY_US)
    lo_7d, lo_30d = rows.after(7 * DAY_US), rows.after(CARD_HORIZON_US)
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
        "card_last_txn_s": np.floor_divide(t, US),
        "card_home_country": rows.latest_known("card_home_country"),
    }
    return _table(columns, keep, featurespec.CARD_FEATURES)


def merchant_feature_table(tx: pd.DataFrame, label_delay: timedelta = LABEL_DELAY) -> pd.DataFrame:
    """Merchant aggregates after every (merchant, timestamp); rows sorted by merchant, then time."""
    rows = _Rows.sort(tx, "merchant_id")
    hi, first = rows.end, rows.first
    lo_28d = rows.after(28 * DAY_US)
    columns = {
        "merchant_id": rows.ids,
        "event_timestamp": rows.t,
        **_risk_columns(rows, "merchant", micros_of(label_delay)),
        "merchant_amount_mean_28d": _window_sum(rows.eur, lo_28d, hi, first) / (hi - lo_28d),
        "merchant_category": rows.latest_known("merchant_category"),
        "merchant_country": rows.latest_known("merchant_country"),
    }
    return _table(columns, rows.last_of_instant, featurespec.MERCHANT_FEATURES)


def terminal_feature_table(tx: pd.DataFrame, label_delay: timedelta = LABEL_DELAY) -> pd.DataFrame:
    """Terminal aggregates after every (terminal, timestamp) of the transactions that name a
    terminal (none without a ``terminal_id`` column), and as of every report of a fraud's
    label at an instant without a payment of its terminal, up to the frame's newest payment
    (``_label_rows``); rows sorted by terminal, then time."""
    import numpy as np
    import pandas as pd

    # Reports after the frame's newest payment, with or without a terminal, have not happened.
    now = int(timestamps_us(tx["timestamp"]).max()) if len(tx) else 0
    if "terminal_id" in tx.columns:
        named = tx["terminal_id"].notna().to_numpy() & (tx["terminal_id"] != "").to_numpy()
        tx = tx[named]
    else:
        tx = tx.iloc[:0].assign(terminal_id=pd.Series([], dtype=object))
    rows = _Rows.sort(tx, "terminal_id")
    delay_us = micros_of(label_delay)
    first, last = _known_fraud_times(rows, delay_us, FRAUD_WINDOW_US)
    columns = {
        "terminal_id": rows.ids,
        "event_timestamp": rows.t,
        **_risk_columns(rows, "terminal", delay_us),
        # 0 (not missing) while it counts none: the absence of a fraud is a value.
        "terminal_known_fraud_first_s": np.nan_to_num(first / US, nan=featurespec.NO_KNOWN_FRAUD),
        "terminal_known_fraud_last_s": np.nan_to_num(last / US, nan=featurespec.NO_KNOWN_FRAUD),
    }
    table = _table(columns, rows.last_of_instant, featurespec.TERMINAL_FEATURES)
    labelled = _label_rows(rows, delay_us, now)
    if labelled is None:
        return table
    both = pd.concat([table, labelled], ignore_index=True)
    return both.sort_values(["terminal_id", "event_timestamp"], kind="stable", ignore_index=True)


def _label_rows(rows: _Rows, delay_us: int, now: int) -> pd.DataFrame | None:
    """A terminal's row as of each report of a fraud's label (``fraud_reported_at``, else
    timestamp + delay) at an instant without a payment of the terminal, up to the frame's
    newest payment (a later report has not happened yet): what the incremental path
    writes when the label arrives (``apply_terminal_label``). The same features as a
    payment's row at that instant, without a payment in them. None when there is none.

    One row per (terminal, report instant); frauds are few, so each is computed with binary
    searches over its terminal's sorted payments."""
    import numpy as np

    fraud = rows.fraud
    if len(rows.t) == 0 or not fraud.any():
        return None
    reported = rows.reported_us(delay_us)
    j = np.flatnonzero(fraud & (reported <= now))
    if len(j) == 0:
        return None
    # Each terminal's block of rows: [first, end of block).
    block_end = np.r_[np.flatnonzero(rows.code[1:] != rows.code[:-1]) + 1, len(rows.code)]
    out: dict[str, list[object]] = {
        "terminal_id": [], "event_timestamp": [],
        **{name: [] for name in featurespec.TERMINAL_FEATURES},
    }  # fmt: skip
    widths = (("1d", DAY_US), ("7d", 7 * DAY_US))
    for lo_row in np.unique(rows.first[j]):
        hi_row = block_end[np.searchsorted(block_end, lo_row, side="right")]
        t = rows.t[lo_row:hi_row]
        flags = fraud[lo_row:hi_row]
        heard = reported[lo_row:hi_row]
        instants = np.unique(heard[flags & (heard <= now)])
        for r in instants[~np.isin(instants, t)].tolist():
            upto = int(np.searchsorted(t, r, side="right"))
            out["terminal_id"].append(rows.ids[lo_row])
            out["event_timestamp"].append(r)
            for suffix, width in widths:
                since = int(np.searchsorted(t, r - width, side="right"))
                out[f"terminal_txn_count_{suffix}"].append(upto - since)
            known_hi = int(np.searchsorted(t, r - delay_us, side="right"))
            for suffix, width_us in RISK_WINDOWS_US:
                known_lo = int(np.searchsorted(t, r - delay_us - width_us, side="right"))
                known = known_hi - known_lo
                counted = flags[known_lo:known_hi] & (heard[known_lo:known_hi] <= r)
                frauds = int(counted.sum())
                out[f"terminal_fraud_rate_{suffix}"].append(frauds / known if known else 0.0)
                out[f"terminal_labelled_txn_count_{suffix}"].append(known)
            known_lo = int(np.searchsorted(t, r - delay_us - FRAUD_WINDOW_US, side="right"))
            times = t[known_lo:known_hi][flags[known_lo:known_hi] & (heard[known_lo:known_hi] <= r)]
            none = featurespec.NO_KNOWN_FRAUD
            out["terminal_known_fraud_first_s"].append(times.min() / US if len(times) else none)
            out["terminal_known_fraud_last_s"].append(times.max() / US if len(times) else none)
    if not out["terminal_id"]:
        return None
    columns = {
        "terminal_id": np.asarray(out["terminal_id"], dtype=object),
        "event_timestamp": np.asarray(out["event_timestamp"], dtype=np.int64),
    }
    for name in featurespec.TERMINAL_FEATURES:
        counts = name.startswith(("terminal_txn_count", "terminal_labelled_txn_count"))
        columns[name] = np.asarray(out[name], dtype=np.int64 if counts else np.float64)
    keep = np.ones(len(columns["terminal_id"]), dtype=bool)
    return _table(columns, keep, featurespec.TERMINAL_FEATURES)


def _known_fraud_times(rows: _Rows, delay_us: int, width_us: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row at t: the times (epoch microseconds, float; NaN for none) of the earliest and
    the latest fraud of its entity inside the window ``(t - delay - width, t - delay]`` whose
    label was reported by t: the frauds its longest fraud rate counts.

    Fraud j counts for the rows of its entity with t in
    ``[max(t_j + delay, reported_j), t_j + delay + width)``. For frauds reported by
    t_j + delay both bounds grow with j, so the frauds counting for a row are a run of
    consecutive ones, found by two binary searches; a fraud reported later (rare) is spread
    over its rows one by one."""
    import numpy as np

    n = len(rows.t)
    first, last = np.full(n, np.nan), np.full(n, np.nan)
    fraud = rows.fraud
    j = np.flatnonzero(fraud)
    if len(j) == 0:
        return first, last
    t_j = rows.t[j]
    reported = rows.reported_us(delay_us)[j]

    def first_at_or_after(bound: np.ndarray) -> np.ndarray:
        # The first row of fraud j's entity with t >= bound (its entity's end if none).
        ranks = np.searchsorted(rows.times, bound - 1, side="right")
        return np.searchsorted(rows.key, rows.base[j] + ranks, side="left")

    opens = first_at_or_after(np.maximum(t_j + delay_us, reported))
    closes = first_at_or_after(t_j + delay_us + width_us)
    times = t_j.astype(np.float64)
    on_time = reported <= t_j + delay_us
    starts, ends, on_times = opens[on_time], closes[on_time], times[on_time]
    i = np.arange(n)
    newest = np.searchsorted(starts, i, side="right") - 1
    oldest = np.searchsorted(ends, i, side="right")
    counted = (oldest <= newest) & (newest >= 0)
    first[counted] = on_times[oldest[counted]]
    last[counted] = on_times[newest[counted]]
    late = ~on_time
    if late.any():
        lengths = np.maximum(closes[late] - opens[late], 0)
        offsets = np.cumsum(lengths) - lengths
        covered = np.repeat(opens[late], lengths) + (
            np.arange(int(lengths.sum())) - np.repeat(offsets, lengths)
        )
        values = np.repeat(times[late], lengths)
        np.fmin.at(first, covered, values)
        np.fmax.at(last, covered, values)
    return first, last


def _risk_columns(rows: _Rows, prefix: str, delay_us: int) -> dict[str, np.ndarray]:
    """Volume and label-delayed fraud rates of a merchant or terminal (docs/aggregation.md)."""
    import numpy as np

    hi, first = rows.end, rows.first
    columns = {
        f"{prefix}_txn_count_1d": hi - rows.after(DAY_US),
        f"{prefix}_txn_count_7d": hi - rows.after(7 * DAY_US),
    }
    fraud = rows.fraud
    flags = fraud.astype(np.int64)
    reported = rows.reported_us(delay_us)
    known_hi = rows.after(delay_us)
    for suffix, width_us in RISK_WINDOWS_US:
        known_lo = rows.after(delay_us + width_us)
        known = known_hi - known_lo
        frauds = _window_sum(flags, known_lo, known_hi, first)
        frauds = frauds - _unreported_frauds(rows, fraud, reported, delay_us, width_us)
        rate = np.divide(frauds, known, out=np.zeros(len(rows.t)), where=known > 0)
        columns[f"{prefix}_fraud_rate_{suffix}"] = rate
        columns[f"{prefix}_labelled_txn_count_{suffix}"] = known
    return columns


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
