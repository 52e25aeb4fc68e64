"""The field's metrics, each defined once: ranking quality, operating points, card precision
at k per day, nearest-rank percentiles, distribution distances and confidence intervals.

Pure numpy (no scikit-learn, scipy or pandas), so serving code, the monitor, training, the
gates and the benchmarks share one definition. Conventions:

- ``labels`` are 0/1 (or booleans), 1 = fraud; ``scores`` are finite floats, higher = more
  suspicious; a threshold flags ``score >= threshold`` (the gateway's rule).
- Empty input to a ranking metric or an operating point is a caller's error: ``ValueError``.
  A ranking metric that its input cannot define (average precision without a fraud, ROC-AUC
  with one class only) is NaN.
- A percentile of no values, and a distance with an empty side, is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
"""What the functions take: arrays, lists, pandas columns."""

PSI_EPSILON = 1e-4
"""A bin's share is floored at this in PSI and the reference, so an empty bin counts as
rare, not impossible (the logarithm stays finite)."""
PSI_BINS = 10
"""Quantile bins of a numeric reference (deciles, the field's usual choice)."""
PSI_CATEGORIES = 20
"""Most frequent categories a categorical reference keeps; the rest share one bin."""


def _labels_scores(labels: ArrayLike, scores: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Checked labels (bool) and scores (float64) of equal, non-zero length."""
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.ndim != 1:
        raise ValueError("labels and scores must be one-dimensional")
    if len(y) != len(s):
        raise ValueError(f"{len(y)} labels but {len(s)} scores")
    if len(y) == 0:
        raise ValueError("no rows to judge")
    if y.dtype != np.bool_:
        if not np.isin(y, (0, 1)).all():
            raise ValueError("labels must be 0 or 1")
        y = y.astype(bool)
    if np.isnan(s).any():
        raise ValueError("scores hold NaN")
    return y, s


def _binary_curve(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct thresholds (descending) and the true and false positives flagged at each;
    tied scores form one threshold."""
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last_of_each = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tps = np.cumsum(y)[last_of_each].astype(np.float64)
    fps = (last_of_each + 1) - tps
    return s[last_of_each], tps, fps


def average_precision(labels: ArrayLike, scores: ArrayLike) -> float:
    """Average precision (area under the step precision-recall curve), as scikit-learn's
    ``average_precision_score``; NaN without a fraud (scikit-learn says 0 and warns)."""
    y, s = _labels_scores(labels, scores)
    positives = int(y.sum())
    if positives == 0:
        return math.nan
    _, tps, fps = _binary_curve(y, s)
    precision = tps / (tps + fps)
    recall = tps / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def precision_recall_curve(
    labels: ArrayLike, scores: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall and thresholds as scikit-learn's ``precision_recall_curve`` gives
    them: thresholds ascending, then the point (recall 0, precision 1) appended."""
    y, s = _labels_scores(labels, scores)
    thresholds, tps, fps = _binary_curve(y, s)
    precision = tps / (tps + fps)
    recall = tps / tps[-1] if tps[-1] > 0 else np.ones_like(tps)
    return np.r_[precision[::-1], 1.0], np.r_[recall[::-1], 0.0], thresholds[::-1]


def roc_auc(labels: ArrayLike, scores: ArrayLike) -> float:
    """Area under the ROC curve: the chance a fraud outscores a genuine payment, ties counted
    half (scikit-learn's ``roc_auc_score``); NaN with one class only (scikit-learn raises)."""
    y, s = _labels_scores(labels, scores)
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        return math.nan
    ranks = _midranks(s)
    u = float(ranks[y].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)


def _midranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``values``, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(values)] - 1
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = (first[group] + last[group]) / 2 + 1
    return ranks


def threshold_at_fpr(negative_scores: ArrayLike, fpr: float) -> float:
    """Lowest threshold flagging (score >= threshold) at most ``fpr`` of the negatives."""
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"a false-positive rate is within [0, 1], not {fpr}")
    ranked = np.sort(np.asarray(negative_scores, dtype=np.float64))[::-1]
    allowed = math.floor(fpr * len(ranked))
    if allowed >= len(ranked):
        return 0.0
    # Just above the first negative that must not be flagged.
    return float(np.nextafter(ranked[allowed], np.inf))


@dataclass(frozen=True)
class OperatingPoint:
    """What a threshold does: precision (0 when nothing is flagged), recall (0 without a
    fraud), false-positive rate (0 without a genuine payment) and how many rows it flags."""

    threshold: float
    precision: float
    recall: float
    fpr: float
    flagged: int


def operating_point(labels: ArrayLike, scores: ArrayLike, threshold: float) -> OperatingPoint:
    """Precision, recall and false-positive rate of flagging ``scores >= threshold``."""
    fraud, s = _labels_scores(labels, scores)
    flagged = s >= threshold
    caught = int((flagged & fraud).sum())
    return OperatingPoint(
        threshold=float(threshold),
        precision=caught / max(int(flagged.sum()), 1),
        recall=caught / max(int(fraud.sum()), 1),
        fpr=int((flagged & ~fraud).sum()) / max(int((~fraud).sum()), 1),
        flagged=int(flagged.sum()),
    )


def recall_at_fpr(labels: ArrayLike, scores: ArrayLike, fpr: float) -> float:
    """Recall at the lowest threshold that flags at most ``fpr`` of the genuine payments."""
    y, s = _labels_scores(labels, scores)
    return operating_point(y, s, threshold_at_fpr(s[~y], fpr)).recall


def decision_rates(scores: ArrayLike, review: float, decline: float) -> dict[str, float]:
    """Shares of ``approve``, ``review`` and ``decline`` under the thresholds (decline at or
    above ``decline``, review at or above ``review``); NaN shares for no scores."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return dict.fromkeys(("approve", "review", "decline"), math.nan)
    declined = s >= decline
    reviewed = (s >= review) & ~declined
    return {
        "approve": float(1.0 - (declined.mean() + reviewed.mean())),
        "review": float(reviewed.mean()),
        "decline": float(declined.mean()),
    }


def card_precision_per_day(
    days: ArrayLike,
    cards: ArrayLike,
    labels: ArrayLike,
    scores: ArrayLike,
    k: int,
    *,
    exclude_detected: bool = False,
    divide_by_k: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Card precision at ``k`` for each day: the share of fraudulent cards among the day's
    ``k`` highest-scored cards. Returns the days (ascending) and their figures.

    A card's score on a day is the highest of its payments that day, and it is fraudulent
    that day when one of them is. Ties keep the order in which the cards first appear.
    ``exclude_detected`` leaves out, each day, the cards an earlier day's top ``k`` caught
    as fraudulent (the Handbook's protocol: investigators already know them).
    The share is of the cards ranked (fewer than ``k`` on a quiet day), or of ``k`` itself
    with ``divide_by_k`` (the Handbook's form, where a quiet day cannot reach 1).
    """
    day_values, tops = daily_top_cards(
        days, cards, labels, scores, k, exclude_detected=exclude_detected
    )
    figures = np.empty(len(day_values), dtype=np.float64)
    for d, (_, fraud) in enumerate(tops):
        figures[d] = int(fraud.sum()) / (k if divide_by_k else len(fraud))
    return day_values, figures


def daily_top_cards(
    days: ArrayLike,
    cards: ArrayLike,
    labels: ArrayLike,
    scores: ArrayLike,
    k: int,
    *,
    exclude_detected: bool = False,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Each day's ``k`` highest-scored cards as ``card_precision_per_day`` ranks them: the
    days (ascending) and, per day, the cards (values of ``cards``, best first) and whether
    each is fraudulent that day."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    y, s = _labels_scores(labels, scores)
    day_arr, card_arr = np.asarray(days), np.asarray(cards)
    if len(day_arr) != len(y) or len(card_arr) != len(y):
        raise ValueError("days, cards, labels and scores must have one entry per row")
    day_values, day_of = np.unique(day_arr, return_inverse=True)
    card_values, card_of = np.unique(card_arr, return_inverse=True)
    key = day_of.astype(np.int64) * len(card_values) + card_of
    pairs, first_row, pair_of = np.unique(key, return_index=True, return_inverse=True)
    best = np.full(len(pairs), -np.inf)
    np.maximum.at(best, pair_of, s)
    fraud = np.zeros(len(pairs), dtype=bool)
    np.logical_or.at(fraud, pair_of, y)
    pair_day, pair_card = pairs // len(card_values), pairs % len(card_values)
    order = np.lexsort((first_row, -best, pair_day))
    bounds = np.searchsorted(pair_day[order], np.arange(len(day_values) + 1))
    detected = np.zeros(len(card_values), dtype=bool)
    tops: list[tuple[np.ndarray, np.ndarray]] = []
    for d in range(len(day_values)):
        ranked = order[bounds[d] : bounds[d + 1]]
        if exclude_detected:
            ranked = ranked[~detected[pair_card[ranked]]]
        top = ranked[:k]
        tops.append((card_values[pair_card[top]], fraud[top]))
        detected[pair_card[top[fraud[top]]]] = True
    return day_values, tops


def _rank(q: float, n: int) -> int:
    """The nearest rank (1..n) of the ``q``-th percentile of ``n`` values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"a percentile is within [0, 100], not {q}")
    # Exact arithmetic on the decimal the caller wrote: 99.9 % of 1000 is rank 999, not 1000.
    return max(1, math.ceil(Fraction(repr(float(q))) * n / 100))


def percentiles(
    values: ArrayLike, qs: Sequence[float], *, empty: float = math.nan
) -> tuple[float, ...]:
    """The nearest-rank ``q``-th percentiles (``q`` in 0..100) of ``values``: the smallest
    value with at least q % of the values at or below it, always an observed value (no
    interpolation). ``empty`` (NaN unless told) for no values."""
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        for q in qs:
            _rank(q, 1)
        return tuple(empty for _ in qs)
    if np.isnan(a).any():
        raise ValueError("values hold NaN")
    ranks = [_rank(q, a.size) for q in qs]
    part = np.partition(a, sorted({r - 1 for r in ranks}))
    return tuple(float(part[r - 1]) for r in ranks)


def percentile(values: ArrayLike, q: float, *, empty: float = math.nan) -> float:
    """The nearest-rank ``q``-th percentile (``q`` in 0..100); see ``percentiles``."""
    return percentiles(values, (q,), empty=empty)[0]


def _shares(counts: ArrayLike, what: str) -> np.ndarray | None:
    """Counts or proportions normalised to sum 1; None when they sum to 0."""
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or (c < 0).any() or not np.isfinite(c).all():
        raise ValueError(f"{what} must be finite, non-negative and one-dimensional")
    total = float(c.sum())
    return None if total <= 0 else c / total


def psi(reference: ArrayLike, live: ArrayLike, *, epsilon: float = PSI_EPSILON) -> float:
    """Population stability index between two distributions over the same bins, each given
    as counts or proportions: sum over bins of (live − ref) · ln(live / ref), each share
    floored at ``epsilon`` first (no renormalisation). NaN when either side is empty.

    The field's reading: below 0.1 stable, 0.1–0.2 a moderate shift, above 0.2 a major one.
    """
    ref, cur = _shares(reference, "reference"), _shares(live, "live")
    if ref is None or cur is None:
        return math.nan
    if len(ref) != len(cur):
        raise ValueError(f"{len(ref)} reference bins but {len(cur)} live bins")
    ref, cur = np.maximum(ref, epsilon), np.maximum(cur, epsilon)
    return float(np.sum((cur - ref) * np.log(cur / ref)))


def js_distance(p: ArrayLike, q: ArrayLike, *, base: float = 2.0) -> float:
    """Jensen–Shannon distance (the square root of the divergence) between two distributions
    over the same bins, given as counts or proportions; in [0, 1] with ``base`` 2. NaN when
    either side is empty."""
    a, b = _shares(p, "p"), _shares(q, "q")
    if a is None or b is None:
        return math.nan
    if len(a) != len(b):
        raise ValueError(f"{len(a)} bins against {len(b)}")
    m = (a + b) / 2

    def kl(x: np.ndarray) -> float:
        nz = x > 0
        return float(np.sum(x[nz] * np.log(x[nz] / m[nz])))

    divergence = (kl(a) + kl(b)) / 2 / math.log(base)
    return math.sqrt(max(divergence, 0.0))


def ks_statistic(a: ArrayLike, b: ArrayLike) -> float:
    """Two-sample Kolmogorov–Smirnov statistic: the largest gap between the two empirical
    distribution functions (scipy's ``ks_2samp(...).statistic``). NaN when a side is empty."""
    x = np.sort(np.asarray(a, dtype=np.float64).ravel())
    y = np.sort(np.asarray(b, dtype=np.float64).ravel())
    if x.size == 0 or y.size == 0:
        return math.nan
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("samples hold NaN")
    points = np.concatenate([x, y])
    gap = np.searchsorted(x, points, side="right") / x.size
    gap -= np.searchsorted(y, points, side="right") / y.size
    return float(np.max(np.abs(gap)))


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class NumericReference:
    """A numeric feature's (or the score's) reference distribution for PSI: quantile cut
    points and the share of the reference in each bin.

    Bins are right-closed: bin 0 holds values ≤ ``edges[0]``, bin i holds
    ``edges[i-1] < x ≤ edges[i]``, and one more bin holds values above the last edge (empty
    in the reference when the top quantile is its maximum: live values beyond the reference's
    range land there). A last bin holds missing values (NaN). ``proportions`` has
    ``len(edges) + 2`` entries and sums to 1.
    """

    edges: tuple[float, ...]
    proportions: tuple[float, ...]
    kind: Literal["numeric"] = "numeric"

    def __post_init__(self) -> None:
        if len(self.proportions) != len(self.edges) + 2:
            raise ValueError("a numeric reference has len(edges) + 2 proportions")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError("reference edges must increase strictly")

    @classmethod
    def fit(cls, values: ArrayLike, bins: int = PSI_BINS) -> NumericReference:
        """Cut points at the nearest-rank quantiles 1/bins … (bins−1)/bins of the non-missing
        values (ties merge bins, so a discrete feature gets fewer), and their shares (all 0
        for no values: PSI against it is then NaN)."""
        if bins < 1:
            raise ValueError(f"bins must be at least 1, not {bins}")
        v = np.asarray(values, dtype=np.float64).ravel()
        present = v[~np.isnan(v)]
        qs = [100.0 * i / bins for i in range(1, bins)]
        edges = tuple(sorted(set(percentiles(present, qs)))) if present.size else ()
        counts = cls(edges, (0.0,) * (len(edges) + 2)).counts(v)
        return cls(edges, tuple(float(c) / max(v.size, 1) for c in counts))

    def counts(self, values: ArrayLike) -> np.ndarray:
        """How many of ``values`` fall in each bin (the missing bin last)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        missing = np.isnan(v)
        index = np.searchsorted(np.asarray(self.edges, dtype=np.float64), v[~missing], "left")
        counts = np.bincount(index, minlength=len(self.edges) + 1)
        return np.r_[counts, int(missing.sum())].astype(np.int64)

    def psi(self, values: ArrayLike, *, epsilon: float = PSI_EPSILON) -> float:
        """PSI of ``values`` against this reference."""
        return psi(self.proportions, self.counts(values), epsilon=epsilon)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (a model version stores it)."""
        return {"kind": self.kind, "edges": list(self.edges), "proportions": list(self.proportions)}


@dataclass(frozen=True)
class CategoricalReference:
    """A categorical feature's reference distribution for PSI: the most frequent categories
    and their shares, one bin for every other category (unseen ones included), and a last
    bin for missing values (None, NaN). ``proportions`` has ``len(categories) + 2``
    entries and sums to 1."""

    categories: tuple[str, ...]
    proportions: tuple[float, ...]
    kind: Literal["categorical"] = "categorical"

    def __post_init__(self) -> None:
        if len(self.proportions) != len(self.categories) + 2:
            raise ValueError("a categorical reference has len(categories) + 2 proportions")

    @classmethod
    def fit(
        cls, values: Iterable[object], max_categories: int = PSI_CATEGORIES
    ) -> CategoricalReference:
        """The ``max_categories`` most frequent categories (ties by name) and the shares."""
        seen: dict[str, int] = {}
        total = 0
        for value in values:
            total += 1
            if not _is_missing(value):
                seen[str(value)] = seen.get(str(value), 0) + 1
        ranked = sorted(seen, key=lambda c: (-seen[c], c))[:max_categories]
        reference = cls(tuple(ranked), (0.0,) * (len(ranked) + 2))
        counts = reference.counts_of(seen, total - sum(seen.values()))
        return cls(tuple(ranked), tuple(float(c) / max(total, 1) for c in counts))

    def counts(self, values: Iterable[object]) -> np.ndarray:
        """How many of ``values`` fall in each bin (other, then missing, last)."""
        seen: dict[str, int] = {}
        missing = 0
        for value in values:
            if _is_missing(value):
                missing += 1
            else:
                seen[str(value)] = seen.get(str(value), 0) + 1
        return self.counts_of(seen, missing)

    def counts_of(self, frequencies: Mapping[str, int], missing: int = 0) -> np.ndarray:
        """Bin counts from category frequencies (what a monitor keeps) and missing values."""
        known = [int(frequencies.get(c, 0)) for c in self.categories]
        listed = set(self.categories)
        other = sum(int(n) for c, n in frequencies.items() if c not in listed)
        return np.asarray([*known, other, missing], dtype=np.int64)

    def psi(self, values: Iterable[object], *, epsilon: float = PSI_EPSILON) -> float:
        """PSI of ``values`` against this reference."""
        return psi(self.proportions, self.counts(values), epsilon=epsilon)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (a model version stores it)."""
        return {
            "kind": self.kind,
            "categories": list(self.categories),
            "proportions": list(self.proportions),
        }


Reference = NumericReference | CategoricalReference
"""A reference distribution of one feature or of the score."""


def reference_from_dict(data: Mapping[str, Any]) -> Reference:
    """A reference from its ``to_dict`` form."""
    kind = data.get("kind")
    proportions = tuple(float(p) for p in data["proportions"])
    if kind == "numeric":
        return NumericReference(tuple(float(e) for e in data["edges"]), proportions)
    if kind == "categorical":
        return CategoricalReference(tuple(str(c) for c in data["categories"]), proportions)
    raise ValueError(f"unknown reference kind {kind!r}")


@dataclass(frozen=True)
class Interval:
    """An estimate and its confidence interval."""

    estimate: float
    low: float
    high: float
    level: float


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is within (0, 1), not {level}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> Interval:
    """Wilson score interval of a proportion (precision: caught of flagged; recall: caught
    of frauds), sound near 0 and 1 and for small counts. No trials: NaN, within [0, 1]."""
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"{successes} successes of {trials} trials")
    z = _z(level)
    if trials == 0:
        return Interval(math.nan, 0.0, 1.0, level)
    p = successes / trials
    z2n = z * z / trials
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), level)


class Resampler:
    """Bootstrap resamples of row indices: rows with replacement, or whole groups with
    replacement (a card's payments stay together: its frauds are not independent)."""

    def __init__(self, rows: int | None = None, *, groups: ArrayLike | None = None, seed: int = 0):
        if (rows is None) == (groups is None):
            raise ValueError("give either a row count or the rows' groups")
        self._rng = np.random.default_rng(seed)
        self._order: np.ndarray | None = None
        self._starts: np.ndarray | None = None
        self._sizes: np.ndarray | None = None
        if groups is None:
            assert rows is not None
            self._rows = rows
            return
        _, first, of = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
        # Groups numbered in order of first appearance, so a seed draws the same resamples
        # whatever the group names sort to.
        code = np.argsort(np.argsort(first))[of.ravel()]
        self._order = np.argsort(code, kind="stable")
        self._starts = np.searchsorted(code[self._order], np.arange(len(first)))
        self._sizes = np.diff(np.append(self._starts, len(code)))
        self._rows = len(first)

    def draw(self) -> np.ndarray:
        """One resample's row indices."""
        drawn = self._rng.integers(0, self._rows, size=self._rows)
        if self._order is None or self._starts is None or self._sizes is None:
            return drawn
        sizes = self._sizes[drawn]
        ends = np.cumsum(sizes)
        offsets = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - sizes, sizes)
        return self._order[np.repeat(self._starts[drawn], sizes) + offsets]


def bootstrap_interval(
    metric: Callable[[np.ndarray, np.ndarray], float],
    labels: ArrayLike,
    scores: ArrayLike,
    *,
    groups: ArrayLike | None = None,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of ``metric(labels, scores)`` (average precision, ROC-AUC,
    a recall …), resampling rows or, with ``groups``, whole groups. Resamples on which the
    metric is NaN (one class drawn) are left out; nearest-rank percentiles of the rest."""
    y, s = _labels_scores(labels, scores)
    _z(level)
    sampler = (
        Resampler(len(y), seed=seed) if groups is None else Resampler(groups=groups, seed=seed)
    )
    values = []
    for _ in range(resamples):
        rows = sampler.draw()
        value = metric(y[rows], s[rows])
        if not math.isnan(value):
            values.append(value)
    tail = 100 * (1 - level) / 2
    low, high = percentiles(values, (tail, 100 - tail))
    return Interval(float(metric(y, s)), low, high, level)
