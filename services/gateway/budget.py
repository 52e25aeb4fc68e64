"""The per-request time budget: how long each step may take so the answer is on time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """How a request's budget is split (all in seconds)."""

    default_s: float = 0.042
    """Budget when the client sets no shorter deadline."""
    reserve_s: float = 0.004
    """Kept back for the rules fallback and for writing the answer."""
    features_cap_s: float = 0.012
    """Longest the feature call may take, whatever else is left."""
    scorer_cap_s: float = 0.020
    """Longest the model call may take: a model answer later than this is worth less than
    the rules answering at once (normal model calls take 1-3 ms)."""
    scorer_min_s: float = 0.002
    """Below this much time the model is not tried: the rules answer instead."""
    scorer_suspect_cap_s: float = 0.008
    """Longest the model call may take while the scorer is suspect (its last call timed out
    and none has answered since) and the version's small model can answer instead. A stopped
    or stalled scorer otherwise costs every call its whole slice until the breaker has judged
    enough calls to open, which takes seconds when the cascade leaves the scorer a few calls a
    second; the first answer ends the suspicion."""
    explain_cap_s: float = 0.005
    """Longest a model answer waits for its model's reasons (about 1 ms of work); without
    them in time it goes with the threshold-written ones."""
    explain_min_s: float = 0.001
    """Below this much time left the model's reasons are not tried."""


class Budget:
    """A deadline on an injectable monotonic clock, split by a BudgetPolicy."""

    __slots__ = ("_clock", "deadline", "policy", "started", "total_s")

    def __init__(
        self,
        policy: BudgetPolicy,
        client_remaining_s: float | None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self.started = clock()
        total = policy.default_s
        if client_remaining_s is not None and client_remaining_s < total:
            total = max(client_remaining_s, 0.0)
        self.total_s = total
        self.deadline = self.started + total

    def remaining(self) -> float:
        """Seconds left before the deadline (negative once past it)."""
        return self.deadline - self._clock()

    def elapsed(self) -> float:
        """Seconds since the budget started."""
        return self._clock() - self.started

    def features_timeout(self) -> float:
        """Timeout for the feature call; <= 0 means skip it and use defaults."""
        return min(self.policy.features_cap_s, self.remaining() - self.policy.reserve_s)

    def scorer_timeout(self, suspect: bool = False) -> float:
        """Timeout for the model call; 0 means too little is left, so use the rules.
        ``suspect`` caps it at the policy's ``scorer_suspect_cap_s``."""
        cap = self.policy.scorer_suspect_cap_s if suspect else self.policy.scorer_cap_s
        left = min(cap, self.remaining() - self.policy.reserve_s)
        return left if left >= self.policy.scorer_min_s else 0.0

    def explain_timeout(self) -> float:
        """Longest the model's reasons may take; 0 means too little is left to try."""
        left = min(self.policy.explain_cap_s, self.remaining() - self.policy.reserve_s)
        return left if left >= self.policy.explain_min_s else 0.0
