"""An analyst's verdict on a decided payment: what it may say, where it goes, and the recent
ones the decision log has not caught up with yet."""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.domain.validation import id_problem, shown


class Verdict(enum.StrEnum):
    """What the analyst found the payment to be."""

    FRAUD = "fraud"
    LEGITIMATE = "legitimate"


class VerdictRejected(Exception):
    """The verdict is not valid (the message names the field); nothing was reported."""


class ReportFailed(Exception):
    """The mesh did not take the verdict (the message says why and whether to retry)."""


def parse_verdict(transaction_id: str, verdict: str) -> tuple[str, Verdict]:
    """The transaction and verdict of a submitted form; raises VerdictRejected."""
    problem = id_problem(transaction_id)
    if problem is not None:
        raise VerdictRejected(f"transaction_id {problem}")
    try:
        return transaction_id, Verdict(verdict)
    except ValueError:
        names = " or ".join(v.value for v in Verdict)
        raise VerdictRejected(f"verdict {shown(verdict)} is not {names}") from None


class OutcomeReporter(Protocol):
    """Reports a verdict as an outcome of source ANALYST to the mesh."""

    async def report(
        self, transaction_id: str, verdict: Verdict, reported_by: str, token: str | None
    ) -> str:
        """Returns the outcome's event id; raises ReportFailed or VerdictRejected."""
        ...

    async def close(self) -> None:
        """Releases the connection."""
        ...


@dataclass(frozen=True)
class Given:
    """A verdict the mesh accepted."""

    transaction_id: str
    verdict: Verdict
    reported_by: str
    event_id: str
    at_s: float


class RecentVerdicts:
    """Verdicts accepted by this console in the last ``keep_s`` seconds (at most ``capacity``),
    so that a judged payment leaves the queue at once rather than when its outcome reaches the
    decision log (within the sink's flush interval, seconds later)."""

    def __init__(
        self, keep_s: float = 600.0, capacity: int = 10_000, clock: Callable[[], float] = time.time
    ) -> None:
        self.keep_s = keep_s
        self.capacity = capacity
        self._clock = clock
        self._given: collections.OrderedDict[str, Given] = collections.OrderedDict()

    def add(self, given: Given) -> None:
        """Remembers ``given``, forgetting the oldest beyond the capacity."""
        self._given.pop(given.transaction_id, None)
        self._given[given.transaction_id] = given
        while len(self._given) > self.capacity:
            self._given.popitem(last=False)

    def _expire(self) -> None:
        horizon = self._clock() - self.keep_s
        while self._given:
            first = next(iter(self._given.values()))
            if first.at_s >= horizon:
                break
            self._given.popitem(last=False)

    def get(self, transaction_id: str) -> Given | None:
        """The recent verdict on ``transaction_id``, if any."""
        self._expire()
        return self._given.get(transaction_id)

    def transaction_ids(self) -> frozenset[str]:
        """Transactions judged recently."""
        self._expire()
        return frozenset(self._given)
