"""The incremental path: a small state per entity, one event at a time (``docs/aggregation.md``).

Every function returns the entity's row as of its newest transaction: the same row the batch
table holds at that (entity, timestamp).
"""

from __future__ import annotations

import bisect
import enum
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from services.domain import featurespec
from services.domain.aggregation.codec import StateReader, StateWriter
from services.domain.aggregation.schema import (
    CARD_HORIZON_US,
    DAY_US,
    FRAUD_WINDOW_US,
    HOUR_US,
    LABEL_DELAY_US,
    MAX_CARD_EVENTS,
    MAX_MERCHANT_EVENTS,
    MAX_PENDING_LABELS,
    RISK_WINDOWS_US,
    US,
    FeatureRow,
    TransactionEvent,
    event_micros,
)


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


def _seconds_to_micros(seconds: float) -> int:
    if not math.isfinite(seconds):
        raise ValueError("timestamp is not finite")
    return round(seconds * US)


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

    @classmethod
    def decoded(cls, ids: list[str], times_us: list[int], eur: list[float]) -> Events:
        """Events from their decoded parts (``StateReader.events``)."""
        return cls(times_us, ids, eur, dict(zip(ids, times_us, strict=True)))

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
        out = StateWriter(b"C1")
        out.ints(self.duplicates, self.too_old, self.evicted_by_cap)
        out.latest(self.home_country)
        out.events(self.events)
        out.interned(self.merchants)
        return out.bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> CardState:
        """Decodes ``to_bytes`` output."""
        read = StateReader(data, b"C1")
        duplicates, too_old, evicted = read.ints(3)
        home = LatestCode(*read.latest())
        events = Events.decoded(*read.events())
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
    lo_1h, lo_24h = since(times, newest - HOUR_US), since(times, newest - DAY_US)
    lo_7d, lo_30d = since(times, newest - 7 * DAY_US), since(times, newest - CARD_HORIZON_US)
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
        "card_last_txn_s": newest // US,
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
    if ev.times_us and t_us <= ev.newest_us - CARD_HORIZON_US:
        state.too_old += 1
        return Update(state, card_row, Change.TOO_OLD, 0)
    k, newest = ev.insert(t_us, tid, eur)
    state.merchants.insert(k, event.merchant_id)
    state.home_country.offer(event.card_home_country, t_us, tid)
    gone, capped = ev.evict(CARD_HORIZON_US, MAX_CARD_EVENTS)
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

    label_delay_us: int = LABEL_DELAY_US
    """Time from a transaction to the moment its label may be used (docs/aggregation.md)."""
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
    reported_us: int = 0
    """A terminal's: the newest report of a label applied after its newest event (0 for
    none). Its row is as of this instant when it is later than the newest event: a label
    moves the terminal's row when it arrives, not only at the terminal's next payment."""

    @property
    def row_us(self) -> int:
        """The instant the entity's row is as of: its newest event, or a later label report."""
        return max(self.events.newest_us, self.reported_us)

    @property
    def horizon_us(self) -> int:
        """Age beyond which an event counts in no window."""
        return self.label_delay_us + FRAUD_WINDOW_US

    def to_bytes(self) -> bytes:
        """A compact, versioned binary encoding (``from_bytes`` reads it back)."""
        out = StateWriter(b"M2")
        out.ints(
            self.label_delay_us,
            self.duplicates,
            self.too_old,
            self.evicted_by_cap,
            self.labels_dropped,
            self.reported_us,
        )
        out.latest(self.category)
        out.latest(self.country)
        out.events(self.events)
        out.labels(self.labels)
        out.labels(self.pending)
        return out.bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> MerchantState:
        """Decodes ``to_bytes`` output (and ``M1``, the encoding before ``reported_us``)."""
        before = data[:2] == b"M1"
        read = StateReader(data, b"M1" if before else b"M2")
        delay, duplicates, too_old, evicted, dropped = read.ints(5)
        (reported,) = (0,) if before else read.ints(1)
        category, country = LatestCode(*read.latest()), LatestCode(*read.latest())
        events = Events.decoded(*read.events())
        labels, pending = _labels(read.labels()), _labels(read.labels())
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
            reported,
        )


def merchant_row(state: MerchantState) -> FeatureRow | None:
    """The merchant's features as of its newest event (``featurespec.MERCHANT_FEATURES`` order)."""
    ev = state.events
    n = len(ev)
    if n == 0:
        return None
    lo_28d = ev.since(ev.newest_us - 28 * DAY_US)
    risk = _risk_row(state, "merchant")
    row = {name: risk.get(name, _NAN) for name in featurespec.MERCHANT_FEATURES}
    row["merchant_amount_mean_28d"] = sum(ev.eur[lo_28d:]) / (n - lo_28d)
    row["merchant_category"] = state.category.feature()
    row["merchant_country"] = state.country.feature()
    return row


