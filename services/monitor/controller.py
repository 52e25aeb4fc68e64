"""The rollout controller: carries out a staged rollout, judging every step on the decision
events of every gateway (the monitor sees them all).

A rollout (``services.models.rollout``) is a shadow gate, then canary shares (1, 5, 10, 25,
50 % by default), then the promotion, or a wait for ``fraudmesh model approve``. Each step is
judged on one window: the slices from the step's start on, the candidate's arm against the
live version's ``live`` arm, so both saw the same minutes of traffic. A step is judged once
both arms hold ``step_min_decisions``; a step still short of them after ``step_max_seconds``
rolls back (too little traffic to judge is no evidence the candidate is safe).

Every comparison allows a difference and adds the statistical margin of the window's size,
so a small window is judged as leniently as its noise requires and a large one as strictly
as its figures allow. The yardsticks are the canary policy (``CanaryPolicy``), which the
gateways' fast guard reads too; a rollout's ``policy`` (the ``fraudmesh model rollout
--policy`` flags) overrides fields of it for that rollout alone. The canary is compared
with live on:

- its failures (errors and timeouts, from ``DecisionEvent.canary_failed_version``) against
  live's (the rules answering for live);
- the share of its answers slower than live's p99 × ``p99_ratio`` + ``p99_slack_ms``: at
  most ``late_share`` beyond noise (a p99 of a few hundred calls is one or two calls, so the
  share above a bound is judged, not the quantile itself);
- each of the approve, review and decline rates, in both directions: a candidate that
  approves what live declines lets fraud through, one that declines more insults customers;
- the PSI between the arms' scores (the same ranking on another scale moves no rate at
  first, but it moves the scores);
- precision and recall at the thresholds, once both versions have matured labels.

The shadow gate compares the shadow's scores of the answered payments with live's: decision
agreement, score PSI and the share of answers the shadow scored in time (its errors,
timeouts and dropped jobs are the rest).

Decisions of a failed step retire the candidate at once with the figures as the reason;
every step's verdict is written into the lifecycle history and the rollout file. Pure logic
apart from ``RolloutController``, which reads the engine and writes the two files.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from services.common.errors import FraudmeshError
from services.domain import metrics
from services.domain.canary import CanaryPolicy
from services.models.lifecycle import ModelLifecycle, VersionState
from services.models.rollout import (
    CONTROLLER,
    Comparison,
    Phase,
    RolloutEnd,
    RolloutFile,
    RolloutPlan,
    StepResult,
)
from services.monitor import tally
from services.monitor.evaluation import Figures
from services.monitor.tally import DECISIONS, Tally

log = logging.getLogger(__name__)


RolloutPolicy = CanaryPolicy
"""The name the monitor's modules know the canary policy by."""


def _rate(k: int, n: int, level: float) -> metrics.Interval:
    return metrics.wilson_interval(k, n, level)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def psi_allowed(policy: CanaryPolicy, n1: int, n2: int) -> float:
    """The score PSI two windows of ``n1`` and ``n2`` decisions may show."""
    if n1 <= 0 or n2 <= 0:
        return math.inf
    noise = (metrics.PSI_BINS - 1) * (1 / n1 + 1 / n2)
    return policy.psi_limit + policy.psi_noise * noise


def compare_rate(
    name: str, k_c: int, n_c: int, k_l: int, n_l: int, policy: CanaryPolicy
) -> Comparison:
    """A rate of the candidate against live's, both directions: a breach when their intervals
    are further apart than the allowed difference."""
    c, live = _rate(k_c, n_c, policy.level), _rate(k_l, n_l, policy.level)
    allowed = policy.allowed_rate_gap(0.0 if math.isnan(live.estimate) else live.estimate)
    gap = max(c.low - live.high, live.low - c.high)
    passed = not gap > allowed
    return Comparison(
        name=f"{name} rate",
        passed=passed,
        candidate=c.estimate,
        live=live.estimate,
        detail=f"{_pct(c.estimate)} vs live {_pct(live.estimate)} (allowed ±{allowed:.1%} "
        f"beyond the {policy.level:.0%} intervals of {n_c} and {n_l} decisions)",
    )


