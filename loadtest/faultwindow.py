"""Judging a fault against its own baseline: the calls that were late or failed while the fault
lasted, compared with the share of such calls in the same run before it.

A loaded machine misses a deadline now and then whatever the mesh does, so an absolute count
of late calls either flakes or allows so much that a broken fallback passes. Comparing the
fault's window with the same run's baseline window cancels the machine: a fault may cost at
most the baseline's share of late or failed calls plus ``max(SLACK_CALLS, SLACK_SHARE)`` of the
window's calls. A fallback that answers late (past the 42 ms budget) makes every call it answers
late, far past that bound.

The slack in calls is one pause of the machine: a 2-core machine running the whole mesh stops
serving now and then, and every call in flight then is late at once. Measured: five calls sent
within 80 ms, one model answer each, all late together, 1.7 s after a rollback with nothing
else happening; and in the timing lane of fresh-clone CI runs, with nothing else running, one
stall of 140 ms (10 calls late at 60 calls/s, 0.5 s after a canary's rollback, 0 late of 180
in its baseline) and one of 190 ms (12 calls late, 1.3 s after the feature service's kill,
0 late of 146 before it). Neither repeated in eight local runs of the same rows. A short window
(a rollback's two seconds, 120 calls) would otherwise fail on one such pause its baseline of a
few seconds did not happen to hold; a window of 1,500 calls or more is bounded by the share. A
fallback that answers late is still far past the bound: it makes every call of the window late.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

BUDGET_MS = 42.0
"""The end-to-end budget a call must be answered within, as the client measures it."""
SLACK_CALLS = 15
"""Late or failed calls a fault window may have beyond the baseline's share, at least: the calls
one pause of 250 ms makes late at the 60 calls/s most timing tests run at."""
SLACK_SHARE = 0.01
"""Share of a fault window's calls that may be late or failed beyond the baseline's share."""

T = TypeVar("T")


def late_or_failed(ok: bool, latency_ms: float, budget_ms: float = BUDGET_MS) -> bool:
    """A call that did not end OK (DEADLINE_EXCEEDED included) or ended OK past the budget."""
    return not ok or latency_ms > budget_ms


@dataclass(frozen=True)
class Tally:
    """Calls in one window and how many of them were late or failed."""

    calls: int
    bad: int

    @property
    def share(self) -> float:
        """Share of the window's calls that were late or failed (0 for an empty window)."""
        return self.bad / self.calls if self.calls else 0.0

    def __str__(self) -> str:
        return f"{self.bad}/{self.calls}"


def tally(calls: Iterable[T], bad: Callable[[T], bool]) -> Tally:
    """Counts ``calls`` and those ``bad`` says were late or failed."""
    total = flagged = 0
    for call in calls:
        total += 1
        flagged += bool(bad(call))
    return Tally(total, flagged)


def allowed(
    baseline: Tally,
    calls: int,
    slack_calls: int = SLACK_CALLS,
    slack_share: float = SLACK_SHARE,
) -> int:
    """The most late or failed calls a fault window of ``calls`` may have: the baseline's share
    of them plus ``max(slack_calls, slack_share × calls)``."""
    return math.floor(baseline.share * calls + max(slack_calls, slack_share * calls))


@dataclass(frozen=True)
class Verdict:
    """A fault window judged against its baseline."""

    baseline: Tally
    fault: Tally
    allowed: int
    """The most late or failed calls the fault window may have."""

    @property
    def ok(self) -> bool:
        """True when the fault window had calls and at most ``allowed`` of them were bad."""
        return self.fault.calls > 0 and self.fault.bad <= self.allowed

    def __str__(self) -> str:
        return (
            f"{self.fault} late or failed while faulted (at most {self.allowed} allowed), "
            f"{self.baseline} in the baseline"
        )


def judge(baseline: Tally, fault: Tally) -> Verdict:
    """The fault window against the baseline, with the default slack."""
    return Verdict(baseline, fault, allowed(baseline, fault.calls))
