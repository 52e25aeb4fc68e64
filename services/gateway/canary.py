"""The canary watch: does the canary behave like the live version on live traffic?

Each gateway keeps, per arm (live, canary), a sliding window of its recent model calls:
whether the call succeeded, how long it took and whether the answer was a decline. With the
cascade on, each arm's first-stage approvals join its window too (answered, not declined, no
model call to time): the cascade is part of a version's behaviour, and a canary whose small
model approves more clear cases shows a lower decline rate, not a higher one among fewer
model calls. Once both arms hold enough calls, the canary breaches when

- its error rate exceeds live's by more than ``max_error_rate_increase``,
- its decline rate exceeds live's by more than ``max_decline_rate_increase`` (a gross
  breach: the monitor's staged analysis judges every decision rate more finely), or
- its model-call p99 exceeds ``p99_ratio`` × live's p99 + ``p99_slack_ms`` (judged once
  both arms hold ``p99_min_calls``, so that a p99 is not just the slowest call).

The limits are the one canary policy (``services.domain.canary.CanaryPolicy``) that the
monitor's staged analysis reads too.

Both arms are judged by the same yardstick: the canary's calls are cut off at its slice of
the budget (``cap_s``), so a live call slower than that counts as a failure here too, and
a machine that is slow for everyone does not look like a bad canary. A rate breaches only
when its excess over the limit is also beyond ``confidence_z`` standard errors of the
difference, so a few unlucky calls in a small window do not roll back a good canary.

A breach names the figures; the gateway then stops sending cards to the canary and writes
an automatic rollback into the lifecycle file. Pure logic with an injectable clock; the
gateway records from its one event loop, so nothing is locked.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.domain import metrics
from services.domain.canary import CanaryPolicy
from services.gateway.ports import Arm

CanaryLimits = CanaryPolicy
"""The name the gateway's modules know the canary policy by."""


@dataclass(frozen=True, slots=True)
class ArmFigures:
    """One arm's window in figures."""

    calls: int
    error_rate: float
    p99_s: float
    decline_rate: float
    timed: int = 0
    """Calls with a model-call duration (first-stage approvals have none): the p99's base."""


class _Window:
    """A sliding window of one arm's calls: (time, ok, latency or None, declined)."""

    __slots__ = ("calls",)

    def __init__(self, size: int) -> None:
        self.calls: deque[tuple[float, bool, float | None, bool]] = deque(maxlen=size)

    def figures(self, since: float) -> ArmFigures:
        while self.calls and self.calls[0][0] < since:
            self.calls.popleft()
        n = len(self.calls)
        if n == 0:
            return ArmFigures(0, 0.0, 0.0, 0.0)
        ok = [c for c in self.calls if c[1]]
        latencies = [c[2] for c in self.calls if c[2] is not None]
        declines = sum(1 for c in ok if c[3])
        return ArmFigures(
            calls=n,
            error_rate=1 - len(ok) / n,
            p99_s=metrics.percentile(latencies, 99, empty=0.0),
            decline_rate=declines / len(ok) if ok else 0.0,
            timed=len(latencies),
        )


class CanaryWatch:
    """Compares one canary version with live over a sliding window of model calls."""

    def __init__(
        self,
        version: str,
        limits: CanaryPolicy,
        cap_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.version = version
        self.limits = limits
        self._cap_s = math.inf if cap_s is None else cap_s
        self._clock = clock
        self._windows = {arm: _Window(limits.window_calls) for arm in Arm}

    def record(self, arm: Arm, ok: bool, latency_s: float | None, declined: bool) -> None:
        """One model call of ``arm``: succeeded or not, its duration, declined or not; a
        ``latency_s`` of None is a first-stage approval (no model call to time)."""
        # Slower than the canary's cut-off is a failure whichever arm it happens to.
        ok = ok and (latency_s is None or latency_s <= self._cap_s)
        self._windows[arm].calls.append((self._clock(), ok, latency_s, declined))

    def figures(self) -> dict[Arm, ArmFigures]:
        """Both arms' current figures."""
        since = self._clock() - self.limits.window_s
        return {arm: window.figures(since) for arm, window in self._windows.items()}

    def breach(self) -> str | None:
        """Why the canary must be rolled back, or None while it behaves (or is not judged)."""
        figures = self.figures()
        live, canary = figures[Arm.LIVE], figures[Arm.CANARY]
        lim = self.limits
        if min(live.calls, canary.calls) < lim.min_calls:
            return None
        reasons = []
        if self._exceeds(
            canary.error_rate, live.error_rate, lim.max_error_rate_increase, canary, live
        ):
            reasons.append(
                f"error rate {canary.error_rate:.1%} vs live {live.error_rate:.1%} "
                f"(limit +{lim.max_error_rate_increase:.0%})"
            )
        if self._exceeds(
            canary.decline_rate, live.decline_rate, lim.max_decline_rate_increase, canary, live
        ):
            reasons.append(
                f"decline rate {canary.decline_rate:.1%} vs live {live.decline_rate:.1%} "
                f"(limit +{lim.max_decline_rate_increase:.0%})"
            )
        p99_limit = lim.p99_bound_ms(live.p99_s * 1e3) / 1e3
        if min(live.timed, canary.timed) >= lim.p99_min_calls and canary.p99_s > p99_limit:
            reasons.append(
                f"model p99 {canary.p99_s * 1e3:.1f} ms vs live {live.p99_s * 1e3:.1f} ms "
                f"(limit {p99_limit * 1e3:.1f} ms)"
            )
        if not reasons:
            return None
        return f"canary v{self.version} over {canary.calls} calls: " + "; ".join(reasons)

    def _exceeds(
        self,
        canary_rate: float,
        live_rate: float,
        limit: float,
        canary: ArmFigures,
        live: ArmFigures,
    ) -> bool:
        """Whether the canary's rate exceeds live's by more than ``limit``, beyond noise."""
        excess = canary_rate - live_rate - limit
        if excess <= 0:
            return False
        # Standard error of the difference of two proportions, pooled.
        n_c, n_l = max(canary.calls, 1), max(live.calls, 1)
        pooled = (canary_rate * n_c + live_rate * n_l) / (n_c + n_l)
        se = math.sqrt(max(pooled * (1 - pooled), 0.0) * (1 / n_c + 1 / n_l))
        return excess > self.limits.confidence_z * se
