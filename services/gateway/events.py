"""The gateway's events: one DecisionEvent per answered Score, one OutcomeEvent per report.

With the journal (``FRAUD_GATEWAY_JOURNAL=write``, the default, or ``fsync``) a decision
event is written to the gateway's journal on local disk before the answer is sent
(``EventEmitter.before_answer``): a crash of the gateway after it answered cannot lose the
decision (docs/reliability.md). A decision whose shadow score is still being computed is
written as pending, and its final form, with the shadow score, follows once the shadow has
scored (``Journaled.complete``); the journal delivers the final form in its place.

Without it (``off``) the event is built and appended after the answer has gone out: the
servicer registers ``EventEmitter.decision`` with ``context.add_done_callback``, which grpc
runs once the call's final batch (response and status) has completed, so the answer never
waits on it (``loadtest/emit_bench.py`` measures the alternatives; docs/liveloop.md quotes
it); a kill of the gateway loses what is still in memory. Appending costs a serialization
and a deque append (or a journal write); the producer's sender thread does the I/O.
Emitting never raises into grpc: a failure is counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from fraud.v1 import events_pb2, outcomes_pb2
from fraud.v1 import scoring_pb2 as pb
from services.common.errors import Unavailable
from services.domain import featurespec
from services.domain.money import amount_eur
from services.eventlog import AnyProducer, JournalProducer
from services.eventlog.events import feature_schema_id, new_event_id
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import ScoreResult
from services.gateway.ports import Arm
from services.gateway.validate import OutcomeReport, Reporter, Verdict

log = logging.getLogger(__name__)

_NANOS = 1_000_000_000

VERDICTS: dict[int, Verdict] = {
    outcomes_pb2.OUTCOME_FRAUD: Verdict.FRAUD,
    outcomes_pb2.OUTCOME_LEGITIMATE: Verdict.LEGITIMATE,
    outcomes_pb2.OUTCOME_DISPUTED: Verdict.DISPUTED,
}
"""Known ``fraud.v1.Outcome`` numbers; anything else is unspecified or unknown."""

REPORTERS: dict[int, Reporter] = {
    outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK: Reporter.CHARGEBACK,
    outcomes_pb2.OUTCOME_SOURCE_ANALYST: Reporter.ANALYST,
    outcomes_pb2.OUTCOME_SOURCE_CUSTOMER: Reporter.CUSTOMER,
    outcomes_pb2.OUTCOME_SOURCE_ISSUER: Reporter.ISSUER,
}
"""Known ``fraud.v1.OutcomeSource`` numbers."""

_VERDICT_NUMBER = {v: k for k, v in VERDICTS.items()}
_REPORTER_NUMBER = {v: k for k, v in REPORTERS.items()}


def set_time(stamp: Any, seconds: float) -> None:
    """Sets a ``google.protobuf.Timestamp`` in place from epoch seconds."""
    stamp.seconds, stamp.nanos = divmod(round(seconds * _NANOS), _NANOS)


_ROUTE = {Arm.LIVE: events_pb2.ROUTE_LIVE, Arm.CANARY: events_pb2.ROUTE_CANARY}


def _model_slot(event: events_pb2.DecisionEvent, result: ScoreResult) -> None:
    """Which arm answered (live, also when the rules stood in for it, or canary) and the
    shadow version's score of the same transaction, when one was scored in time."""
    event.route = _ROUTE[result.arm]
    event.canary_failed_version = result.canary_failed
    event.canary_timed_out = result.canary_timed_out
    event.shadow_rules.extend(result.shadow_rules)
    shadow = result.shadow.result() if result.shadow is not None else None
    if shadow is not None:
        event.shadow_score = shadow.score
        event.shadow_model_version = shadow.version


def decision_event(
    request: pb.ScoreRequest,
    card_not_present: bool,
    result: ScoreResult,
    response: pb.ScoreResponse,
    decided_at_s: float,
    feature_schema: str,
    feature_names: Sequence[str] = (),
) -> events_pb2.EventEnvelope:
    """The envelope of one answered Score call: the request's fields, the model input and
    what was answered (taken from the response itself, so the event says what the caller got)."""
    envelope = events_pb2.EventEnvelope()
    event = envelope.decision
    event.event_id = new_event_id()
    event.transaction_id = response.transaction_id
    event.card_id = request.card_id
    event.merchant_id = request.merchant_id
    event.amount_minor = request.amount_minor
    event.currency = request.currency
    event.timestamp.CopyFrom(request.timestamp)
    event.terminal_id = request.terminal_id
    event.card_not_present = card_not_present
    event.features.extend(result.features)
    if result.store is not None and result.features:
        amount = amount_eur(request.amount_minor, request.currency)
        event.missing_features.extend(
            featurespec.missing_inputs(result.feature_positions, result.store, amount)
        )
    event.feature_schema = feature_schema
    event.feature_names.extend(feature_names)
    event.feature_source = response.feature_source
    event.score = response.score
    event.decision = response.decision
    event.scored_by = response.scored_by
    event.model_version = response.model_version
    _model_slot(event, result)
    event.reasons.extend(response.reasons)
    event.elapsed_ms = response.elapsed_ms
    set_time(event.decided_at, decided_at_s)
    return envelope


