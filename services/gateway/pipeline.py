"""The scoring core: one call context passed down an ordered fallback ladder.

Transport-free: the feature and model clients are injected, so the core is tested without
servers. Whatever fails behind it, ``score`` returns an on-time result.

Which model version answers comes from the route table (``routing.py``), swapped whole
when the lifecycle changes: the live version, or the canary for its share of cards. The
version that answers brings its own feature order, defaults and thresholds. A call reads
the features once, builds one ``Call`` (request, budget, route, features, answers so far)
and hands it down the ladder; each rung answers or passes on:

    controls     the fraud team's lists and rules that decide outright (``controls.py``;
                 none while the lists are empty and no policy is live)
    first stage  the small model's clear approval (cascade on), without the model call
    model        the routed version (a canary first, with its own breaker and a shorter
                 slice; when it cannot answer the call goes on with live from the first
                 stage, and the canary watch counts the failure)
    small model  alone, with its own thresholds, when the model cannot answer
    rules        the fallback that always answers

``Pipeline.score`` runs the rungs in order. Every answer is built by ``Pipeline._answer``;
the canary watch hears of every model call and first-stage approval in ``Pipeline._watch``.
A model or first-stage answer carries a shadow job while a shadow version is routed,
scored once the answer has been sent (``followup.py``).

A model's REVIEW or DECLINE answer on the store's features then carries the model's own
reasons: the exact TreeSHAP contributions of the answering version's trees
(``Pipeline._explained``), within what the budget leaves; approvals never wait for them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from services.domain import featurespec
from services.domain.rules import RulesEngine, RulesVerdict
from services.gateway.breaker import CircuitBreaker
from services.gateway.budget import Budget
from services.gateway.decision import Decision, decide
from services.gateway.metrics import GatewayMetrics
from services.gateway.ports import (
    Arm,
    DependencyError,
    FeatureClient,
    ModelClient,
    ModelExplainer,
    SmallModelClient,
)
from services.gateway.routing import ModelRoute, RouteTable
from services.gateway.shadow import ShadowJob, ShadowQueue, ShadowResult
from services.gateway.validate import Transaction
from services.models.explain import DEFAULT_TOP_K
from services.models.repository import ModelMetadata

log = logging.getLogger(__name__)

__all__ = [
    "CANARY_CAP_S",
    "CASCADE",
    "LADDER",
    "Call",
    "Control",
    "Decision",
    "Outright",
    "Pipeline",
    "ScoreResult",
    "ScoredBy",
    "Source",
    "ThresholdOverride",
    "guarded",
]


CANARY_CAP_S = 0.008
"""Longest a canary model call may take by default; after it the live version answers, with
the rest of the budget."""


CASCADE = True
"""Whether the small model's first stage approves clear cases by default: on, as its quality
on the test period allows it (docs/cascade.md)."""


LADDER: tuple[str, ...] = ("controls", "first stage", "model", "small model", "rules")
"""The rungs a call passes down, in order (docs/architecture.md draws them)."""


class ScoredBy(enum.Enum):
    """Which engine produced the score."""

    MODEL = "model"
    RULES = "rules"
    FIRST_STAGE = "first_stage"
    """The cascade's first stage: the small model's clear approval, without the model call."""
    SMALL_MODEL = "small_model"
    """The small model alone, because the model could not answer."""


class Source(enum.Enum):
    """Where the features came from."""

    ONLINE = "online"
    PARTIAL = "partial"
    DEFAULT = "default"


T = TypeVar("T")


async def guarded(breaker: CircuitBreaker, call: Callable[[], Awaitable[T]]) -> T:
    """Runs ``call`` under ``breaker``: refused while open, success or failure and duration recorded."""
    if not breaker.try_acquire():
        raise DependencyError(breaker.name, "breaker_open")
    start = time.perf_counter()
    try:
        result = await call()
    except DependencyError:
        breaker.on_error(time.perf_counter() - start)
        raise
    except asyncio.CancelledError:
        # The caller went away: nothing to judge the dependency by.
        breaker.release()
        raise
    breaker.on_success(time.perf_counter() - start)
    return result


@dataclass(slots=True)
class ScoreResult:
    """What scoring one transaction gave: the decision and how it was reached."""

    decision: Decision
    score: float
    reasons: list[str] = field(default_factory=list)
    model_version: str = ""
    """The version that answered (``rules-…`` when the rules did)."""
    scored_by: ScoredBy = ScoredBy.MODEL
    feature_source: Source = Source.ONLINE
    arm: Arm = Arm.LIVE
    """The arm that answered: the canary, or live (also when the rules answered)."""
    canary_failed: str = ""
    """The canary version this card was routed to when the canary could not answer (live or
    the rules answered instead); empty otherwise."""
    canary_timed_out: bool = False
    """True when that canary ran out of time rather than failed."""
    shadow: ShadowJob | None = None
    """The shadow version's scoring of this transaction, run after the answer is sent
    (``Pipeline.after_answer``): ``shadow.version``, ``await shadow.wait(timeout)``."""
    features: list[float] = field(default_factory=list)
    """The model input the score was computed from, in ``feature_order``."""
    feature_order: tuple[str, ...] = ()
    """Names of ``features``: the feature order of the version whose input was built."""
    store: Mapping[str, float | None] | None = None
    """The store read ``features`` came from (the decision event names the values that
    took defaults from it, after the answer)."""
    feature_positions: tuple[int, ...] | None = None
    """Where each of ``features`` sits in ``featurespec.SERVABLE_FEATURES``; None for the
    ``MODEL_FEATURES`` order (``featurespec.missing_inputs``)."""
    shadow_rules: tuple[str, ...] = ()
    """``name=action`` of the fraud team's shadow rules that fired on this call."""

    @property
    def shadow_version(self) -> str:
        """The shadow version that scores this transaction, or empty."""
        return self.shadow.version if self.shadow is not None else ""

    def shadow_result(self) -> ShadowResult | None:
        """The shadow's result if it has finished, else None."""
        return self.shadow.result() if self.shadow is not None else None


