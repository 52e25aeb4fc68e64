"""The live aggregation: decision and outcome events in, changed entity states and rows out.

``LiveAggregator`` keeps the card, merchant and terminal states in memory, applies each event
with the incremental functions of ``domain.aggregation``, remembers which entities' rows must
be written, and makes them durable as a journal plus snapshots in the state file
(``state.py``). How checkpoints, snapshots, held outcomes and crash recovery work:
``docs/liveloop.md``, "The feature updater".

No I/O besides the state store, no clock reads besides the snapshot budget, no transport:
tested without servers.
"""

from __future__ import annotations

import enum
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, Protocol, TypeVar

from fraud.v1 import events_pb2, outcomes_pb2
from services.domain import featurespec
from services.domain.aggregation import (
    CardState,
    Change,
    Events,
    FeatureRow,
    Label,
    MerchantState,
    TransactionEvent,
    apply_card,
    apply_label,
    apply_merchant,
    apply_terminal,
    apply_terminal_label,
    card_row,
    merchant_row,
    move_to_reports,
    terminal_row,
)
from services.featurestore.writer import Row
from services.updater.state import StateStore

_US = 1_000_000
_NANOS_PER_US = 1_000


class _State(Protocol):
    events: Events

    def to_bytes(self) -> bytes: ...


S = TypeVar("S", bound=_State)


class View(enum.StrEnum):
    """The feature views the updater writes (a metric label)."""

    CARD = "card"
    MERCHANT = "merchant"
    TERMINAL = "terminal"


ALL_VIEWS = frozenset(View)
CARD_VIEWS = frozenset({View.CARD})
"""What an updater of a partitioned group applies from the card-keyed log (``partitioned.py``)."""
MERCHANT_VIEWS = frozenset({View.MERCHANT, View.TERMINAL})
"""What it applies from the merchant-keyed topic: a terminal's windows live with its merchant's."""


class _Cache(Generic[S]):
    """States by entity id: loaded from the store on a miss, least recently used evicted.

    ``unsaved`` maps each entity changed since its last snapshot to the journal sequence of
    its oldest such change, in that order (sequences only grow). Entities in it, or whose
    rows are still to be written, are never evicted.
    """

    def __init__(self, load: Callable[[str], S | None], cap: int) -> None:
        self._load = load
        self._cap = cap
        self._states: OrderedDict[str, S] = OrderedDict()
        self.unsaved: dict[str, int] = {}
        self.touched: dict[str, FeatureRow | None] = {}
        """Entities whose rows must be written, with the row when already computed."""

    def get(self, key: str) -> S | None:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        state = self._load(key)
        if state is not None:
            self._states[key] = state
        return state

    def put(self, key: str, state: S, row: FeatureRow | None, seq: int | None) -> None:
        """Stores ``state``; its row must be written; ``seq``: the journal sequence of the
        change (None when the state did not change)."""
        self._states[key] = state
        self._states.move_to_end(key)
        self.touched[key] = row
        if seq is not None:
            self.unsaved.setdefault(key, seq)

    def peek(self, key: str) -> S:
        return self._states[key]

    def oldest_unsaved(self) -> int | None:
        return next(iter(self.unsaved.values()), None)

    def snapshot_oldest(self) -> tuple[str, bytes]:
        key = next(iter(self.unsaved))
        del self.unsaved[key]
        return key, self._states[key].to_bytes()

    def trim(self) -> None:
        if len(self._states) <= self._cap:
            return
        for key in list(self._states):
            if len(self._states) <= self._cap:
                break
            if key not in self.unsaved and key not in self.touched:
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
    ones the history knew (``LatestCode``). An empty ``terminal_id`` names no terminal."""
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
        terminal_id=event.terminal_id or None,
    )


class RowBatch(NamedTuple):
    """The rows to write, per view."""

    cards: list[Row]
    merchants: list[Row]
    terminals: list[Row]


_COUNTED = (Change.APPLIED, Change.LATE)
_CHANGED = (Change.APPLIED, Change.PENDING)
"""What a label does to a state that must be saved."""
_MERCHANT_HORIZON_US = MerchantState().horizon_us
"""Also a terminal's: its state is a MerchantState with the same windows and delay."""


