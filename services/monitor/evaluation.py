"""Live evaluation from reported outcomes: counts per model version and decision cohort, and
the figures they give.

A decision is labelled by retraining's rule (``pipelines/retraining.py``): its latest
outcome FRAUD → fraud, LEGITIMATE → genuine, DISPUTED → unlabelled; with no outcome it is
genuine once older than the label delay, unlabelled before. Decisions are grouped into
cohorts by the hour they were decided; a cohort whose every decision is older than the label
delay is *matured*, the others *immature*. Immature cohorts are labelled by their outcomes
alone (mostly frauds: their precision is not comparable), so the two are never summed.

Per cohort the monitor keeps, for every decision and for each kind of outcome, counts by
decision and on the fine score grid (``tally.GRID_BINS``): precision and recall at the
thresholds are exact; average precision is computed from the grid (within 0.01 of the exact
figure on simulated traffic, ``tests/unit/test_monitor.py``). Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from services.domain import metrics
from services.monitor.tally import DECISIONS, GRID_BINS

LABELS: tuple[str, ...] = ("fraud", "legitimate", "disputed")
"""Outcomes in the order their counts are kept (an unknown outcome counts as disputed)."""
HOUR_US = 3_600_000_000
THRESHOLDS: tuple[str, ...] = ("review", "decline")
"""Operating points judged: flagged at review (review or decline answered) and at decline."""


@dataclass
class Cohort:
    """One version's decisions of one hour, and the outcomes reported for them."""

    by_decision: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    grid: np.ndarray = field(default_factory=lambda: np.zeros(GRID_BINS, np.int64))
    outcome_decision: np.ndarray = field(default_factory=lambda: np.zeros((3, 3), np.int64))
    """Outcome label (rows, ``LABELS``) × decision answered (columns)."""
    outcome_grid: np.ndarray = field(default_factory=lambda: np.zeros((3, GRID_BINS), np.int64))
    """Outcome label × fine score bin."""

    @property
    def decisions(self) -> int:
        """Decisions in the cohort."""
        return int(self.by_decision.sum())

    def add(self, other: Cohort) -> None:
        """Adds ``other``'s counts."""
        self.by_decision += other.by_decision
        self.grid += other.grid
        self.outcome_decision += other.outcome_decision
        self.outcome_grid += other.outcome_grid

    def decided(self, decision: int, grid_bin: int) -> None:
        """Counts one decision."""
        self.by_decision[decision] += 1
        self.grid[grid_bin] += 1

    def labelled(self, label: int, decision: int, grid_bin: int, sign: int = 1) -> None:
        """Counts (or, with ``sign`` −1, uncounts) an outcome of one of its decisions."""
        self.outcome_decision[label, decision] += sign
        self.outcome_grid[label, grid_bin] += sign

    def encode(self) -> bytes:
        """Compact bytes (int64 values in a fixed order)."""
        return (
            np.concatenate(
                [
                    self.by_decision,
                    self.grid,
                    self.outcome_decision.ravel(),
                    self.outcome_grid.ravel(),
                ]
            )
            .astype("<i8")
            .tobytes()
        )

    @classmethod
    def decode(cls, data: bytes) -> Cohort:
        """The cohort ``encode`` gave."""
        v = np.frombuffer(data, dtype="<i8").astype(np.int64)
        g = GRID_BINS
        return cls(
            by_decision=v[0:3].copy(),
            grid=v[3 : 3 + g].copy(),
            outcome_decision=v[3 + g : 12 + g].reshape(3, 3).copy(),
            outcome_grid=v[12 + g : 12 + 4 * g].reshape(3, g).copy(),
        )


def matured(hour: int, now_us: int, label_delay_us: int) -> bool:
    """True when every decision of cohort ``hour`` (hours since the epoch) is older than the
    label delay at ``now_us``."""
    return (hour + 1) * HOUR_US + label_delay_us <= now_us


@dataclass(frozen=True)
class Figures:
    """Live quality of a set of cohorts under one labelling (matured or immature)."""

    decisions: int
    labelled: int
    frauds: int
    precision: dict[str, metrics.Interval]
    """By threshold: labelled frauds flagged / labelled flagged (Wilson interval)."""
    recall: dict[str, metrics.Interval]
    """By threshold: labelled frauds flagged / labelled frauds (Wilson interval)."""
    average_precision: float
    """On the fine score grid; NaN without a fraud."""

    @property
    def labelled_ratio(self) -> float:
        """Labelled share of the decisions (NaN without decisions)."""
        return self.labelled / self.decisions if self.decisions else math.nan


def figures(cohort: Cohort, is_matured: bool) -> Figures:
    """The figures of ``cohort`` (usually a sum of cohorts) labelled as matured or not."""
    fraud_i, legit_i, disputed_i = (LABELS.index(x) for x in LABELS)
    frauds_by_decision = cohort.outcome_decision[fraud_i]
    if is_matured:
        genuine_by_decision = (
            cohort.by_decision - frauds_by_decision - cohort.outcome_decision[disputed_i]
        )
        genuine_grid = cohort.grid - cohort.outcome_grid[fraud_i] - cohort.outcome_grid[disputed_i]
    else:
        genuine_by_decision = cohort.outcome_decision[legit_i]
        genuine_grid = cohort.outcome_grid[legit_i]
    frauds = int(frauds_by_decision.sum())
    labelled = frauds + int(genuine_by_decision.sum())
    precision, recall = {}, {}
    review, decline = DECISIONS.index("review"), DECISIONS.index("decline")
    for name, flagged_at in (("review", [review, decline]), ("decline", [decline])):
        caught = int(frauds_by_decision[flagged_at].sum())
        flagged = caught + int(genuine_by_decision[flagged_at].sum())
        precision[name] = metrics.wilson_interval(caught, flagged)
        recall[name] = metrics.wilson_interval(caught, frauds)
    return Figures(
        decisions=cohort.decisions,
        labelled=labelled,
        frauds=frauds,
        precision=precision,
        recall=recall,
        average_precision=grid_average_precision(cohort.outcome_grid[fraud_i], genuine_grid),
    )


def grid_average_precision(fraud_grid: np.ndarray, genuine_grid: np.ndarray) -> float:
    """Average precision of scores known only as counts per grid bin: the expected step-curve
    value (``metrics.average_precision``'s definition) when the payments inside a bin come in
    random order. NaN without a fraud."""
    frauds = fraud_grid[::-1].astype(np.float64)
    genuine = genuine_grid[::-1].astype(np.float64)
    positives = frauds.sum()
    if positives <= 0:
        return math.nan
    tp_before = np.cumsum(frauds) - frauds
    fp_before = np.cumsum(genuine) - genuine
    total = 0.0
    for i in np.flatnonzero(frauds):
        f, g = frauds[i], genuine[i]
        k = np.arange(1.0, f + 1.0)
        # The k-th fraud of the bin comes, on average, after k·(f+g)/f of its payments.
        total += float(np.sum((tp_before[i] + k) / (tp_before[i] + fp_before[i] + k * (f + g) / f)))
    return total / float(positives)


def summed(cohorts: Iterable[Cohort]) -> Cohort:
    """The sum of ``cohorts``."""
    out = Cohort()
    for cohort in cohorts:
        out.add(cohort)
    return out


def label_index(outcome: str) -> int:
    """The ``LABELS`` index of an outcome name (anything unknown counts as disputed)."""
    return LABELS.index(outcome) if outcome in LABELS else LABELS.index("disputed")
