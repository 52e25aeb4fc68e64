"""FraudScoring servicer: ScoreRequest in, validated transaction through the pipeline, ScoreResponse out."""

from __future__ import annotations

import time

import grpc

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from services.gateway.budget import Budget, BudgetPolicy
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, Pipeline, ScoredBy, Source
from services.gateway.validate import Limits, validate

_DECISION = {
    Decision.APPROVE: pb.DECISION_APPROVE,
    Decision.REVIEW: pb.DECISION_REVIEW,
    Decision.DECLINE: pb.DECISION_DECLINE,
}
_SCORED_BY = {ScoredBy.MODEL: pb.SCORED_BY_MODEL, ScoredBy.RULES: pb.SCORED_BY_RULES}
_SOURCE = {
    Source.ONLINE: pb.FEATURE_SOURCE_ONLINE,
    Source.PARTIAL: pb.FEATURE_SOURCE_PARTIAL,
    Source.DEFAULT: pb.FEATURE_SOURCE_DEFAULT,
}


class FraudScoringServicer(pb_grpc.FraudScoringServicer):
    """Thin adapter between the public proto API and the scoring pipeline."""

    def __init__(
        self, policy: BudgetPolicy, limits: Limits, metrics: GatewayMetrics, max_in_flight: int
    ) -> None:
        self.pipeline: Pipeline | None = None
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
        pipeline = self.pipeline
        if pipeline is None:
            raise Unavailable("gateway is still starting")
        if self._in_flight >= self._max_in_flight:
            # Shedding at once keeps the accepted calls inside their budget; queueing would
            # make every call late.
            self._metrics.shed.inc()
            raise ResourceExhausted("gateway at its concurrency limit; retry with backoff")
        self._in_flight += 1
        try:
            return await self._score(request, pipeline, budget, context)
        finally:
            self._in_flight -= 1

    async def _score(
        self,
        request: pb.ScoreRequest,
        pipeline: Pipeline,
        budget: Budget,
        context: grpc.aio.ServicerContext,
    ) -> pb.ScoreResponse:
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
        outcome = await pipeline.score(tx, budget)
        if outcome.shadow is not None:
            # Shadow scoring starts once the answer has been sent, never before.
            context.add_done_callback(lambda _: pipeline.after_answer(outcome))
        elapsed = budget.elapsed()
        m = self._metrics
        m.latency.observe(elapsed)
        m.decisions.labels(
            outcome.decision.value, outcome.scored_by.value, outcome.feature_source.value
        ).inc()
        m.scores.labels(outcome.scored_by.value).observe(outcome.score)
        return pb.ScoreResponse(
            transaction_id=tx.transaction_id,
            decision=_DECISION[outcome.decision],
            score=outcome.score,
            reasons=outcome.reasons,
            model_version=outcome.model_version,
            scored_by=_SCORED_BY[outcome.scored_by],
            feature_source=_SOURCE[outcome.feature_source],
            elapsed_ms=elapsed * 1000.0,
        )
