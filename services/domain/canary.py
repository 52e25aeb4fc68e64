"""The canary policy: one set of yardsticks for how far a candidate may drift from live.

Two judges read it. The gateway's fast guard (``services.gateway.canary``) watches every
gateway's own model calls and stops a canary at once on a breach: errors, model-call
latency, and a gross excess of declines. The monitor's staged analysis
(``services.monitor.controller``) judges each rollout step on every gateway's decisions:
the same errors and latency yardsticks, then the approve, review and decline rates in both
directions, the score PSI, precision and recall, and the shadow gate.

The yardsticks both judges apply are written once here (``max_error_rate_increase``,
``p99_ratio``, ``p99_slack_ms``). Each judge keeps its own noise margin, for a reason: the
guard looks at a sliding window after every call, so it needs a stricter bar against
chance (``confidence_z`` standard errors) than the analysis, which gives one verdict per
step (intervals at ``level``). Pure data; the settings of both services and the
``fraudmesh model rollout`` flags build it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CanaryPolicy:
    """How far a canary may differ from live, for the fast guard and the staged analysis."""

    # -- yardsticks both judges apply
    max_error_rate_increase: float = 0.05
    """Canary error-and-timeout rate may exceed live's by this much (0.05 = 5 points)."""
    p99_ratio: float = 2.0
    """Canary latency may reach this multiple of live's p99 …"""
    p99_slack_ms: float = 2.0
    """… plus this much (small p99s are noisy)."""

    # -- the fast guard in each gateway (breaches, judged on a sliding window)
    window_calls: int = 500
    """Most recent model calls kept per arm."""
    window_s: float = 120.0
    """Calls older than this leave the window."""
    min_calls: int = 100
    """Calls each arm needs before the canary is judged."""
    p99_min_calls: int = 100
    """Calls each arm needs before the p99s are compared."""
    max_decline_rate_increase: float = 0.05
    """A gross excess of declines that stops the canary at once (the analysis judges the
    finer ``rate_abs`` / ``rate_rel`` at each step)."""
    confidence_z: float = 3.0
    """A rate breaches only when its excess is this many standard errors past the limit."""

    # -- the staged analysis in the monitor (decision rates and quality, once per step)
    level: float = 0.99
    """Confidence of every interval: a failed step must be beyond this level's noise."""
    rate_abs: float = 0.005
    """A decision rate may differ from live's by at least this much (0.005 = half a point) …"""
    rate_rel: float = 0.25
    """… or by this share of live's rate (of its complement when above one half),
    whichever is larger."""
    late_share: float = 0.01
    """Share of the canary's answers that may be late (1 %: what a p99 allows)."""
    psi_limit: float = 0.1
    """Score PSI between the arms allowed beyond sampling noise."""
    psi_noise: float = 3.0
    """Sampling noise of a PSI, as a multiple of its expected value between two samples of
    one distribution, (bins − 1) × (1/n₁ + 1/n₂)."""
    min_agreement: float = 0.95
    """Shadow: least share of decisions the shadow must agree with."""
    min_shadow_scored: float = 0.9
    """Shadow: least share of answers the shadow must have scored in time."""
    recall_drop: float = 0.05
    """Matured labels: precision and recall may be this much lower than live's."""
    min_matured_frauds: int = 30
    """Matured frauds each version needs before precision and recall are compared."""

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ValueError(problem)

    def p99_bound_ms(self, live_p99_ms: float) -> float:
        """The latency a canary answer may reach, given live's p99 (both in ms)."""
        return self.p99_ratio * live_p99_ms + self.p99_slack_ms

    def allowed_rate_gap(self, live_rate: float) -> float:
        """How far a decision rate may move from live's ``live_rate`` at a step."""
        # Relative to the rarer side: an approve rate of 95 % moving by 5 points doubles
        # what is not approved.
        share = min(live_rate, 1 - live_rate) if 0 <= live_rate <= 1 else 0.0
        return max(self.rate_abs, self.rate_rel * share)

    def with_overrides(self, overrides: Mapping[str, float]) -> CanaryPolicy:
        """This policy with some fields replaced; ValueError names an unknown or bad field."""
        known = {f.name: f for f in dataclasses.fields(self)}
        values: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in known:
                raise ValueError(f"{name}: not a canary policy field ({', '.join(known)})")
            default = getattr(self, name)
            if isinstance(default, int) and not float(value).is_integer():
                raise ValueError(f"{name}: {value!r} is not a whole number")
            values[name] = int(value) if isinstance(default, int) else float(value)
        return dataclasses.replace(self, **values)


_SHARES: tuple[str, ...] = ("max_error_rate_increase", "max_decline_rate_increase", "rate_abs")
_SHARES += ("late_share", "min_agreement", "min_shadow_scored", "recall_drop")
_COUNTS = ("window_calls", "min_calls", "p99_min_calls")


def _problem(policy: CanaryPolicy) -> str | None:
    """What makes ``policy`` unusable, naming the field, or None."""
    for name in _SHARES:
        value = getattr(policy, name)
        if not 0 <= value <= 1:  # False for NaN
            return f"{name}: {value} is not a share from 0 to 1"
    for name in _COUNTS:
        if getattr(policy, name) < 1:
            return f"{name}: {getattr(policy, name)} is below 1"
    for name in ("p99_ratio", "window_s", "confidence_z"):
        if not getattr(policy, name) > 0:
            return f"{name}: {getattr(policy, name)} is not above 0"
    for name in ("p99_slack_ms", "rate_rel", "psi_limit", "psi_noise", "min_matured_frauds"):
        if not getattr(policy, name) >= 0:
            return f"{name}: {getattr(policy, name)} is below 0"
    if not 0 < policy.level < 1:
        return f"level: {policy.level} is not a confidence between 0 and 1"
    if policy.max_decline_rate_increase < policy.rate_abs:
        # A guard stricter than the analysis would stop canaries the analysis passes.
        return (
            f"max_decline_rate_increase: {policy.max_decline_rate_increase} is below "
            f"rate_abs {policy.rate_abs}"
        )
    return None