def decision_rates(candidate: Tally, live: Tally, policy: CanaryPolicy) -> list[Comparison]:
    """Approve, review and decline rates, each in both directions."""
    return [
        compare_rate(
            d,
            int(candidate.by_decision[i]),
            candidate.decisions,
            int(live.by_decision[i]),
            live.decisions,
            policy,
        )
        for i, d in enumerate(DECISIONS)
    ]


def score_psi(candidate: Tally, live: Tally, policy: CanaryPolicy) -> Comparison:
    """PSI of the candidate's scores against live's, within the limit plus sampling noise."""
    value = tally.grid_psi(live, candidate)
    allowed = psi_allowed(policy, candidate.decisions, live.decisions)
    return Comparison(
        name="score PSI",
        passed=bool(math.isnan(value) or value <= allowed),
        candidate=None if math.isnan(value) else value,
        detail=f"{value:.3f} (allowed {allowed:.3f}: {policy.psi_limit:g} plus the noise of "
        f"{candidate.decisions} and {live.decisions} decisions)",
    )


def judge_canary(
    canary: Tally,
    live: Tally,
    live_rules: Tally,
    policy: CanaryPolicy,
    canary_quality: Figures | None = None,
    live_quality: Figures | None = None,
) -> list[Comparison]:
    """Every comparison of a canary step: ``canary`` and ``live`` are the arms' windows,
    ``live_rules`` the rules' answers standing in for live in the same window."""
    out: list[Comparison] = []
    routed = canary.decisions + canary.failed
    live_routed = live.decisions + live_rules.decisions
    c = _rate(canary.failed, routed, policy.level)
    lv = _rate(live_rules.decisions, live_routed, policy.level)
    out.append(
        Comparison(
            name="errors and timeouts",
            passed=not c.low - lv.high > policy.max_error_rate_increase,
            candidate=c.estimate,
            live=lv.estimate,
            detail=f"{_pct(c.estimate)} ({canary.timed_out} of {canary.failed} timed out) vs "
            f"live {_pct(lv.estimate)} (allowed +{policy.max_error_rate_increase:.0%} beyond the "
            f"{policy.level:.0%} intervals)",
        )
    )
    out.append(_late(canary, live, policy))
    out += decision_rates(canary, live, policy)
    out.append(score_psi(canary, live, policy))
    out += _quality(canary_quality, live_quality, policy)
    return out


def _late(canary: Tally, live: Tally, policy: CanaryPolicy) -> Comparison:
    live_p99 = tally.latency_quantile(live, 0.99)
    canary_p99 = tally.latency_quantile(canary, 0.99)
    n = int(canary.latency.sum())
    if math.isnan(live_p99) or n == 0:
        return Comparison(name="p99", passed=True, detail="not judged: no answers")
    bound = policy.p99_bound_ms(live_p99)
    edges = tally.LATENCY_EDGES_MS
    # Answers in a latency bin whose lower edge is at or above the bound are late for sure.
    first_late = next((i + 1 for i, e in enumerate(edges) if e >= bound), len(edges))
    late = int(canary.latency[first_late:].sum())
    share = _rate(late, n, policy.level)
    return Comparison(
        name="p99",
        passed=not share.low > policy.late_share,
        candidate=canary_p99,
        live=live_p99,
        detail=f"≤{canary_p99:g} ms vs live ≤{live_p99:g} ms; {late} of {n} answers beyond "
        f"{bound:g} ms (allowed {policy.late_share:.0%} beyond the {policy.level:.0%} interval)",
    )


def _quality(
    canary: Figures | None, live: Figures | None, policy: CanaryPolicy
) -> list[Comparison]:
    need = policy.min_matured_frauds
    if canary is None or live is None or min(canary.frauds, live.frauds) < need:
        have = (canary.frauds if canary else 0, live.frauds if live else 0)
        return [
            Comparison(
                name="precision and recall",
                passed=True,
                detail=f"not judged: {have[0]} and {have[1]} matured frauds (needs {need} each)",
            )
        ]
    out = []
    for figure in ("precision", "recall"):
        for threshold in ("review", "decline"):
            c = getattr(canary, figure)[threshold]
            lv = getattr(live, figure)[threshold]
            passed = not (c.high < lv.low - policy.recall_drop)
            out.append(
                Comparison(
                    name=f"{figure} at {threshold}",
                    passed=passed,
                    candidate=c.estimate,
                    live=lv.estimate,
                    detail=f"{_pct(c.estimate)} vs live {_pct(lv.estimate)} (may be "
                    f"{policy.recall_drop:.0%} lower beyond the intervals)",
                )
            )
    return out


