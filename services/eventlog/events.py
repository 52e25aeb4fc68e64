"""Helpers for the events on the log: ids, keys, feature-schema fingerprints."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

from google.protobuf.message import DecodeError

from fraud.v1 import events_pb2


def new_event_id() -> str:
    """A random 128-bit event id, hex (cheaper than ``uuid.uuid4`` on the hot path)."""
    return os.urandom(16).hex()


def feature_schema_id(names: Iterable[str]) -> str:
    """Fingerprint of a feature order, carried in ``DecisionEvent.feature_schema``: the same
    names in the same order always give the same 16 hex digits."""
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def key_of(envelope: events_pb2.EventEnvelope) -> bytes:
    """The log key of an event: the card of a decision (so per-card order holds), the
    transaction of an outcome, the entry of a list change."""
    kind = envelope.WhichOneof("event")
    if kind == "decision":
        return envelope.decision.card_id.encode()
    if kind == "outcome":
        return envelope.outcome.transaction_id.encode()
    if kind == "list_change":
        change = envelope.list_change
        return f"list:{change.kind}:{change.value}".encode()
    raise ValueError("the envelope carries no event")


def decode(value: bytes) -> events_pb2.EventEnvelope:
    """An envelope from its serialized form."""
    envelope = events_pb2.EventEnvelope()
    envelope.ParseFromString(value)
    return envelope


def event_id_of(value: bytes) -> str:
    """The event id in a serialized envelope ('' when it carries none or does not parse)."""
    envelope = events_pb2.EventEnvelope()
    try:
        envelope.ParseFromString(value)
    except DecodeError:
        return ""
    kind = envelope.WhichOneof("event")
    if kind == "decision":
        return envelope.decision.event_id
    if kind == "outcome":
        return envelope.outcome.event_id
    if kind == "list_change":
        return envelope.list_change.event_id
    return ""
