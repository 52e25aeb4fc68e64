"""The gateway's servicers: FraudScoring (ScoreRequest in, validated transaction through the
pipeline, ScoreResponse out, decision event after the answer) and OutcomeService
(ReportOutcomeRequest in, validated, OutcomeEvent on the log, acknowledgement out)."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from fraud.v1 import outcomes_pb2, outcomes_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common import telemetry
from services.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.events import REPORTERS, VERDICTS, EventEmitter, set_time
from services.gateway.followup import Followup, span_attributes
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, Pipeline, ScoredBy, ScoreResult, Source
from services.gateway.validate import Limits, Transaction, validate, validate_outcome

_DECISION = {
    Decision.APPROVE: pb.DECISION_APPROVE,
    Decision.REVIEW: pb.DECISION_REVIEW,
    Decision.DECLINE: pb.DECISION_DECLINE,
}
_SCORED_BY = {
    ScoredBy.MODEL: pb.SCORED_BY_MODEL,
    ScoredBy.RULES: pb.SCORED_BY_RULES,
    ScoredBy.FIRST_STAGE: pb.SCORED_BY_FIRST_STAGE,
    ScoredBy.SMALL_MODEL: pb.SCORED_BY_SMALL_MODEL,
}
_SOURCE = {
    Source.ONLINE: pb.FEATURE_SOURCE_ONLINE,
    Source.PARTIAL: pb.FEATURE_SOURCE_PARTIAL,
    Source.DEFAULT: pb.FEATURE_SOURCE_DEFAULT,
}


class FraudScoringServicer(pb_grpc.FraudScoringServicer):
    """Thin adapter between the public proto API and the scoring pipeline: sheds what it
    cannot take, converts the request, asks the pipeline, converts its result; what follows
    the answer is ``followup.Followup``'s."""

    def __init__(
        self,
        pipeline: Callable[[], Pipeline | None],
        policy: BudgetPolicy,
        limits: Limits,
        metrics: GatewayMetrics,
        max_in_flight: int,
        emitter: EventEmitter | None = None,
    ) -> None:
        # The servicer is registered before the gateway starts (the server reports
        # NOT_SERVING meanwhile); the pipeline exists once the start has built and warmed it.
        self._pipeline = pipeline
        self._followup = Followup(metrics, emitter)
        self._policy = policy
        self._limits = limits
        self._metrics = metrics
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        metrics.in_flight.set_function(lambda: self._in_flight)

    async def Score(
        self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScoreResponse:
        budget = Budget(self._policy, context.time_remaining())
        pipeline = self._admit()
        self._in_flight += 1
        try:
            tx = self._transaction(request)
            result = await pipeline.score(tx, budget)
            elapsed = budget.elapsed()
            # The server span is the transport's: its id and attributes are taken here.
            trace_id = telemetry.trace_id()
            self._followup.observe(result, elapsed, trace_id)
            if trace_id is not None:
                telemetry.annotate(span_attributes(result, budget, elapsed))
            response = _response(tx, result, elapsed)
            done = await self._followup.before_answer(
                request, tx.card_not_present, result, response, budget, pipeline
            )
        finally:
            self._in_flight -= 1
        if done is not None:
            # Runs once the answer's final batch has completed: the caller never waits on it.
            context.add_done_callback(done)
        return response

    def _admit(self) -> Pipeline:
        """The pipeline, when the gateway has started and is below its concurrency limit."""
        pipeline = self._pipeline()
        if pipeline is None:
            raise Unavailable("gateway is still starting")
        if self._in_flight >= self._max_in_flight:
            # Shedding at once keeps the accepted calls inside their budget; queueing would
            # make every call late.
            self._metrics.shed.inc()
            raise ResourceExhausted("gateway at its concurrency limit; retry with backoff")
        return pipeline

    def _transaction(self, request: pb.ScoreRequest) -> Transaction:
        """The request as a validated transaction (INVALID_ARGUMENT naming the field)."""
        try:
            return validate(
                transaction_id=request.transaction_id,
                card_id=request.card_id,
                merchant_id=request.merchant_id,
                amount_minor=request.amount_minor,
                currency=request.currency,
                timestamp_s=(
                    request.timestamp.ToNanoseconds() / 1e9
                    if request.HasField("timestamp")
                    else None
                ),
                terminal_id=request.terminal_id,
                card_not_present=request.channel == pb.CHANNEL_CARD_NOT_PRESENT,
                now_s=time.time(),
                limits=self._limits,
            )
        except InvalidArgument as error:
            self._metrics.invalid.labels(error.field).inc()
            raise


def _response(tx: Transaction, result: ScoreResult, elapsed_s: float) -> pb.ScoreResponse:
    """The answer on the wire."""
    return pb.ScoreResponse(
        transaction_id=tx.transaction_id,
        decision=_DECISION[result.decision],
        score=result.score,
        reasons=result.reasons,
        model_version=result.model_version,
        scored_by=_SCORED_BY[result.scored_by],
        feature_source=_SOURCE[result.feature_source],
        elapsed_ms=elapsed_s * 1000.0,
    )


class OutcomeServicer(outcomes_pb2_grpc.OutcomeServiceServicer):
    """Thin adapter between ReportOutcome and the event log."""

    def __init__(
        self,
        emitter: EventEmitter,
        limits: Limits,
        metrics: GatewayMetrics,
        delivery_timeout_s: float,
    ) -> None:
        self._emitter = emitter
        self._limits = limits
        self._metrics = metrics
        self._delivery_timeout_s = delivery_timeout_s

    async def ReportOutcome(
        self, request: outcomes_pb2.ReportOutcomeRequest, context: grpc.aio.ServicerContext
    ) -> outcomes_pb2.ReportOutcomeResponse:
        try:
            report = validate_outcome(
                transaction_id=request.transaction_id,
                verdict=VERDICTS.get(request.outcome),
                reporter=REPORTERS.get(request.source),
                reported_at=(
                    (request.reported_at.seconds, request.reported_at.nanos)
                    if request.HasField("reported_at")
                    else None
                ),
                now_s=time.time(),
                limits=self._limits,
                reported_by=request.reported_by,
            )
        except InvalidArgument as error:
            self._metrics.invalid.labels(error.field).inc()
            raise
        if not self._emitter.enabled:
            raise Unavailable("this gateway runs without an event log; outcomes are not taken")
        event_id, received_at_s = self._emitter.outcome(report)
        if self._delivery_timeout_s > 0 and not await self._emitter.delivered(
            self._delivery_timeout_s
        ):
            # The event is queued (or in the spill file) and will most likely arrive; the
            # client is told to retry, and a repeated outcome is harmless downstream.
            raise Unavailable("the event log did not confirm the outcome in time; retry")
        self._metrics.outcomes.labels(report.verdict.value, report.reporter.value).inc()
        response = outcomes_pb2.ReportOutcomeResponse(
            transaction_id=report.transaction_id, event_id=event_id
        )
        set_time(response.received_at, received_at_s)
        return response
