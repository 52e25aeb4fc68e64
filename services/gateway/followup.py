"""What follows an answer: its metrics and trace attributes, its decision event (journaled
before the answer, with the journal's group commit, or emitted after it), and the shadow
scoring of the same transaction, started once the answer has been sent.

The servicer converts the request, asks the pipeline and converts its result; everything
else a Score call sets in motion is here, so the transport stays a thin adapter.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from fraud.v1 import scoring_pb2 as pb
from services.gateway.budget import Budget
from services.gateway.events import EventEmitter, Journaled
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Pipeline, ScoreResult

Done = Callable[..., None]
"""What runs once the answer's final batch has completed (a gRPC done callback)."""


def span_attributes(result: ScoreResult, budget: Budget, elapsed_s: float) -> dict[str, Any]:
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


class Followup:
    """Records each answer and sets in motion what follows it."""

    def __init__(self, metrics: GatewayMetrics, emitter: EventEmitter | None) -> None:
        self._metrics = metrics
        self._emitter = emitter

    def observe(self, result: ScoreResult, elapsed_s: float, trace_id: str | None = None) -> None:
        """The answer's latency (with its trace, when traced, as exemplar), decision and
        score metrics."""
        m = self._metrics
        if trace_id is None:
            m.latency.observe(elapsed_s)
        else:
            m.latency.observe(elapsed_s, exemplar={"trace_id": trace_id})
        m.decisions.labels(
            result.decision.value, result.scored_by.value, result.feature_source.value
        ).inc()
        m.scores.labels(result.scored_by.value).observe(result.score)

    async def before_answer(
        self,
        request: pb.ScoreRequest,
        card_not_present: bool,
        result: ScoreResult,
        response: pb.ScoreResponse,
        budget: Budget,
        pipeline: Pipeline,
    ) -> Done | None:
        """Journals the decision (waiting for the fsync that covers it, never past the
        budget) or prepares its event; returns what must run once the answer is sent."""
        emit, journaled = self._decision(request, card_not_present, result, response)
        # Group commit: the answer waits for the fsync that covers its decision, but never
        # past the budget (the event is in the page cache meanwhile).
        if (
            journaled is not None
            and journaled.needs_sync
            and not await journaled.durable(budget.remaining())
        ):
            self._metrics.journal_sync_late.inc()
        shadow = result.shadow
        if shadow is None:
            return emit

        def after_answer(_context: object = None) -> None:
            # Shadow scoring starts once the answer has been sent, never before; the decision
            # event waits for the shadow's score (or its end without one) to carry it.
            pipeline.after_answer(result)
            if emit is not None:
                shadow.when_done(emit)

        return after_answer

    def _decision(
        self,
        request: pb.ScoreRequest,
        card_not_present: bool,
        result: ScoreResult,
        response: pb.ScoreResponse,
    ) -> tuple[Done | None, Journaled | None]:
        """The decision event: journaled now (completed after the shadow, if any), or
        emitted after the answer; and the journal entry to wait for."""
        emitter = self._emitter
        decided_at = time.time()
        if emitter is not None and emitter.journaled:
            journaled = emitter.before_answer(
                request, card_not_present, result, response, decided_at
            )
            if journaled is not None and result.shadow is not None:
                return journaled.complete, journaled
            return None, journaled
        if emitter is not None and emitter.enabled:
            emit = functools.partial(
                emitter.decision, request, card_not_present, result, response, decided_at
            )
            return emit, None
        return None, None