def judge_shadow(shadow: Tally, live: Tally, policy: CanaryPolicy) -> list[Comparison]:
    """The shadow gate: agreement with the answered decisions, score PSI against live's
    scores, and the share of answers the shadow scored in time."""
    total = int(shadow.agreement.sum())
    agreed = int(shadow.agreement.trace())
    a = _rate(agreed, total, policy.level)
    scored = _rate(min(shadow.decisions, live.decisions), live.decisions, policy.level)
    return [
        Comparison(
            name="decision agreement",
            passed=not a.high < policy.min_agreement,
            candidate=a.estimate,
            detail=f"{_pct(a.estimate)} of {total} decisions (at least "
            f"{policy.min_agreement:.0%} within the {policy.level:.0%} interval)",
        ),
        score_psi(shadow, live, policy),
        Comparison(
            name="scored in time",
            passed=not scored.high < policy.min_shadow_scored,
            candidate=scored.estimate,
            detail=f"{_pct(scored.estimate)} of {live.decisions} answers (errors, timeouts "
            f"and dropped jobs are the rest; at least {policy.min_shadow_scored:.0%})",
        ),
    ]


# -- the controller ------------------------------------------------------------------------


class EngineView(Protocol):
    """What the controller reads from the monitor engine (``MonitorEngine``)."""

    def window(
        self,
        version: str,
        arms: Sequence[str] = ...,
        since_s: float | None = None,
        until_s: float | None = None,
    ) -> Tally:
        """The version's tally in ``arms`` since ``since_s``."""
        ...

    def versions(self, since_s: float, arms: Sequence[str] = ...) -> set[str]:
        """Versions with traffic in ``arms`` since ``since_s``."""
        ...

    def evaluation(self, version: str, now_s: float | None = None) -> dict[str, Figures]:
        """Live quality figures of a version."""
        ...


def _now() -> datetime:
    return datetime.now(UTC)