def terminal_row(state: MerchantState) -> FeatureRow | None:
    """The terminal's features as of its newest event, a payment or a later label report
    (``MerchantState.row_us``; ``featurespec.TERMINAL_FEATURES`` order)."""
    if len(state.events) == 0:
        return None
    newest = state.row_us
    row = _risk_row(state, "terminal", newest)
    # The frauds the longest fraud rate counts: inside its window, reported by now.
    known_until = newest - state.label_delay_us
    known_from = known_until - FRAUD_WINDOW_US
    where = state.events.where
    counted = [
        t_us
        for tid, label in state.labels.items()
        if label.is_fraud
        and label.reported_us <= newest
        and known_from < (t_us := where[tid]) <= known_until
    ]
    # 0 (not missing) while it counts none: the absence of a fraud is a value.
    row["terminal_known_fraud_first_s"] = (
        min(counted) / US if counted else featurespec.NO_KNOWN_FRAUD
    )
    row["terminal_known_fraud_last_s"] = (
        max(counted) / US if counted else featurespec.NO_KNOWN_FRAUD
    )
    return row


def _risk_row(state: MerchantState, prefix: str, newest: int | None = None) -> FeatureRow:
    """Volume and label-delayed fraud rates as of the newest event, or of ``newest`` (an
    instant at or after it; docs/aggregation.md)."""
    ev = state.events
    n = len(ev)
    newest = ev.newest_us if newest is None else newest
    row: FeatureRow = {
        f"{prefix}_txn_count_1d": n - ev.since(newest - DAY_US),
        f"{prefix}_txn_count_7d": n - ev.since(newest - 7 * DAY_US),
    }
    known_until = newest - state.label_delay_us
    until = ev.since(known_until)
    where = ev.where
    fraud_times = [
        where[tid]
        for tid, label in state.labels.items()
        if label.is_fraud and label.reported_us <= newest
    ]
    for suffix, width_us in RISK_WINDOWS_US:
        known_from = known_until - width_us
        known = until - ev.since(known_from)
        frauds = sum(1 for t_us in fraud_times if known_from < t_us <= known_until)
        row[f"{prefix}_fraud_rate_{suffix}"] = frauds / known if known else 0.0
        row[f"{prefix}_labelled_txn_count_{suffix}"] = known
    return row


def _labels(decoded: Iterable[tuple[str, bool, int]]) -> dict[str, Label]:
    """Labels from their decoded parts (``StateReader.labels``)."""
    return {tid: Label(is_fraud, reported_us) for tid, is_fraud, reported_us in decoded}


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
    caller checks is set); the same rules as ``apply_merchant``, the terminal's row (as of a
    held label's report when that is later: ``apply_terminal_label``)."""
    return _apply_risk(state, event, terminal_row, codes=False, label_rows=True)


def _apply_risk(
    state: MerchantState | None,
    event: TransactionEvent,
    row: Callable[[MerchantState], FeatureRow | None],
    *,
    codes: bool,
    label_rows: bool = False,
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
    # The held label is put whatever the entity; only a terminal's row moves with it.
    put = held is not None and _put_label(state, tid, held, keep_legit=True)
    if put and label_rows and held is not None and held.is_fraud:
        _moves_row(state, held.reported_us)
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
    """``apply_label`` for the state of the transaction's terminal; returns the terminal's row.

    Unlike a merchant's, a terminal's row moves when a label for one of its counted
    transactions is reported after its newest event: the row is then as of the report
    (``MerchantState.row_us``), as the batch table's row at that instant is. A terminal takes
    few payments a day, and its row as of its previous payment would not show the label
    until its next one (docs/aggregation.md)."""
    update = _apply_label(state, transaction_id, is_fraud, reported_at_s, terminal_row)
    if update.change is Change.APPLIED and is_fraud:
        _moves_row(update.state, update.state.labels[transaction_id].reported_us)
    return update


def move_to_reports(state: MerchantState, now_us: int) -> bool:
    """Moves a terminal's row to its latest fraud report after the instant its row is as of
    and by ``now_us`` (the clock: the newest payment applied); True when it moved.

    A label the history carries is reported at timestamp + delay, an instant at which the
    terminal may take no event: the batch table has a row there (once a payment of the frame
    is as late), and this brings the state's row to it when the clock passes it."""
    row_us = state.row_us
    latest = max(
        (
            label.reported_us
            for label in state.labels.values()
            if label.is_fraud and row_us < label.reported_us <= now_us
        ),
        default=0,
    )
    if not latest:
        return False
    state.reported_us = latest
    return True


def reports_after(state: MerchantState, now_us: int) -> list[int]:
    """The distinct instants after ``now_us`` (and after the row's) at which a fraud label the
    state holds is reported: where ``move_to_reports`` will move the row once the clock
    passes them."""
    row_us = max(state.row_us, now_us)
    return sorted(
        {
            label.reported_us
            for label in state.labels.values()
            if label.is_fraud and label.reported_us > row_us
        }
    )


def _moves_row(state: MerchantState, reported_us: int) -> None:
    """A terminal's row is as of a label reported after its newest event."""
    if reported_us > state.events.newest_us:
        state.reported_us = max(state.reported_us, reported_us)


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