class LiveAggregator:
    """Applies events to the entity states (docs/liveloop.md, "The feature updater")."""

    def __init__(
        self,
        store: StateStore,
        cache_max: int,
        max_pending_labels: int,
        snapshot_budget_s: float = 0.01,
        journal_max_events: int = 200_000,
        views: frozenset[View] = ALL_VIEWS,
        owns_merchant: Callable[[str], bool] | None = None,
    ) -> None:
        """``owns_merchant``: which merchants' (and their terminals') windows this aggregator
        applies, for the seed's due reports (None: all; a partition's: its merchants)."""
        if views not in (ALL_VIEWS, CARD_VIEWS, MERCHANT_VIEWS):
            raise ValueError(f"views must be all, the card's, or the merchant's: {set(views)}")
        self._store = store
        self._views = views
        self._cards_here = View.CARD in views
        self._merchants_here = View.MERCHANT in views
        self._cards: _Cache[CardState] = _Cache(store.card, cache_max)
        self._merchants: _Cache[MerchantState] = _Cache(store.merchant, cache_max)
        self._terminals: _Cache[MerchantState] = _Cache(store.terminal, cache_max)
        self._caches: dict[View, _Cache[CardState] | _Cache[MerchantState]] = {
            View.CARD: self._cards,
            View.MERCHANT: self._merchants,
            View.TERMINAL: self._terminals,
        }
        self._max_pending = max_pending_labels
        self._snapshot_budget_s = snapshot_budget_s
        self._journal_max = journal_max_events
        self._index: dict[str, tuple[str, str, int]] = {}
        """Transactions counted since the last checkpoint: id → (merchant, terminal or '',
        t_us)."""
        self._pending: dict[str, Label] = dict(store.pending_labels())
        self._released: set[str] = set()
        self._held: set[str] = set()
        self._taking: dict[str, tuple[int, Label]] = {}
        """Held labels a decision took (id → the decision's seq and the label), kept in the
        state file's held labels until snapshots cover that seq: were they dropped from it
        sooner, a restart that replays the decision from the journal onto an older snapshot
        would find no label to apply."""
        self._newest_us = 0
        self._journal: list[tuple[int, bytes]] = []
        self._first_seq, self._seq = store.journal_bounds()
        self._due: list[tuple[int, str]] = []
        """The seed's fraud reports still to come: (reported_us, terminal) in a heap."""
        if self._merchants_here:
            self._due = [
                (reported_us, terminal_id)
                for terminal_id, merchant_id, reported_us in store.due_reports()
                if owns_merchant is None or owns_merchant(merchant_id)
            ]
            heapq.heapify(self._due)
        self.applied_since_checkpoint = 0
        """Events applied (decisions and outcomes) since the last checkpoint."""
        self.labels_dropped = 0
        """Held outcomes dropped: too many held, or too old to change any window."""
        self.replayed = self._replay_journal()
        """Journal events applied again at start (after the last snapshots)."""

    # --- applying ----------------------------------------------------------------------

    def apply(self, envelope: events_pb2.EventEnvelope, raw: bytes | None = None) -> Applied:
        """Applies one event and journals it (``raw``: its serialized form, if at hand).
        Raises ValueError for an envelope without an event."""
        kind = envelope.WhichOneof("event")
        if kind is None:
            raise ValueError("the envelope carries no event")
        self._seq += 1
        seq = self._seq
        self._journal.append((seq, raw if raw is not None else envelope.SerializeToString()))
        self.applied_since_checkpoint += 1
        if kind == "decision":
            return self._decision(envelope.decision, seq)
        return self._outcome(envelope.outcome, seq)

    def apply_decision(self, event: events_pb2.DecisionEvent) -> Applied:
        """Counts one decided transaction in its card's, merchant's and terminal's states."""
        return self.apply(events_pb2.EventEnvelope(decision=event))

    def apply_outcome(self, event: events_pb2.OutcomeEvent) -> Applied:
        """Applies a FRAUD or LEGITIMATE outcome to its merchant's and terminal's fraud-rate
        states."""
        return self.apply(events_pb2.EventEnvelope(outcome=event))

    def _decision(self, event: events_pb2.DecisionEvent, seq: int) -> Applied:
        tx = transaction_of(event)
        out = Applied()
        if self._cards_here:
            card = apply_card(self._cards.get(tx.card_id), tx)
            # Rows are computed once per poll batch (``rows``), not per event.
            self._cards.put(tx.card_id, card.state, None, seq if card.change in _COUNTED else None)
            out.changes.append((View.CARD, card.change))
            if card.evicted_by_cap:
                out.evicted_by_cap.append((View.CARD, card.evicted_by_cap))
            if not self._merchants_here:
                return out
        merchant = apply_merchant(self._merchants.get(tx.merchant_id), tx)
        merchant_counted = merchant.change in _COUNTED
        out.changes.append((View.MERCHANT, merchant.change))
        if merchant.evicted_by_cap:
            out.evicted_by_cap.append((View.MERCHANT, merchant.evicted_by_cap))
        terminal_id = tx.terminal_id or ""
        terminal = None
        if terminal_id:
            terminal = apply_terminal(self._terminals.get(terminal_id), tx)
            out.changes.append((View.TERMINAL, terminal.change))
            if terminal.evicted_by_cap:
                out.evicted_by_cap.append((View.TERMINAL, terminal.evicted_by_cap))
        terminal_counted = terminal is not None and terminal.change in _COUNTED
        # A terminal's horizon follows its own newest event: it may count a late transaction
        # its merchant finds too old, and an outcome of it must still find the terminal.
        if merchant_counted or terminal_counted:
            t_us = round(tx.timestamp_s * _US)
            self._index[tx.transaction_id] = (tx.merchant_id, terminal_id, t_us)
            self._newest_us = max(self._newest_us, t_us)
            held = self._take_pending(tx.transaction_id, seq)
            if held is not None:
                reported_s = held.reported_us / _US
                label = apply_label(merchant.state, tx.transaction_id, held.is_fraud, reported_s)
                out.changes.append((View.MERCHANT, label.change))
                merchant_counted = merchant_counted or label.change in _CHANGED
                if terminal is not None:
                    at = apply_terminal_label(
                        terminal.state, tx.transaction_id, held.is_fraud, reported_s
                    )
                    out.changes.append((View.TERMINAL, at.change))
                    terminal_counted = terminal_counted or at.change in _CHANGED
        self._merchants.put(tx.merchant_id, merchant.state, None, seq if merchant_counted else None)
        if terminal is not None:
            self._terminals.put(
                terminal_id, terminal.state, None, seq if terminal_counted else None
            )
        if self._due and self._due[0][0] <= self._newest_us:
            self._move_due(seq)
        return out

    def _move_due(self, seq: int) -> None:
        """Moves the rows of the terminals whose seeded fraud reports the clock (the newest
        payment applied) has passed, as the batch table has a row at each such report
        (docs/aggregation.md, "A label moves the terminal's row"). A move made again, after a
        restart, finds the row already there and changes nothing."""
        due = self._due
        while due and due[0][0] <= self._newest_us:
            _, terminal_id = heapq.heappop(due)
            state = self._terminals.get(terminal_id)
            if state is not None and move_to_reports(state, self._newest_us):
                self._terminals.put(terminal_id, state, None, seq)

    def _outcome(self, event: events_pb2.OutcomeEvent, seq: int) -> Applied:
        out = Applied()
        if not self._merchants_here:
            raise ValueError("outcomes are applied where the merchant windows are")
        if event.outcome == outcomes_pb2.OUTCOME_FRAUD:
            is_fraud = True
        elif event.outcome == outcomes_pb2.OUTCOME_LEGITIMATE:
            is_fraud = False
        else:
            return out  # disputed (or unknown): not a label
        tid = event.transaction_id
        label = Label(is_fraud, _micros(event.reported_at))
        entities = self._entities_of(tid)
        if entities is None:
            out.changes.append((View.MERCHANT, self._hold(tid, label)))
            return out
        merchant_id, terminal_id = entities
        reported_s = label.reported_us / _US
        update = apply_label(self._merchants.get(merchant_id), tid, is_fraud, reported_s)
        changed = update.change in _CHANGED
        self._merchants.put(merchant_id, update.state, None, seq if changed else None)
        out.changes.append((View.MERCHANT, update.change))
        if terminal_id:
            at = apply_terminal_label(self._terminals.get(terminal_id), tid, is_fraud, reported_s)
            changed = at.change in _CHANGED
            self._terminals.put(terminal_id, at.state, None, seq if changed else None)
            out.changes.append((View.TERMINAL, at.change))
        return out

    def _entities_of(self, tid: str) -> tuple[str, str] | None:
        """The merchant and terminal ('' for none) of a counted transaction."""
        recent = self._index.get(tid)
        if recent is not None:
            return recent[0], recent[1]
        return self._store.entities_of(tid)

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
        self._taking.pop(tid, None)
        while len(self._pending) > self._max_pending:
            oldest = min(self._pending, key=lambda k: self._pending[k].reported_us)
            self._drop_pending(oldest)
            self.labels_dropped += 1
        return Change.PENDING

    def _take_pending(self, tid: str, seq: int) -> Label | None:
        """The label held for ``tid``, taken by its decision (event ``seq``)."""
        if not self._pending:
            return None
        label = self._pending.pop(tid, None)
        if label is not None:
            self._held.discard(tid)
            self._taking[tid] = (seq, label)
        return label

    def _drop_pending(self, tid: str) -> None:
        del self._pending[tid]
        self._held.discard(tid)
        self._released.add(tid)

    def _replay_journal(self) -> int:
        """Applies the journal again to the snapshots (at start; docs/liveloop.md)."""
        n = 0
        for seq, raw in self._store.journal():
            envelope = events_pb2.EventEnvelope.FromString(raw)
            if envelope.WhichOneof("event") == "decision":
                self._decision(envelope.decision, seq)
            elif envelope.WhichOneof("event") == "outcome":
                self._outcome(envelope.outcome, seq)
            n += 1
        # Already journaled and indexed; their rows are written again (touched).
        self._journal.clear()
        return n

    def restore_live_rows(self) -> dict[str, int]:
        """Marks every entity live events have changed (per the state file) as reached, so
        that its row is written again from its state; returns how many per view.

        Materialization writes the batch rows, which know nothing of live events: after a
        ``features materialize`` the store would hold older rows for these entities until
        their next event. Entities only the seed knows have the batch rows already.
        """
        counts = {}
        for view, states in (
            (View.CARD, self._store.live_cards()),
            (View.MERCHANT, self._store.live_merchants()),
            (View.TERMINAL, self._store.live_terminals()),
        ):
            cache = self._caches[view]
            n = 0
            for key, state in states:
                if key not in cache.unsaved:  # the journal brought a newer state
                    cache.put(key, state, None, None)  # type: ignore[arg-type]
                n += 1
            counts[view.value] = n
        return counts

    # --- rows and checkpoints ----------------------------------------------------------

    def rows(self) -> RowBatch:
        """The current rows of every entity an event reached since ``rows_written``."""
        return RowBatch(
            _rows(self._cards, card_row),
            _rows(self._merchants, merchant_row),
            _rows(self._terminals, terminal_row),
        )

    def rows_written(self) -> None:
        """Marks the rows ``rows`` gave as stored."""
        for cache in self._caches.values():
            cache.touched.clear()

    @property
    def rows_pending(self) -> bool:
        """True when entities were reached whose rows were not taken yet."""
        return any(cache.touched for cache in self._caches.values())

    def checkpoint(self, meta: dict[str, str] | None = None) -> None:
        """Journals the events applied since the last checkpoint, with the new index entries,
        the held labels and a budget of snapshots, in one durable transaction (with ``meta``:
        the log position of a partition's state); then lets the caches shrink to their bound."""
        prune = None
        if self._newest_us:
            prune = self._newest_us - _MERCHANT_HORIZON_US
            # A label reported at r is for a transaction at or before r: once r is beyond
            # every merchant (and terminal) window, that transaction can only come too old.
            for tid in [k for k, v in self._pending.items() if v.reported_us <= prune]:
                self._drop_pending(tid)
                self.labels_dropped += 1
        snapshots = self._snapshots()
        oldest = [s for c in self._caches.values() if (s := c.oldest_unsaved()) is not None]
        keep_from = min(oldest) if oldest else self._seq + 1
        # A taken label leaves the file once every state its decision changed is saved.
        for tid, (seq, _) in list(self._taking.items()):
            if seq < keep_from:
                del self._taking[tid]
                self._released.add(tid)
        self._store.save(
            cards=snapshots[View.CARD],
            merchants=snapshots[View.MERCHANT],
            terminals=snapshots[View.TERMINAL],
            transactions=[(tid, m, t, t_us) for tid, (m, t, t_us) in self._index.items()],
            labels_held=[
                *((k, self._pending[k]) for k in self._held if k in self._pending),
                *((k, label) for k, (_, label) in self._taking.items()),
            ],
            labels_released=self._released - self._held - self._taking.keys(),
            prune_before_us=prune,
            journal=self._journal,
            journal_from=keep_from,
            meta=meta,
        )
        self._first_seq = keep_from
        self._journal = []
        self._index.clear()
        self._held.clear()
        self._released.clear()
        self.applied_since_checkpoint = 0
        for cache in self._caches.values():
            cache.trim()

    def _snapshots(self) -> dict[View, list[tuple[str, bytes]]]:
        """Serializes the entities with the oldest unsaved changes, within the budget (or until
        the journal is short enough)."""
        out: dict[View, list[tuple[str, bytes]]] = {view: [] for view in self._caches}
        deadline = time.perf_counter() + self._snapshot_budget_s
        while True:
            oldest: tuple[int, View] | None = None
            for view, cache in self._caches.items():
                seq = cache.oldest_unsaved()
                # Ties go to the view listed first (cards, then merchants, then terminals).
                if seq is not None and (oldest is None or seq < oldest[0]):
                    oldest = (seq, view)
            if oldest is None:
                break
            backlog = self._seq - oldest[0]
            if time.perf_counter() >= deadline and backlog <= self._journal_max:
                break
            out[oldest[1]].append(self._caches[oldest[1]].snapshot_oldest())
        return out

    def snapshot_all(self, meta: dict[str, str] | None = None) -> None:
        """Snapshots every changed entity and empties the journal (on an orderly stop)."""
        budget, self._snapshot_budget_s = self._snapshot_budget_s, float("inf")
        try:
            self.checkpoint(meta)
        finally:
            self._snapshot_budget_s = budget

    def sizes(self) -> dict[View, int]:
        """States held in memory per view."""
        return {view: len(cache) for view, cache in self._caches.items()}

    @property
    def journal_events(self) -> int:
        """Events in the journal (saved or not) that some snapshot does not cover yet."""
        return self._seq - self._first_seq + 1

    @property
    def pending_labels(self) -> int:
        """Outcomes held for transactions not seen yet."""
        return len(self._pending)

    @property
    def due_reports(self) -> int:
        """The seed's fraud reports whose instant the clock has not passed yet."""
        return len(self._due)


def _rows(cache: _Cache[S], compute: Callable[[S], FeatureRow | None]) -> list[Row]:
    """The rows of the entities of one view an event reached (computed when not known)."""
    out = []
    for key, known in cache.touched.items():
        state = cache.peek(key)
        row = known if known is not None else compute(state)
        if row is not None:
            # A terminal's row may be as of a label reported after its newest payment.
            at_us = getattr(state, "row_us", None) or state.events.times_us[-1]
            out.append(Row(key, at_us / _US, row))
    return out
