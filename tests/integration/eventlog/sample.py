"""Sample events with recognizable ids, for the event log's tests and their worker processes."""

from __future__ import annotations

from fraud.v1 import events_pb2
from services.eventlog import Record


def decision(i: int, cards: int = 13) -> events_pb2.EventEnvelope:
    """Decision number ``i``: event id ``e<i>``, amount ``i``, one of ``cards`` cards."""
    envelope = events_pb2.EventEnvelope()
    d = envelope.decision
    d.event_id = f"e{i}"
    d.transaction_id = f"tx-{i}"
    d.card_id = f"card-{i % cards}"
    d.merchant_id = "merch-00001"
    d.amount_minor = i
    d.currency = "EUR"
    d.timestamp.FromSeconds(1_700_000_000 + i)
    d.features.extend([0.5, 1.0, float(i)])
    d.score = 0.25
    return envelope


def outcome(i: int) -> events_pb2.EventEnvelope:
    """An outcome for transaction ``tx-<i>``, event id ``o<i>``."""
    envelope = events_pb2.EventEnvelope()
    o = envelope.outcome
    o.event_id = f"o{i}"
    o.transaction_id = f"tx-{i}"
    o.outcome = 1
    o.reported_at.FromSeconds(1_700_100_000 + i)
    return envelope


def event_id(record: Record) -> str:
    """The event id inside a consumed record."""
    envelope = record.envelope()
    kind = envelope.WhichOneof("event")
    return envelope.decision.event_id if kind == "decision" else envelope.outcome.event_id
