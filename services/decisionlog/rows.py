"""Events from the log as rows of the decision log's tables, gathered per table and day.

The sink decodes each record once, drops events it has already written (a bounded window of
recent event ids), and appends the event's fields to column lists of its table and UTC day;
a flush turns each list set into one Arrow table. Enums are stored by their short lower-case
names (``approve``, ``model``, ``chargeback``) so that the files read without the protos.
"""

from __future__ import annotations

import array
import collections
import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError

from fraud.v1 import events_pb2, outcomes_pb2, scoring_pb2
from services.decisionlog import layout
from services.eventlog import Record


def _short_names(items: Iterable[tuple[str, int]], prefix: str) -> dict[int, str]:
    return {number: name.removeprefix(prefix).lower() for name, number in items}


DECISIONS = _short_names(scoring_pb2.Decision.items(), "DECISION_")
"""Decision enum → stored name (``approve``, ``review``, ``decline``, ``unspecified``)."""
SCORED_BY = _short_names(scoring_pb2.ScoredBy.items(), "SCORED_BY_")
"""ScoredBy enum → stored name (``model``, ``rules``, ``first_stage``, ``small_model``)."""
FEATURE_SOURCES = _short_names(scoring_pb2.FeatureSource.items(), "FEATURE_SOURCE_")
"""FeatureSource enum → stored name (``online``, ``partial``, ``default``)."""
ROUTES = _short_names(events_pb2.Route.items(), "ROUTE_")
"""Route enum → stored name (``live``, ``canary``)."""
OUTCOMES = _short_names(outcomes_pb2.Outcome.items(), "OUTCOME_")
"""Outcome enum → stored name (``fraud``, ``legitimate``, ``disputed``)."""
OUTCOME_SOURCES = _short_names(outcomes_pb2.OutcomeSource.items(), "OUTCOME_SOURCE_")
"""OutcomeSource enum → stored name (``chargeback``, ``analyst``, ``customer``, ``issuer``)."""


def _us(seconds: int, nanos: int) -> int | None:
    """Microseconds since the epoch of a Timestamp's parts; None when it was not set."""
    if seconds == 0 and nanos == 0:
        return None
    return seconds * 1_000_000 + nanos // 1000


def _name(names: Mapping[int, str], number: int) -> str:
    # A value from a newer proto than this build keeps its number rather than vanishing.
    return names.get(number) or str(number)


