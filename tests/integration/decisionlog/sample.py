"""Decision and outcome events as the gateway and the outcome API write them, for the decision
log's tests."""

from __future__ import annotations

import time

from fraud.v1 import events_pb2, outcomes_pb2, scoring_pb2
from services.domain import featurespec
from services.eventlog import events

SCHEMA = events.feature_schema_id(featurespec.MODEL_FEATURES)


def decision(
    i: int, *, tx: str | None = None, event_id: str | None = None
) -> events_pb2.EventEnvelope:
    """Decision number ``i`` (event id ``d<i>``, transaction ``tx-<i>``), decided now."""
    envelope = events_pb2.EventEnvelope()
    d = envelope.decision
    d.event_id = event_id or f"d{i}"
    d.transaction_id = tx or f"tx-{i}"
    d.card_id = f"card-{i % 17}"
    d.merchant_id = f"merch-{i % 5:05d}"
    d.amount_minor = 100 + i
    d.currency = "EUR"
    now = time.time_ns()
    d.timestamp.FromNanoseconds(now - 3_000_000)
    d.decided_at.FromNanoseconds(now)
    d.card_not_present = bool(i % 2)
    d.features.extend(float(j + i % 3) for j in range(len(featurespec.MODEL_FEATURES)))
    d.feature_schema = SCHEMA
    d.feature_source = scoring_pb2.FEATURE_SOURCE_ONLINE
    d.score = (i % 100) / 100
    d.decision = scoring_pb2.DECISION_APPROVE if d.score < 0.8 else scoring_pb2.DECISION_DECLINE
    d.scored_by = scoring_pb2.SCORED_BY_MODEL
    d.model_version = "fraud-lgbm/1"
    d.route = events_pb2.ROUTE_LIVE
    d.elapsed_ms = 2.5
    return envelope


def outcome(
    i: int,
    kind: int = outcomes_pb2.OUTCOME_FRAUD,
    *,
    event_id: str | None = None,
    reported_offset_s: int = 0,
) -> events_pb2.EventEnvelope:
    """An outcome of transaction ``tx-<i>`` (event id ``o<i>``), received now."""
    envelope = events_pb2.EventEnvelope()
    o = envelope.outcome
    o.event_id = event_id or f"o{i}"
    o.transaction_id = f"tx-{i}"
    o.outcome = kind  # type: ignore[assignment]
    o.source = outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK
    now = time.time_ns()
    o.reported_at.FromNanoseconds(now - 86_400_000_000_000 + reported_offset_s * 1_000_000_000)
    o.received_at.FromNanoseconds(now)
    return envelope