_NO_BUDGET = "too little budget left for the model"


@dataclass(frozen=True, slots=True)
class ThresholdOverride:
    """A merchant's own review and decline thresholds for model answers, from a control."""

    review: float
    decline: float
    source: str
    """Where they come from (the policy version), for the answer's reason."""


@dataclass(slots=True, eq=False)
class Call:
    """One Score call as it passes down the ladder: the request, its budget, the routing it
    started with, the features read, the route answering now, and what was learnt so far."""

    tx: Transaction
    budget: Budget
    table: RouteTable
    """The routing this call follows from start to end, whatever swaps meanwhile."""
    route: ModelRoute
    """The version answering now: the card's, then live once a canary could not answer."""
    arm: Arm
    store: Mapping[str, float | None]
    source: Source
    notes: list[str]
    """Notes every answer ends with (how the features were read)."""
    inputs: list[float]
    """Every computed feature (``featurespec.SERVABLE_FEATURES`` order): what rules see."""
    vector: list[float]
    """The answering version's input, in its own feature order."""
    small_score: float | None = None
    small_tried: bool = False
    """Whether ``small_score`` was asked of this route's small model (None: it failed)."""
    verdict: RulesVerdict | None = None
    named: dict[str, float] | None = None
    fallback: str = _NO_BUDGET
    """Why the model did not answer, for the fallback's reason."""
    canary_failed: str = ""
    canary_timed_out: bool = False
    shadow_rules: tuple[str, ...] = ()
    """``name=action`` of the fraud team's shadow rules that fired (recorded, never acted on)."""
    thresholds: ThresholdOverride | None = None
    """The merchant's own thresholds for a model's answer, set by a control; None: the
    answering version's."""

    def go_live(self) -> None:
        """The canary could not answer: the call goes on with the live version."""
        route = self.route = self.table.live
        self.arm = Arm.LIVE
        self.inputs, self.vector = route.inputs(self.tx, self.store)
        self.small_score, self.small_tried = None, False
        self.verdict = self.named = None

    def rules(self, engine: RulesEngine) -> tuple[RulesVerdict, dict[str, float]]:
        """The rules' verdict on this call's features (evaluated once), and the features by
        name."""
        verdict, named = self.verdict, self.named
        if verdict is None or named is None:
            # The inputs stop before the helper features unless the version takes one.
            named = self.named = dict(zip(featurespec.SERVABLE_FEATURES, self.inputs, strict=False))
            verdict = self.verdict = engine.evaluate(named)
        return verdict, named