class RolloutController:
    """Carries out the rollout in the rollout file, one ``tick`` at a time."""

    def __init__(
        self,
        engine: EngineView,
        lifecycle: ModelLifecycle,
        plans: RolloutFile,
        slice_s: int,
        policy: CanaryPolicy | None = None,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.engine = engine
        self.lifecycle = lifecycle
        self.plans = plans
        self.slice_s = slice_s
        self.policy = policy or CanaryPolicy()
        self._clock = clock

    def run(self, stop: threading.Event, ready: Callable[[], bool], interval_s: float) -> None:
        """Ticks every ``interval_s`` while the monitor is caught up, until ``stop``."""
        while not stop.wait(interval_s):
            if not ready():
                continue  # a window of a log not yet read would judge missing traffic
            try:
                self.tick()
            except Exception:
                log.exception("rollout controller tick failed; retrying")

    def tick(self) -> RolloutPlan | None:
        """One step of the rollout, if one is under way; returns the plan as written."""
        if self.plans.read() is None:
            return None
        with self.plans.locked():
            plan = self.plans.read()
            if plan is None or plan.finished:
                return plan
            before = plan.model_dump_json()
            self._advance(plan)
            if plan.model_dump_json() != before:
                self.plans.write(plan)
            return plan

    def policy_of(self, plan: RolloutPlan) -> CanaryPolicy:
        """The policy that judges ``plan``: the monitor's, with the rollout's overrides."""
        return self.policy.with_overrides(plan.policy)

    def _advance(self, plan: RolloutPlan) -> None:
        try:
            self.policy_of(plan)
        except ValueError as error:
            self._finish(plan, RolloutEnd.STOPPED, f"canary policy refused: {error}")
            return
        state = self.lifecycle.read()
        record = state.versions.get(plan.version)
        if record is None:
            self._finish(plan, RolloutEnd.STOPPED, f"v{plan.version} is not published")
            return
        if record.state is VersionState.RETIRED:
            self._finish(plan, RolloutEnd.STOPPED, f"v{plan.version} was retired: {record.reason}")
            return
        if record.state is VersionState.LIVE:
            self._finish(plan, RolloutEnd.PROMOTED, f"v{plan.version} is live: {record.reason}")
            return
        if plan.phase is Phase.SHADOW:
            self._shadow(plan)
        elif plan.phase is Phase.CANARY:
            self._canary(plan, record.state)

    def _since(self, plan: RolloutPlan) -> float:
        assert plan.step_started_at is not None
        started = plan.step_started_at.timestamp()
        # The slice the step started in counts whole: both arms' traffic of it is in it.
        return started - started % self.slice_s

    def _elapsed(self, plan: RolloutPlan) -> float:
        assert plan.step_started_at is not None
        return (self._clock() - plan.step_started_at).total_seconds()

    def _shadow(self, plan: RolloutPlan) -> None:
        if plan.step_started_at is None:
            self.lifecycle.shadow(
                plan.version,
                by=CONTROLLER,
                reason=f"rollout: shadow gate over {plan.shadow_min_decisions} decisions",
            )
            plan.step_started_at = self._clock()
            return
        live_version = self.lifecycle.read().routing.live
        engine = self.engine
        if plan.window_from is None:
            if engine.window(plan.version, ("shadow",), self._since(plan)).decisions == 0:
                self._too_slow(plan, 0)
                return
            # The gateways score with it now: the window starts at the next whole slice,
            # so that every live answer in it had the shadow's chance to be scored.
            plan.window_from = self._next_slice()
            return
        since = plan.window_from.timestamp()
        shadow = engine.window(plan.version, ("shadow",), since)
        live = engine.window(live_version, ("live",), since) if live_version else Tally()
        if shadow.decisions < plan.shadow_min_decisions:
            self._too_slow(plan, shadow.decisions)
            return
        checks = judge_shadow(shadow, live, self.policy_of(plan))
        result = self._result(plan, "shadow", shadow, live, checks)
        if not result.passed:
            self._stop(plan, RolloutEnd.SHADOW_FAILED, f"shadow gate failed: {result.summary()}")
            return
        self.lifecycle.annotate(
            plan.version, f"shadow gate passed: {result.summary()}", by=CONTROLLER
        )
        if plan.stop_after_shadow:
            self._finish(plan, RolloutEnd.SHADOW_PASSED, result.summary())
            return
        plan.phase, plan.step, plan.step_started_at = Phase.CANARY, 0, None
        self._canary(plan, VersionState.SHADOW)

    def _next_slice(self) -> datetime:
        """The start of the next whole slice."""
        now = self._clock().timestamp()
        return datetime.fromtimestamp((now // self.slice_s + 1) * self.slice_s, UTC)

    def _too_few(self, plan: RolloutPlan, label: str, routed: int, live: int) -> None:
        """Rolls the canary back once the step's time is up without its decisions."""
        if self._elapsed(plan) > plan.step_max_seconds:
            self._stop(
                plan,
                RolloutEnd.ROLLED_BACK,
                f"rolled back at {label}: {routed} canary and {live} live decisions in "
                f"{plan.step_max_seconds:g} s, fewer than the {plan.step_min_decisions} a "
                "step needs to be judged",
            )

    def _too_slow(self, plan: RolloutPlan, decisions: int) -> None:
        """Fails the shadow gate once its time is up without its decisions."""
        if self._elapsed(plan) > plan.step_max_seconds:
            self._stop(
                plan,
                RolloutEnd.SHADOW_FAILED,
                f"shadow gate failed: {decisions} of {plan.shadow_min_decisions} decisions in "
                f"{plan.step_max_seconds:g} s, too little traffic to judge",
            )

    def _canary(self, plan: RolloutPlan, state: VersionState) -> None:
        share = plan.steps[plan.step]
        if share >= 100:
            self._last_step(plan)
            return
        label = f"canary {share:g}%"
        if plan.step_started_at is None:
            try:
                self.lifecycle.canary(
                    plan.version,
                    share,
                    by=CONTROLLER,
                    reason=f"rollout step {plan.step + 1} of {len(plan.steps)}",
                )
            except FraudmeshError as error:
                self._finish(plan, RolloutEnd.STOPPED, f"{label} refused: {error.message}")
                return
            plan.step_started_at, plan.window_from = self._clock(), None
            return
        if state is not VersionState.CANARY:
            # The gateways' own safety net rolled it back (the version is then retired and
            # seen above), or an operator moved it: the rollout does not fight either.
            self._finish(plan, RolloutEnd.STOPPED, f"v{plan.version} left its canary ({state})")
            return
        engine = self.engine
        live_version = self.lifecycle.read().routing.live or ""
        if plan.window_from is None:
            first = engine.window(plan.version, ("canary",), self._since(plan))
            if first.decisions + first.failed == 0:
                self._too_few(plan, label, 0, 0)
                return
            # The gateways route its share now: the window starts at the next whole slice,
            # so that both arms' decisions in it were made with the split in force. Live's
            # decisions of the slices before it are older traffic, which need not score
            # like the canary's share of the traffic since.
            plan.window_from = self._next_slice()
            return
        since = plan.window_from.timestamp()
        canary = engine.window(plan.version, ("canary",), since)
        live = engine.window(live_version, ("live",), since)
        rules = tally.merged(
            engine.window(v, ("live",), since)
            for v in engine.versions(since, ("live",))
            if v.startswith("rules-")
        )
        routed = canary.decisions + canary.failed
        if min(routed, live.decisions) < plan.step_min_decisions:
            self._too_few(plan, label, routed, live.decisions)
            return
        quality = engine.evaluation(plan.version)["matured"]
        live_quality = engine.evaluation(live_version)["matured"] if live_version else None
        policy = self.policy_of(plan)
        checks = judge_canary(canary, live, rules, policy, quality, live_quality)
        result = self._result(plan, label, canary, live, checks, routed)
        if not result.passed:
            self._stop(plan, RolloutEnd.ROLLED_BACK, f"rolled back at {label}: {result.summary()}")
            return
        self.lifecycle.annotate(plan.version, f"{label} passed: {result.summary()}", by=CONTROLLER)
        plan.step += 1
        plan.step_started_at = None
        self._canary(plan, state)

    def _last_step(self, plan: RolloutPlan) -> None:
        passed = len([r for r in plan.results if r.step.startswith("canary")])
        if plan.require_approval:
            plan.phase = Phase.APPROVAL
            self.lifecycle.annotate(
                plan.version,
                f"staged rollout: {passed} canary steps passed; waiting for "
                f"`fraudmesh model approve {plan.version}`",
                by=CONTROLLER,
            )
            return
        try:
            self.lifecycle.promote(
                plan.version, by=CONTROLLER, reason=f"staged rollout: {passed} canary steps passed"
            )
        except FraudmeshError as error:
            self._finish(plan, RolloutEnd.STOPPED, f"promotion refused: {error.message}")
            return
        self._finish(plan, RolloutEnd.PROMOTED, f"{passed} canary steps passed")

    def _result(
        self,
        plan: RolloutPlan,
        label: str,
        candidate: Tally,
        live: Tally,
        checks: list[Comparison],
        decisions: int | None = None,
    ) -> StepResult:
        result = StepResult(
            step=label,
            at=self._clock(),
            passed=all(c.passed for c in checks),
            decisions=candidate.decisions if decisions is None else decisions,
            live_decisions=live.decisions,
            seconds=round(self._elapsed(plan), 1),
            comparisons=checks,
        )
        plan.results.append(result)
        log.info(
            "rollout step judged",
            extra={"version": plan.version, "step": label, "passed": result.passed},
        )
        return result

    def _stop(self, plan: RolloutPlan, outcome: RolloutEnd, reason: str) -> None:
        """Retires the candidate with ``reason`` and ends the rollout."""
        try:
            self.lifecycle.retire(plan.version, by=CONTROLLER, reason=reason)
        except FraudmeshError as error:
            reason = f"{reason} (retiring it was refused: {error.message})"
        log.warning("rollout stopped", extra={"version": plan.version, "reason": reason})
        self._finish(plan, outcome, reason)

    def _finish(self, plan: RolloutPlan, outcome: RolloutEnd, reason: str) -> None:
        plan.phase = Phase.DONE
        plan.outcome = outcome
        plan.reason = reason
        plan.finished_at = self._clock()
