"""The outcome join of a partitioned updater group: which merchant an outcome's transaction paid.

An outcome names only its transaction, and the merchant windows it labels are owned by
merchant. One partition of ``<topic>.by-transaction`` (keyed by transaction) receives both
sides of every transaction of its share: an index entry for each decision (its merchant,
terminal and time, forwarded by the member owning the decision's card partition) and each
outcome. ``OutcomeJoin`` keeps the index and the outcomes that came before their entry in the
partition's state file, and says where each outcome goes once both are known. Transactions
of the history are found in the shared seed's index.

The same bounds as the single updater's: the index is pruned to the merchant horizon, held
outcomes beyond ``max_pending`` (oldest report first) or reported before the horizon are
dropped. Applying an entry or an outcome twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from fraud.v1 import events_pb2, outcomes_pb2
from services.domain.aggregation import Label, MerchantState
from services.updater.state import IndexEntry, StateStore

_HORIZON_US = MerchantState().horizon_us
_US = 1_000_000

Forward = Callable[[str, bytes], None]
"""Sends a serialized outcome to the merchant windows of the merchant named."""


def index_entry(decision: events_pb2.DecisionEvent) -> bytes:
    """The index entry of a decision as forwarded: a decision envelope with only the
    transaction, its merchant, terminal and time."""
    entry = events_pb2.EventEnvelope()
    d = entry.decision
    d.transaction_id = decision.transaction_id
    d.merchant_id = decision.merchant_id
    d.terminal_id = decision.terminal_id
    d.timestamp.CopyFrom(decision.timestamp)
    d.decided_at.CopyFrom(decision.decided_at)
    return entry.SerializeToString()


def outcome_record(tid: str, label: Label) -> bytes:
    """An outcome re-made from a held label (what the merchant windows read of it)."""
    event = events_pb2.OutcomeEvent(
        transaction_id=tid,
        outcome=outcomes_pb2.OUTCOME_FRAUD if label.is_fraud else outcomes_pb2.OUTCOME_LEGITIMATE,
    )
    event.reported_at.FromMicroseconds(label.reported_us)
    return events_pb2.EventEnvelope(outcome=event).SerializeToString()


class OutcomeJoin:
    """One by-transaction partition's index and held outcomes."""

    def __init__(self, store: StateStore, forward: Forward, max_pending: int) -> None:
        self._store = store
        self._forward = forward
        self._max_pending = max_pending
        self._index: dict[str, IndexEntry] = {}
        """Entries since the last checkpoint."""
        self._pending: dict[str, Label] = dict(store.pending_labels())
        self._held: set[str] = set()
        self._released: set[str] = set()
        self._newest_us = 0
        self.dropped = 0
        """Held outcomes dropped since last read (the caller resets it)."""

    @property
    def pending(self) -> int:
        """Outcomes held for an index entry that has not come."""
        return len(self._pending)

    def entry(self, decision: events_pb2.DecisionEvent) -> None:
        """Records where a transaction was paid; forwards its held outcome, if any."""
        tid = decision.transaction_id
        t_us = decision.timestamp.ToMicroseconds()
        self._index[tid] = (tid, decision.merchant_id, decision.terminal_id, t_us)
        self._newest_us = max(self._newest_us, t_us)
        label = self._pending.pop(tid, None)
        if label is not None:
            self._held.discard(tid)
            self._released.add(tid)
            self._forward(decision.merchant_id, outcome_record(tid, label))

    def outcome(self, event: events_pb2.OutcomeEvent, raw: bytes) -> bool:
        """Forwards an outcome to its merchant, or holds it until its entry comes; returns
        whether it went on. Outcomes other than fraud or legitimate are no labels: dropped."""
        if event.outcome not in (outcomes_pb2.OUTCOME_FRAUD, outcomes_pb2.OUTCOME_LEGITIMATE):
            return False
        tid = event.transaction_id
        entry = self._index.get(tid)
        merchant = entry[1] if entry is not None else None
        if merchant is None:
            found = self._store.entities_of(tid)
            merchant = found[0] if found is not None else None
        if merchant is not None:
            self._forward(merchant, raw)
            return True
        label = Label(
            event.outcome == outcomes_pb2.OUTCOME_FRAUD, event.reported_at.ToMicroseconds()
        )
        held = self._pending.get(tid)
        if held is None or label.reported_us >= held.reported_us:
            self._pending[tid] = label
            self._held.add(tid)
            self._released.discard(tid)
        while len(self._pending) > self._max_pending:
            oldest = min(self._pending, key=lambda k: self._pending[k].reported_us)
            self._drop(oldest)
        return False

    def _drop(self, tid: str) -> None:
        del self._pending[tid]
        self._held.discard(tid)
        self._released.add(tid)
        self.dropped += 1

    def checkpoint(self, meta: dict[str, str]) -> None:
        """Saves the new entries and the held outcomes with ``meta`` (the offset), in one
        transaction; prunes what no window can use any more."""
        prune = None
        if self._newest_us:
            prune = self._newest_us - _HORIZON_US
            for tid in [k for k, v in self._pending.items() if v.reported_us <= prune]:
                self._drop(tid)
        self._store.save(
            transactions=list(self._index.values()),
            labels_held=[(k, self._pending[k]) for k in self._held if k in self._pending],
            labels_released=self._released - self._held,
            prune_before_us=prune,
            meta=meta,
        )
        self._index.clear()
        self._held.clear()
        self._released.clear()