class Journaled:
    """A decision event in the journal: how to wait for its fsync, and how to give its
    final form once the shadow has scored."""

    def __init__(
        self,
        producer: JournalProducer,
        envelope: events_pb2.EventEnvelope,
        result: ScoreResult,
        token: int,
        written: int,
        metrics: GatewayMetrics,
    ) -> None:
        self._producer = producer
        self._envelope = envelope
        self._result = result
        self._token = token
        self._written = written
        self._metrics = metrics

    @property
    def needs_sync(self) -> bool:
        """True when the answer should wait for the journal's fsync."""
        return self._producer.sync_mode == "fsync"

    async def durable(self, timeout_s: float) -> bool:
        """Waits until the event is synced to disk; False when ``timeout_s`` passed first."""
        return await self._producer.durable(self._written, max(timeout_s, 0.0))

    def complete(self, _context: object = None) -> None:
        """Gives the event its shadow slot once the shadow has scored (or given up); never
        raises. The trailing argument takes what a done callback passes."""
        if not self._token:
            return
        try:
            _model_slot(self._envelope.decision, self._result)
            self._producer.complete(self._token, self._envelope)
        except Exception:
            self._metrics.emit_errors.labels("decision").inc()
            log.exception("final decision event not written")


def outcome_event(report: OutcomeReport, received_at_s: float) -> events_pb2.EventEnvelope:
    """The envelope of one accepted outcome report."""
    envelope = events_pb2.EventEnvelope()
    event = envelope.outcome
    event.event_id = new_event_id()
    event.transaction_id = report.transaction_id
    event.outcome = _VERDICT_NUMBER[report.verdict]  # type: ignore[assignment]
    event.source = _REPORTER_NUMBER[report.reporter]  # type: ignore[assignment]
    event.reported_by = report.reported_by
    set_time(event.reported_at, report.reported_at_s)
    set_time(event.received_at, received_at_s)
    return envelope


class EventEmitter:
    """Appends the gateway's events to the event log (or nowhere, with the loop off)."""

    def __init__(
        self,
        producer: AnyProducer | None,
        feature_order: Sequence[str],
        metrics: GatewayMetrics,
    ) -> None:
        self.producer = producer
        self._order = tuple(feature_order)
        self._schema = feature_schema_id(self._order)
        self._schemas: dict[tuple[str, ...], str] = {self._order: self._schema}
        self._metrics = metrics

    def _schema_of(self, order: tuple[str, ...]) -> tuple[str, Sequence[str]]:
        """The fingerprint of a version's feature order, and its names when they are not the
        serving order every consumer knows (a version trained on another order)."""
        if not order or order == self._order:
            return self._schema, ()
        schema = self._schemas.get(order)
        if schema is None:
            schema = self._schemas[order] = feature_schema_id(order)
        return schema, order

    @property
    def enabled(self) -> bool:
        """True when events go to a log."""
        return self.producer is not None

    @property
    def journaled(self) -> bool:
        """True when decisions are written to the journal before the answer."""
        return isinstance(self.producer, JournalProducer)

    def before_answer(
        self,
        request: pb.ScoreRequest,
        card_not_present: bool,
        result: ScoreResult,
        response: pb.ScoreResponse,
        decided_at_s: float,
    ) -> Journaled | None:
        """Writes the decision event to the journal (pending when a shadow score is still to
        come); None when there is no journal or the write failed (counted and logged)."""
        producer = self.producer
        if not isinstance(producer, JournalProducer):
            return None
        try:
            schema, names = self._schema_of(result.feature_order)
            envelope = decision_event(
                request, card_not_present, result, response, decided_at_s, schema, names
            )
            if result.shadow is not None:
                token, written = producer.append_pending(envelope)
            else:
                token, written = 0, producer.append(envelope)
        except Exception:
            self._metrics.emit_errors.labels("decision").inc()
            log.exception("decision event not emitted", extra={"tx": response.transaction_id})
            return None
        if written < 0:
            self._metrics.emit_errors.labels("decision").inc()
            return None
        return Journaled(producer, envelope, result, token, written, self._metrics)

    def decision(
        self,
        request: pb.ScoreRequest,
        card_not_present: bool,
        result: ScoreResult,
        response: pb.ScoreResponse,
        decided_at_s: float,
        _context: object = None,
    ) -> None:
        """Builds and appends one decision event; never raises. The trailing argument takes
        the servicer context grpc passes to a done callback."""
        producer = self.producer
        if producer is None:
            return
        try:
            schema, names = self._schema_of(result.feature_order)
            producer.append(
                decision_event(
                    request, card_not_present, result, response, decided_at_s, schema, names
                )
            )
        except Exception:
            self._metrics.emit_errors.labels("decision").inc()
            log.exception("decision event not emitted", extra={"tx": response.transaction_id})

    def outcome(self, report: OutcomeReport) -> tuple[str, float]:
        """Appends one outcome event; returns its event id and receive time. Raises what the
        producer raises (the caller answers the report with it)."""
        received_at_s = time.time()
        envelope = outcome_event(report, received_at_s)
        if self.producer is not None:
            try:
                written = self.producer.append(envelope)
            except Exception:
                self._metrics.emit_errors.labels("outcome").inc()
                raise
            if isinstance(written, int) and written < 0:
                # The journal's disk did not take it: the reporter must send it again.
                self._metrics.emit_errors.labels("outcome").inc()
                raise Unavailable("the outcome could not be recorded; retry")
        return envelope.outcome.event_id, received_at_s

    async def delivered(self, timeout_s: float) -> bool:
        """Waits until everything appended so far is stored by the log (False on timeout)."""
        if self.producer is None:
            return True
        return await self.producer.aflush(timeout_s)

    async def close(self) -> None:
        """Delivers what is buffered (or leaves it in the spill file) and closes the producer.

        Call after the server stopped: done callbacks of the last calls may still be queued
        on the event loop, so it yields to them first. An event emitted after this is
        counted in ``emit_errors`` and logged, never silently lost."""
        if self.producer is None:
            return
        for _ in range(3):
            await asyncio.sleep(0)
        await self.producer.aclose()
