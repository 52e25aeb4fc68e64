"""The live aggregation: decision and outcome events in, changed entity states and rows out.

``LiveAggregator`` keeps the card and merchant states in memory (least recently used ones
beyond ``cache_max`` are left to the state file), applies each event with the incremental
functions of ``domain.aggregation`` and remembers which entities changed since the rows were
last written (``rows``, ``rows_written``) and since the last checkpoint (``checkpoint``).

Every apply is idempotent (a transaction id counts once, a label no newer than the held one
changes nothing), so events consumed again after a crash leave the states as they were.

Outcomes are keyed on the log by transaction, decisions by card: on a partitioned log an
outcome can arrive before its decision. The aggregator finds an outcome's merchant through
the transaction index; an outcome for a transaction it has not seen yet is held (at most
``max_pending_labels``, oldest report dropped first) and applied when the decision comes.
A DISPUTED outcome is no label: the merchant fraud rate waits for FRAUD or LEGITIMATE.

No I/O besides the state store, no clock, no transport: tested without servers.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fraud.v1 import events_pb2, outcomes_pb2
from services.domain import featurespec
from services.domain.aggregation import (
    CardState,
    Change,
    Label,
    MerchantState,
    TransactionEvent,
    apply_card,
    apply_label,
    apply_merchant,
    card_row,
    merchant_row,
)
from services.featurestore.writer import Row
from services.updater.state import IndexEntry, StateStore

_US = 1_000_000
_NANOS_PER_US = 1_000

S = TypeVar("S")


class View(enum.StrEnum):
    """The feature views the updater writes (a metric label)."""

    CARD = "card"
    MERCHANT = "merchant"


class _Cache(Generic[S]):
    """States by entity id: loaded from the store on a miss, least recently used evicted.

    Only states saved by a checkpoint are evicted (``trim`` runs after one), so nothing
    unsaved is ever dropped.
    """

    def __init__(self, load: Callable[[str], S | None], cap: int) -> None:
        self._load = load
        self._cap = cap
        self._states: OrderedDict[str, S] = OrderedDict()
        self.dirty: set[str] = set()
        """Entities changed since the last checkpoint."""
        self.touched: set[str] = set()
        """Entities whose rows must be written since the last ``rows_written``."""

    def get(self, key: str) -> S | None:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        state = self._load(key)
        if state is not None:
            self._states[key] = state
        return state

    def put(self, key: str, state: S, changed: bool) -> None:
        self._states[key] = state
        self._states.move_to_end(key)
        self.touched.add(key)
        if changed:
            self.dirty.add(key)

    def peek(self, key: str) -> S:
        return self._states[key]

    def trim(self) -> None:
        while len(self._states) > self._cap:
            key = next(iter(self._states))
            if key in self.dirty or key in self.touched:
                break
            del self._states[key]

    def __len__(self) -> int:
        return len(self._states)


@dataclass
class Applied:
    """What one event did, for the metrics."""

    changes: list[tuple[View, Change]] = field(default_factory=list)
    """Per view the event reached: what it changed."""
    evicted_by_cap: list[tuple[View, int]] = field(default_factory=list)
    """Per view: events evicted by the state caps (windows now undercount)."""


def _micros(stamp: object) -> int:
    """Epoch microseconds of a Timestamp, floored (as the batch tables floor nanoseconds)."""
    return stamp.seconds * _US + stamp.nanos // _NANOS_PER_US  # type: ignore[attr-defined]


def transaction_of(event: events_pb2.DecisionEvent) -> TransactionEvent:
    """The incremental path's view of a decision: the request's fields, no label.

    Countries and merchant category are not part of a request: the states keep the latest
    ones the history knew (``LatestCode``)."""
    return TransactionEvent(
        transaction_id=event.transaction_id,
        timestamp_s=_micros(event.timestamp) / _US,
        card_id=event.card_id,
        merchant_id=event.merchant_id,
        amount_minor=event.amount_minor,
        currency=event.currency,
        channel=(
            featurespec.CARD_NOT_PRESENT if event.card_not_present else featurespec.CARD_PRESENT
        ),
    )


_COUNTED = (Change.APPLIED, Change.LATE)
_MERCHANT_HORIZON_US = MerchantState().horizon_us


class LiveAggregator:
    """Applies events to the entity states; see the module docstring."""

    def __init__(self, store: StateStore, cache_max: int, max_pending_labels: int) -> None:
        self._store = store
        self._cards: _Cache[CardState] = _Cache(store.card, cache_max)
        self._merchants: _Cache[MerchantState] = _Cache(store.merchant, cache_max)
        self._max_pending = max_pending_labels
        self._index: dict[str, tuple[str, int]] = {}
        """Transactions counted since the last checkpoint: id → (merchant, t_us)."""
        self._pending: dict[str, Label] = dict(store.pending_labels())
        self._released: set[str] = set()
        self._held: set[str] = set()
        self._newest_us = 0
        self.applied_since_checkpoint = 0
        """Events applied (decisions and outcomes) since the last checkpoint."""
        self.labels_dropped = 0
        """Held outcomes dropped because ``max_pending_labels`` were held."""

    # --- applying ----------------------------------------------------------------------

    def apply_decision(self, event: events_pb2.DecisionEvent) -> Applied:
        """Counts one decided transaction in its card's and merchant's states."""
        tx = transaction_of(event)
        out = Applied()
        card = apply_card(self._cards.get(tx.card_id), tx)
        self._cards.put(tx.card_id, card.state, card.change in _COUNTED)
        out.changes.append((View.CARD, card.change))
        merchant = apply_merchant(self._merchants.get(tx.merchant_id), tx)
        counted = merchant.change in _COUNTED
        self._merchants.put(tx.merchant_id, merchant.state, counted)
        out.changes.append((View.MERCHANT, merchant.change))
        for view, evicted in (
            (View.CARD, card.evicted_by_cap),
            (View.MERCHANT, merchant.evicted_by_cap),
        ):
            if evicted:
                out.evicted_by_cap.append((view, evicted))
        if counted:
            t_us = round(tx.timestamp_s * _US)
            self._index[tx.transaction_id] = (tx.merchant_id, t_us)
            self._newest_us = max(self._newest_us, t_us)
            held = self._take_pending(tx.transaction_id)
            if held is not None:
                label = apply_label(
                    merchant.state, tx.transaction_id, held.is_fraud, held.reported_us / _US
                )
                out.changes.append((View.MERCHANT, label.change))
        self.applied_since_checkpoint += 1
        return out

    def apply_outcome(self, event: events_pb2.OutcomeEvent) -> Applied:
        """Applies a FRAUD or LEGITIMATE outcome to its merchant's fraud-rate state."""
        out = Applied()
        if event.outcome == outcomes_pb2.OUTCOME_FRAUD:
            is_fraud = True
        elif event.outcome == outcomes_pb2.OUTCOME_LEGITIMATE:
            is_fraud = False
        else:
            return out  # disputed (or unknown): not a label
        tid = event.transaction_id
        label = Label(is_fraud, _micros(event.reported_at))
        merchant_id = self._merchant_of(tid)
        if merchant_id is None:
            out.changes.append((View.MERCHANT, self._hold(tid, label)))
        else:
            state = self._merchants.get(merchant_id)
            update = apply_label(state, tid, label.is_fraud, label.reported_us / _US)
            changed = update.change is Change.APPLIED or update.change is Change.PENDING
            self._merchants.put(merchant_id, update.state, changed)
            out.changes.append((View.MERCHANT, update.change))
        self.applied_since_checkpoint += 1
        return out

    def _merchant_of(self, tid: str) -> str | None:
        recent = self._index.get(tid)
        if recent is not None:
            return recent[0]
        return self._store.merchant_of(tid)

    def _hold(self, tid: str, label: Label) -> Change:
        held = self._pending.get(tid)
        if held is not None and not (
            label.reported_us > held.reported_us
            or (label.reported_us == held.reported_us and label != held)
        ):
            return Change.DUPLICATE
        self._pending[tid] = label
        self._held.add(tid)
        self._released.discard(tid)
        while len(self._pending) > self._max_pending:
            oldest = min(self._pending, key=lambda k: self._pending[k].reported_us)
            self._drop_pending(oldest)
            self.labels_dropped += 1
        return Change.PENDING

    def _take_pending(self, tid: str) -> Label | None:
        if not self._pending:
            return None
        label = self._pending.get(tid)
        if label is not None:
            self._drop_pending(tid)
        return label

    def _drop_pending(self, tid: str) -> None:
        del self._pending[tid]
        self._held.discard(tid)
        self._released.add(tid)

    def restore_live_rows(self) -> dict[str, int]:
        """Marks every entity live events have changed (per the state file) as reached, so
        that its row is written again from its state; returns how many per view.

        Materialization writes the batch rows, which know nothing of live events: after a
        ``features materialize`` the store would hold older rows for these entities until
        their next event. Entities only the seed knows have the batch rows already.
        """
        counts = {}
        for view, cache, states in (
            (View.CARD, self._cards, self._store.live_cards()),
            (View.MERCHANT, self._merchants, self._store.live_merchants()),
        ):
            n = 0
            for key, state in states:
                cache.put(key, state, changed=False)  # type: ignore[arg-type]
                n += 1
            counts[view.value] = n
        return counts

    # --- rows and checkpoints ----------------------------------------------------------

    def rows(self) -> tuple[list[Row], list[Row]]:
        """The current rows of every entity an event reached since ``rows_written``."""
        cards = [
            Row(key, _newest_s(state.events.times_us), row)
            for key in sorted(self._cards.touched)
            if (row := card_row(state := self._cards.peek(key))) is not None
        ]
        merchants = [
            Row(key, _newest_s(m.events.times_us), row)
            for key in sorted(self._merchants.touched)
            if (row := merchant_row(m := self._merchants.peek(key))) is not None
        ]
        return cards, merchants

    def rows_written(self) -> None:
        """Marks the rows ``rows`` gave as stored."""
        self._cards.touched.clear()
        self._merchants.touched.clear()

    @property
    def rows_pending(self) -> bool:
        """True when entities were reached whose rows were not taken yet."""
        return bool(self._cards.touched or self._merchants.touched)

    def checkpoint(self) -> None:
        """Saves every changed state, the new index entries and the held labels in one
        durable transaction; then lets the caches shrink to their bound."""
        index: list[IndexEntry] = [(tid, m, t) for tid, (m, t) in self._index.items()]
        prune = None
        if self._newest_us:
            prune = self._newest_us - _MERCHANT_HORIZON_US
            # A label reported at r is for a transaction at or before r: once r is beyond
            # every merchant window, that transaction can only come too old.
            for tid in [k for k, v in self._pending.items() if v.reported_us <= prune]:
                self._drop_pending(tid)
                self.labels_dropped += 1
        self._store.save(
            cards=((k, self._cards.peek(k)) for k in self._cards.dirty),
            merchants=((k, self._merchants.peek(k)) for k in self._merchants.dirty),
            transactions=index,
            labels_held=((k, self._pending[k]) for k in self._held if k in self._pending),
            labels_released=self._released - self._held,
            prune_before_us=prune,
        )
        self._cards.dirty.clear()
        self._merchants.dirty.clear()
        self._index.clear()
        self._held.clear()
        self._released.clear()
        self.applied_since_checkpoint = 0
        self._cards.trim()
        self._merchants.trim()

    def sizes(self) -> dict[View, int]:
        """States held in memory per view."""
        return {View.CARD: len(self._cards), View.MERCHANT: len(self._merchants)}

    @property
    def pending_labels(self) -> int:
        """Outcomes held for transactions not seen yet."""
        return len(self._pending)


def _newest_s(times_us: list[int]) -> float:
    return times_us[-1] / _US
