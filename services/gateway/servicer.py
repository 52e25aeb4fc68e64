"""The gateway's servicers: FraudScoring (ScoreRequest in, validated transaction through the
pipeline, ScoreResponse out, decision event after the answer) and OutcomeService
(ReportOutcomeRequest in, validated, OutcomeEvent on the log, acknowledgement out)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import grpc

from fraud.v1 import outcomes_pb2, outcomes_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common import telemetry
from services.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.events import REPORTERS, VERDICTS, EventEmitter, Journaled, set_time
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, Pipeline, ScoredBy, ScoreResult, Source
from services.gateway.validate import Limits, validate, validate_outcome

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


def _span_attributes(result: ScoreResult, budget: Budget, elapsed_s: float) -> dict[str, Any]:
    """The project's attributes of a traced Score: how it was answered, and the budget's
    slices in milliseconds."""
    policy = budget.policy
    return {
        "fraudmesh.decision": result.decision.value,
        "fraudmesh.scored_by": result.scored_by.value,
        "fraudmesh.feature_source": result.feature_source.value,
        "fraudmesh.model_version": result.model_version,
        "fraudmesh.score": result.score,
        "fraudmesh.budget.total_ms": budget.total_s * 1000,
        "fraudmesh.budget.features_cap_ms": policy.features_cap_s * 1000,
        "fraudmesh.budget.scorer_cap_ms": policy.scorer_cap_s * 1000,
        "fraudmesh.budget.reserve_ms": policy.reserve_s * 1000,
        "fraudmesh.elapsed_ms": elapsed_s * 1000,
    }


class FraudScoringServicer(pb_grpc.FraudScoringServicer):
    """Thin adapter between the public proto API and the scoring pipeline."""

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
        self._emitter = emitter
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
        pipeline = self._pipeline()
        if pipeline is None:
            raise Unavailable("gateway is still starting")
        if self._in_flight >= self._max_in_flight:
            # Shedding at once keeps the accepted calls inside their budget; queueing would
            # make every call late.
            self._metrics.shed.inc()
            raise ResourceExhausted("gateway at its concurrency limit; retry with backoff")
        self._in_flight += 1
        try:
            response, emit, journaled = await self._score(request, pipeline, budget, context)
            # Group commit: the answer waits for the fsync that covers its decision, but
            # never past the budget (the event is in the page cache meanwhile).
            if (
                journaled is not None
                and journaled.needs_sync
                and not await journaled.durable(budget.remaining())
            ):
                self._metrics.journal_sync_late.inc()
        finally:
            self._in_flight -= 1
        if emit is not None:
            # Runs once the answer's final batch has completed: the caller never waits on it.
            context.add_done_callback(emit)
        return response

    async def _score(
        self,
        request: pb.ScoreRequest,
        pipeline: Pipeline,
        budget: Budget,
        context: grpc.aio.ServicerContext,
    ) -> tuple[pb.ScoreResponse, Callable[..., None] | None, Journaled | None]:
        try:
            tx = validate(
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
        result = await pipeline.score(tx, budget)
        elapsed = budget.elapsed()
        m = self._metrics
        trace_id = telemetry.trace_id()
        if trace_id is None:
            m.latency.observe(elapsed)
        else:
            m.latency.observe(elapsed, exemplar={"trace_id": trace_id})
            telemetry.annotate(_span_attributes(result, budget, elapsed))
        m.decisions.labels(
            result.decision.value, result.scored_by.value, result.feature_source.value
        ).inc()
        m.scores.labels(result.scored_by.value).observe(result.score)
        response = pb.ScoreResponse(
            transaction_id=tx.transaction_id,
            decision=_DECISION[result.decision],
            score=result.score,
            reasons=result.reasons,
            model_version=result.model_version,
            scored_by=_SCORED_BY[result.scored_by],
            feature_source=_SOURCE[result.feature_source],
            elapsed_ms=elapsed * 1000.0,
        )
        emitter = self._emitter
        emit: Callable[..., None] | None = None
        journaled: Journaled | None = None
        decided_at = time.time()
        if emitter is not None and emitter.journaled:
            journaled = emitter.before_answer(
                request, tx.card_not_present, result, response, decided_at
            )
            if journaled is not None and result.shadow is not None:
                emit = journaled.complete
        elif emitter is not None and emitter.enabled:
            emit = functools.partial(
                emitter.decision, request, tx.card_not_present, result, response, decided_at
            )
        shadow = result.shadow
        if shadow is None:
            return response, emit, journaled

        def after_answer(_context: object = None) -> None:
            # Shadow scoring starts once the answer has been sent, never before; the decision
            # event waits for the shadow's score (or its end without one) to carry it.
            pipeline.after_answer(result)
            if emit is not None:
                shadow.when_done(emit)

        return response, after_answer, journaled


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