@dataclass(frozen=True, slots=True)
class Outright:
    """A control's decision, taken before any model is asked."""

    decision: Decision
    score: float
    reason: str
    """Why, naming the list or rule that decided (the answer's first reason)."""
    version: str
    """The version of the control set that decided (the answer's ``model_version``)."""


class Control(Protocol):
    """A list or rule of the fraud team that may decide a payment outright: the ladder's
    first rung asks each in order, and the first that decides answers."""

    def decide(self, call: Call) -> Outright | None:
        """The decision on ``call``, or None to pass it on."""
        ...


class Pipeline:
    """Scores validated transactions down the ladder with the routed model version, falling
    back to the live version, the small model and the rules."""

    def __init__(
        self,
        metadata: ModelMetadata,
        rules: RulesEngine,
        features: FeatureClient,
        model: ModelClient,
        metrics: GatewayMetrics,
        features_breaker: CircuitBreaker,
        scorer_breaker: CircuitBreaker,
        *,
        canary_cap_s: float = CANARY_CAP_S,
        shadow_queue: ShadowQueue | None = None,
        small: SmallModelClient | None = None,
        cascade: bool = CASCADE,
        controls: Sequence[Control] = (),
        explainer: ModelExplainer | None = None,
        model_reasons: int = DEFAULT_TOP_K,
    ) -> None:
        self.routes = RouteTable(live=ModelRoute(metadata, model, small, explainer))
        self.model_reasons = model_reasons
        """How many of the model's features a REVIEW or DECLINE answer names (0: none)."""
        """What answers now; replaced whole when the lifecycle changes."""
        self.cascade = cascade
        """Whether a routed version's small model approves clear cases first."""
        self.controls = tuple(controls)
        """The fraud team's lists and rules that decide outright, asked first in order."""
        self.features_breaker = features_breaker
        self.scorer_breaker = scorer_breaker
        self.rules = rules
        self.features = features
        self.metrics = metrics
        self.canary_cap_s = canary_cap_s
        self.scorer_suspect = False
        """The live model's last call timed out and none has answered since: its next calls
        get ``BudgetPolicy.scorer_suspect_cap_s`` where a small model can answer instead."""
        self.shadow_queue = shadow_queue
        """Where shadow jobs go after the answer (``ShadowScorer`` scores them); None scores
        no shadow."""
        self._store_names = featurespec.STORE_FEATURES
        # A payment that names no terminal expects none of the terminal's features.
        self._named_store = featurespec.CARD_FEATURES + featurespec.MERCHANT_FEATURES
        # Labelled counters, looked up once each: ``labels()`` takes a lock per call.
        self._counters: dict[tuple[ScoredBy, Arm, str], Any] = {}
        self._small_failed: set[str] = set()
        self._mismatched: set[str] = set()

    @property
    def metadata(self) -> ModelMetadata:
        """The live version's metadata."""
        return self.routes.live.metadata

    @property
    def model(self) -> ModelClient:
        """The live version's client."""
        return self.routes.live.client

    async def _read_features(
        self, tx: Transaction, budget: Budget
    ) -> tuple[Mapping[str, float | None], Source]:
        timeout = budget.features_timeout()
        if timeout <= 0:
            self.metrics.dependency_error("features", "no_budget")
            return {}, Source.DEFAULT
        try:
            store = await guarded(
                self.features_breaker,
                lambda: self.features.get(
                    tx.card_id, tx.merchant_id, tx.timestamp_s, timeout, tx.terminal_id
                ),
            )
        except DependencyError as error:
            self.metrics.dependency_error("features", error.reason)
            return {}, Source.DEFAULT
        expected = self._store_names if tx.terminal_id else self._named_store
        missing = sum(1 for name in expected if store.get(name) is None)
        if missing == 0:
            return store, Source.ONLINE
        if missing == len(expected):
            return store, Source.DEFAULT
        return store, Source.PARTIAL

    async def score(self, tx: Transaction, budget: Budget) -> ScoreResult:
        """Scores ``tx`` down the ladder (``LADDER``, the rules always answer); always
        returns before the budget's reserve is spent."""
        table = self.routes
        route, arm = table.pick(tx.card_id)
        store, source = await self._read_features(tx, budget)
        notes = [] if source is Source.ONLINE else [_SOURCE_NOTE[source]]
        inputs, vector = route.inputs(tx, store)
        call = Call(tx, budget, table, route, arm, store, source, notes, inputs, vector)
        answer = self._decided_outright(call) or self._first_stage(call)
        if answer is None and arm is Arm.CANARY:
            answer = await self._canary_model(call)
            if answer is None:
                call.go_live()
                answer = self._first_stage(call)
        answer = (
            answer
            or await self._model(call)
            or self._small_model(call)
            or self._rules_fallback(call)
        )
        return await self._explained(call, answer)

    async def _explained(self, call: Call, result: ScoreResult) -> ScoreResult:
        """``result`` with the model's own reasons after its first when the model gave a
        REVIEW or DECLINE on the store's features and they come within the budget; as it
        is otherwise (every other answer keeps its threshold-written reasons)."""
        explainer = call.route.explainer
        if (
            explainer is None
            or self.model_reasons <= 0
            or result.scored_by is not ScoredBy.MODEL
            or result.decision is Decision.APPROVE
            or call.source is Source.DEFAULT
        ):
            return result
        timeout = call.budget.explain_timeout()
        if timeout <= 0:
            self.metrics.model_reasons.labels("no_budget").inc()
            return result
        try:
            explanation = await explainer.explain(call.vector, timeout)
        except DependencyError as error:
            self.metrics.model_reasons.labels(error.reason).inc()
            return result
        # The trees explained must be the ones that served: otherwise no model reasons.
        if not explanation.matches(result.score):
            self.metrics.model_reasons.labels("mismatch").inc()
            if call.route.version not in self._mismatched:
                self._mismatched.add(call.route.version)
                log.error(
                    "the version's trees do not give its served scores; no model reasons",
                    extra={"version": call.route.version, "served": result.score,
                           "explained": explanation.probability},
                )  # fmt: skip
            return result
        self.metrics.model_reasons.labels("given").inc()
        result.reasons[1:1] = explanation.reasons(self.model_reasons)
        return result

    # The rungs ---------------------------------------------------------------------------

    def _decided_outright(self, call: Call) -> ScoreResult | None:
        """The first control that decides, or None (always None without controls)."""
        for control in self.controls:
            outright = control.decide(call)
            if outright is not None:
                return self._answer(
                    call,
                    ScoredBy.RULES,
                    outright.score,
                    outright.decision,
                    [outright.reason, *call.notes],
                    version=outright.version,
                )
        return None

    def _first_stage(self, call: Call) -> ScoreResult | None:
        """The cascade's clear approval: the small model's score below the version's
        clear-approve threshold (itself never above its review threshold), never on default
        features."""
        route = call.route
        # A degraded answer must be a safe one: on default features every card looks like
        # the population's average, so a clear approval there could let through what the
        # full path would hold. The model decides instead (docs/cascade.md).
        if not self.cascade or route.small is None or call.source is Source.DEFAULT:
            return None
        # A merchant held to a lower review threshold than the clear approval's is not
        # approved on the small model's word.
        if call.thresholds is not None and call.thresholds.review < route.clear_approve:
            return None
        score = self._small_score(call)
        if score is None or score >= route.clear_approve:
            return None
        self._watch(call, True, None, False)
        reason = (
            f"small model score {score:.3f} < clear-approve threshold "
            f"{route.clear_approve:.3f}: approved at the first stage"
        )
        return self._answer(
            call, ScoredBy.FIRST_STAGE, score, Decision.APPROVE, [reason, *call.notes]
        )

    async def _canary_model(self, call: Call) -> ScoreResult | None:
        """The canary's model answer, in a short slice and under its own breaker; None when
        it was not asked (no budget left) or failed (noted in ``call``)."""
        breaker = call.table.canary_breaker
        timeout = min(call.budget.scorer_timeout(), self.canary_cap_s)
        if breaker is None or timeout <= 0:
            return None
        route, vector = call.route, call.vector
        started = time.perf_counter()
        try:
            score = await guarded(breaker, lambda: route.client.score(vector, timeout))
        except DependencyError as error:
            self.metrics.dependency_error("scorer-canary", error.reason)
            # A refusal by the canary's open breaker counts as a failure too: it only
            # opens on failures, and the watch must still reach its verdict.
            opened = error.reason == "breaker_open"
            self._watch(call, False, 0.0 if opened else time.perf_counter() - started, False)
            # The event says the canary failed this card, so one process watching every
            # gateway's events can judge the canary's error and timeout rates.
            call.canary_failed, call.canary_timed_out = route.version, error.reason == "timeout"
            return None
        return self._model_answer(call, score, time.perf_counter() - started)

    async def _model(self, call: Call) -> ScoreResult | None:
        """Live's model answer; None (the reason noted in ``call``) when it gives none in
        time."""
        route, vector = call.route, call.vector
        timeout = call.budget.scorer_timeout(
            suspect=self.scorer_suspect and route.small is not None
        )
        if timeout <= 0:
            self.metrics.dependency_error("scorer", "no_budget")
            return None
        started = time.perf_counter()
        try:
            score = await guarded(self.scorer_breaker, lambda: route.client.score(vector, timeout))
        except DependencyError as error:
            self.metrics.dependency_error("scorer", error.reason)
            if error.reason == "timeout":
                self.scorer_suspect = True
            call.fallback = f"model {_REASON_TEXT.get(error.reason, error.reason)}"
            if error.reason != "breaker_open":
                self._watch(call, False, time.perf_counter() - started, False)
            return None
        self.scorer_suspect = False
        return self._model_answer(call, score, time.perf_counter() - started)

    def _small_model(self, call: Call) -> ScoreResult | None:
        """The small model alone, with its own thresholds, the model having failed."""
        route = call.route
        if route.small is None:
            return None
        score = call.small_score if call.small_tried else self._small_score(call)
        if score is None:
            call.fallback += "; small model failed"
            return None
        t = route.small_thresholds
        assert t is not None
        decision = decide(score, t.review, t.decline)
        verdict, named = call.rules(self.rules)
        reasons = [
            _model_reason(score, decision, t.review, t.decline, "small model"),
            *verdict.reasons(named),
            f"small model fallback: {call.fallback}",
            *call.notes,
        ]
        return self._answer(call, ScoredBy.SMALL_MODEL, score, decision, reasons)

    def _rules_fallback(self, call: Call) -> ScoreResult:
        """The rules' answer: the last rung, always there."""
        verdict, named = call.rules(self.rules)
        decision = decide(verdict.score, self.rules.review, self.rules.decline)
        reasons = [
            *(verdict.reasons(named) or ["no rule fired"]),
            f"rules fallback: {call.fallback}",
            *call.notes,
        ]
        return self._answer(
            call,
            ScoredBy.RULES,
            verdict.score,
            decision,
            reasons,
            version=f"rules-{self.rules.version}",
        )

    # What the rungs share ----------------------------------------------------------------

    def _model_answer(self, call: Call, score: float, elapsed_s: float) -> ScoreResult:
        """The answering version's decision on its model's ``score``, timed ``elapsed_s``."""
        t, own = call.route.thresholds, call.thresholds
        review, decline = (own.review, own.decline) if own is not None else (t.review, t.decline)
        decision = decide(score, review, decline)
        self._watch(call, True, elapsed_s, decision is Decision.DECLINE)
        verdict, named = call.rules(self.rules)
        reasons = [
            _model_reason(score, decision, review, decline),
            *([f"the merchant's own thresholds ({own.source})"] if own is not None else []),
            *verdict.reasons(named),
            *call.notes,
        ]
        return self._answer(call, ScoredBy.MODEL, score, decision, reasons)

    def _small_score(self, call: Call) -> float | None:
        """The route's small-model score of the call's input; None (counted, logged once a
        version) when it fails."""
        route = call.route
        small = route.small
        assert small is not None
        call.small_tried = True
        try:
            score = call.small_score = small.score(call.vector)
        except Exception:
            self.metrics.dependency_error("small-model", "error")
            # Once per version: a broken model would fail every call.
            if route.version not in self._small_failed:
                self._small_failed.add(route.version)
                log.exception("small model failed", extra={"version": route.version})
            return None
        return score

    def _watch(self, call: Call, ok: bool, latency_s: float | None, declined: bool) -> None:
        """Tells the canary watch (while a canary runs) of one model call or first-stage
        approval (``latency_s`` None) of the call's arm."""
        watch = call.table.watch
        if watch is not None:
            watch.record(call.arm, ok, latency_s, declined)

    def _answer(
        self,
        call: Call,
        scored_by: ScoredBy,
        score: float,
        decision: Decision,
        reasons: list[str],
        *,
        version: str = "",
    ) -> ScoreResult:
        """Every answer, built here: counted, with the call's input, features and canary
        note, and a shadow job for a model's answer while a shadow is routed."""
        route, arm = call.route, call.arm
        self._count(scored_by, arm, route.version)
        result = ScoreResult(
            decision,
            score,
            reasons,
            version or route.version,
            scored_by,
            call.source,
            arm,
            call.canary_failed,
            call.canary_timed_out,
            None,
            call.vector,
            route.order,
            call.store,
            route.positions,
            call.shadow_rules,
        )
        shadow = call.table.shadow
        if shadow is not None and self.shadow_queue is not None and scored_by in _SHADOWED:
            result.shadow = ShadowJob(
                shadow, call.tx, call.store, score, decision, call.source is Source.DEFAULT
            )
        return result

    def _count(self, scored_by: ScoredBy, arm: Arm, version: str) -> None:
        """Counts a model's or a small model's answer in its labelled counter."""
        key = (scored_by, arm, version)
        counter = self._counters.get(key)
        if counter is None:
            if scored_by is ScoredBy.MODEL:
                counter = self.metrics.model_answers.labels(arm.value, version)
            elif scored_by in _SMALL_ROLE:
                counter = self.metrics.small_model_answers.labels(
                    arm.value, version, _SMALL_ROLE[scored_by]
                )
            else:
                return
            self._counters[key] = counter
        counter.inc()

    def after_answer(self, result: ScoreResult) -> None:
        """Hands the result's shadow job (if any) to the shadow workers; call it once the
        answer has been sent."""
        job, queue = result.shadow, self.shadow_queue
        if job is not None and queue is not None:
            queue.submit(job)


_SHADOWED = frozenset({ScoredBy.MODEL, ScoredBy.FIRST_STAGE})
"""Answers a shadow version scores too: the models' (a fallback's would compare nothing)."""

_SMALL_ROLE = {ScoredBy.FIRST_STAGE: "first_stage", ScoredBy.SMALL_MODEL: "fallback"}

_REASON_TEXT = {
    "breaker_open": "circuit breaker open",
    "timeout": "timed out",
    "unavailable": "unavailable",
}

_SOURCE_NOTE = {
    Source.PARTIAL: "some features missing or stale: population defaults used for them",
    Source.DEFAULT: "no online features: population defaults used",
}


def _model_reason(
    score: float, decision: Decision, review: float, decline: float, engine: str = "model"
) -> str:
    if decision is Decision.DECLINE:
        return f"{engine} score {score:.3f} >= decline threshold {decline:.3f}"
    if decision is Decision.REVIEW:
        return f"{engine} score {score:.3f} >= review threshold {review:.3f}"
    return f"{engine} score {score:.3f} < review threshold {review:.3f}"