class RecentIds:
    """The last ``capacity`` event ids written, for dropping events delivered again."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._order: collections.deque[str] = collections.deque()
        self._ids: set[str] = set()

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, event_id: str) -> None:
        """Remembers ``event_id``, forgetting the oldest once full."""
        if event_id in self._ids or self.capacity <= 0:
            return
        self._ids.add(event_id)
        self._order.append(event_id)
        if len(self._order) > self.capacity:
            self._ids.discard(self._order.popleft())


class TableBuffer:
    """Column lists of one table and one day, in the table's schema order.

    The feature vectors, the bulk of a decision, are kept as one float32 array plus offsets
    rather than a list of Python floats per row (a Python float and its list slot take 32
    bytes, a float32 4), and the Arrow column is built without an object per value.
    """

    PACKED = "features"
    """The list<float32> column kept packed."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.columns: dict[str, list[object]] = {
            name: [] for name in schema.names if name != self.PACKED
        }
        self.values = array.array("f")
        self.offsets = array.array("i", [0])
        self.rows = 0

    def add_vector(self, values: Iterable[float]) -> None:
        """Appends one row's feature vector."""
        self.values.extend(values)
        self.offsets.append(len(self.values))

    def to_table(self) -> pa.Table:
        """The gathered rows as an Arrow table of the schema."""
        arrays = []
        for column in self.schema:
            if column.name == self.PACKED:
                offsets = pa.array(np.frombuffer(self.offsets, dtype=np.int32))
                values = pa.array(np.frombuffer(self.values, dtype=np.float32))
                arrays.append(pa.ListArray.from_arrays(offsets, values, type=column.type))
            else:
                arrays.append(pa.array(self.columns[column.name], type=column.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def event_ids(self) -> list[str]:
        """The event ids of the gathered rows."""
        return [str(e) for e in self.columns["event_id"]]


class AddResult(enum.StrEnum):
    """What ``Batch.add`` did with a record (the values label metrics)."""

    DECISION = "decision"
    OUTCOME = "outcome"
    DUPLICATE = "duplicate"
    INVALID = "invalid"
    OTHER = "other"
    """An event the decision log does not keep (a change to the fraud team's lists)."""


BufferKey = tuple[layout.Kind, int]
"""(table, UTC day index) of a buffer."""


@dataclass
class Batch:
    """What the sink has polled and not yet written: buffers per table and day."""

    recent: RecentIds
    buffers: dict[BufferKey, TableBuffer] = field(default_factory=dict)
    rows: int = 0
    oldest_event_us: int | None = None
    """Event time of the oldest row gathered (for the write-delay metric)."""

    def _buffer(self, kind: layout.Kind, event_us: int | None) -> TableBuffer:
        """The buffer of the event's table and day (an event without a time: today),
        counting the row about to be appended."""
        if event_us is None:
            event_us = time.time_ns() // 1000
        key = (kind, layout.day_index(event_us))
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self.buffers[key] = TableBuffer(layout.SCHEMAS[kind])
        if self.oldest_event_us is None or event_us < self.oldest_event_us:
            self.oldest_event_us = event_us
        buffer.rows += 1
        self.rows += 1
        return buffer

    def add(self, record: Record) -> AddResult:
        """Decodes ``record`` and gathers its row unless it was written before."""
        try:
            envelope = record.envelope()
        except DecodeError:
            return AddResult.INVALID
        kind = envelope.WhichOneof("event")
        if kind == "decision":
            return self._add_decision(envelope.decision, record.position)
        if kind == "outcome":
            return self._add_outcome(envelope.outcome, record.position)
        if kind == "list_change":
            return AddResult.OTHER
        return AddResult.INVALID

    def _seen(self, event_id: str) -> bool:
        if event_id in self.recent:
            return True
        self.recent.add(event_id)
        return False

    def _add_decision(self, d: events_pb2.DecisionEvent, position: str) -> AddResult:
        # An event without an id (not written by fraudmesh) is keyed by where it sits in
        # the log, which a redelivery repeats.
        event_id = d.event_id or f"log:{position}"
        if self._seen(event_id):
            return AddResult.DUPLICATE
        decided_us = _us(d.decided_at.seconds, d.decided_at.nanos)
        transaction_us = _us(d.timestamp.seconds, d.timestamp.nanos)
        buffer = self._buffer("decisions", decided_us or transaction_us)
        c = buffer.columns
        c["event_id"].append(event_id)
        c["transaction_id"].append(d.transaction_id)
        c["card_id"].append(d.card_id)
        c["merchant_id"].append(d.merchant_id)
        c["terminal_id"].append(d.terminal_id or None)
        c["amount_minor"].append(d.amount_minor)
        c["currency"].append(d.currency)
        c["card_not_present"].append(d.card_not_present)
        c["transaction_at"].append(transaction_us)
        c["decision"].append(_name(DECISIONS, d.decision))
        c["score"].append(d.score)
        c["model_version"].append(d.model_version)
        c["scored_by"].append(_name(SCORED_BY, d.scored_by))
        c["feature_source"].append(_name(FEATURE_SOURCES, d.feature_source))
        c["route"].append(_name(ROUTES, d.route))
        c["shadow_score"].append(d.shadow_score if d.HasField("shadow_score") else None)
        c["shadow_model_version"].append(d.shadow_model_version or None)
        c["reasons"].append(list(d.reasons))
        c["elapsed_ms"].append(d.elapsed_ms)
        c["decided_at"].append(decided_us)
        buffer.add_vector(d.features)
        c["feature_names"].append(list(d.feature_names) if d.feature_names else None)
        c["feature_schema"].append(d.feature_schema or None)
        c["log_position"].append(position)
        c["missing_features"].append(list(d.missing_features))
        c["shadow_rules"].append(list(d.shadow_rules))
        return AddResult.DECISION

    def _add_outcome(self, o: events_pb2.OutcomeEvent, position: str) -> AddResult:
        event_id = o.event_id or f"log:{position}"
        if self._seen(event_id):
            return AddResult.DUPLICATE
        received_us = _us(o.received_at.seconds, o.received_at.nanos)
        reported_us = _us(o.reported_at.seconds, o.reported_at.nanos)
        c = self._buffer("outcomes", received_us or reported_us).columns
        c["event_id"].append(event_id)
        c["transaction_id"].append(o.transaction_id)
        c["outcome"].append(_name(OUTCOMES, o.outcome))
        c["outcome_source"].append(_name(OUTCOME_SOURCES, o.source))
        c["reported_at"].append(reported_us)
        c["received_at"].append(received_us)
        c["log_position"].append(position)
        c["reported_by"].append(o.reported_by or None)
        return AddResult.OUTCOME

    def take(self, key: BufferKey) -> None:
        """Forgets one buffer once its part is written."""
        buffer = self.buffers.pop(key)
        self.rows -= buffer.rows
        if not self.buffers:
            self.oldest_event_us = None
