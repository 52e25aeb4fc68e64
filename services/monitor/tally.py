"""Counts the monitor keeps per model version, arm and time slice: decisions by decision, the
score on a fine grid and in its reference's bins, each feature in its reference's bins,
missing values, feature sources, the rules' share and the gateway's latency.

The score's reference bins count only the answers a model version's own path gave: the full
model's, and the small model's first-stage approvals when the cascade is on. The rules' and
the small model's fallback answers are degraded answers of another engine; they are counted
(``rules``, ``engines``) but kept out of the score's distribution. A window with first-stage
answers is judged against the reference's cascade distribution (``answered_bins``), one
without against the full model's (``score_bins``).

A ``Tally`` is fixed-size (its shape comes from the version's reference), so the monitor's
state grows with versions × arms × slices, never with decisions. Tallies add up: a window is
the sum of its slices. Pure numpy; nothing here knows the event log or the transport.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.domain import metrics
from services.models.reference import ModelReference, category_codes

DECISIONS: tuple[str, ...] = ("approve", "review", "decline")
"""Decisions in the order their counts are kept."""
SOURCES: tuple[str, ...] = ("online", "partial", "default")
"""Feature sources in the order their counts are kept."""
ARMS: tuple[str, ...] = ("live", "canary", "shadow")
"""Who scored: the live version, a canary taking a share of cards, or a shadow scoring
every answered payment after the answer."""

ENGINES: tuple[str, ...] = ("model", "first_stage", "small_model", "rules")
"""Who answered (``scored_by``), in the order ``Tally.engines`` counts them."""
MODEL, FIRST_STAGE, SMALL_MODEL, RULES = range(len(ENGINES))

GRID_LOGIT = np.linspace(-16.0, 16.0, 257)
"""Cut points of the fine score grid, in log-odds: 0.125 apart, from 1e-7 to 1 − 1e-7."""
GRID_EDGES = 1.0 / (1.0 + np.exp(-GRID_LOGIT))
"""The grid's cut points as scores; a score lands in the first bin whose edge is ≥ it."""
GRID_BINS = len(GRID_EDGES) + 1
LATENCY_EDGES_MS = (1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 42.0, 50.0, 100.0, 250.0)
"""Upper bounds (ms) of the gateway-latency bins; one more bin above the last."""


def grid_bins(scores: np.ndarray) -> np.ndarray:
    """The fine-grid bin of each score."""
    return np.searchsorted(GRID_EDGES, scores, "left")


def grid_centres() -> np.ndarray:
    """A representative score of each grid bin (its upper edge; 1 for the top bin)."""
    return np.r_[GRID_EDGES, 1.0]


@dataclass
class Tally:
    """The counts of one version and arm over one slice of time (or a window of slices)."""

    decisions: int = 0
    by_decision: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    rules: int = 0
    """Answers the rules fallback gave (the model failed or was too slow)."""
    by_source: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    score_grid: np.ndarray = field(default_factory=lambda: np.zeros(GRID_BINS, np.int64))
    score_bins: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Scores of the full model's and the first stage's answers in the reference's bins
    (empty without a reference)."""
    answered_bins: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """The same scores in the bins of the reference's cascade distribution (empty when the
    reference has none)."""
    engines: np.ndarray = field(default_factory=lambda: np.zeros(len(ENGINES), np.int64))
    """Answers by engine (``ENGINES``)."""
    feature_bins: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Every feature's reference bins, one after another (``Layout.offsets``)."""
    missing: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Missing values per feature (the features in the reference's order)."""
    with_features: int = 0
    """Decisions whose features were counted (known order, a vector present)."""
    latency: np.ndarray = field(
        default_factory=lambda: np.zeros(len(LATENCY_EDGES_MS) + 1, np.int64)
    )
    agreement: np.ndarray = field(default_factory=lambda: np.zeros((3, 3), np.int64))
    """Shadow only: answered decision (rows) × the shadow's decision (columns)."""
    failed: int = 0
    """Canary only: cards routed to this version that it could not answer (live or the
    rules answered them, and counted them as their own decisions)."""
    timed_out: int = 0
    """Of ``failed``, those it ran out of time on."""

    def add(self, other: Tally) -> None:
        """Adds ``other``'s counts (same layout; a layout that differs adds no bins)."""
        self.decisions += other.decisions
        self.by_decision += other.by_decision
        self.rules += other.rules
        self.by_source += other.by_source
        self.score_grid += other.score_grid
        self.latency += other.latency
        self.agreement += other.agreement
        self.with_features += other.with_features
        self.failed += other.failed
        self.timed_out += other.timed_out
        self.engines += other.engines
        for name in ("score_bins", "answered_bins", "feature_bins", "missing"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if len(mine) == 0 and len(theirs):
                setattr(self, name, theirs.copy())
            elif len(mine) == len(theirs):
                mine += theirs

    def copy(self) -> Tally:
        """An independent copy."""
        out = Tally()
        out.add(self)
        return out

    # -- storage ---------------------------------------------------------------------------

    _ARRAYS = (
        "by_decision",
        "by_source",
        "score_grid",
        "score_bins",
        "feature_bins",
        "missing",
        "latency",
        "agreement",
        "answered_bins",
        "engines",
    )
    _BEFORE_CASCADE = 8
    """Arrays in tallies written before ``answered_bins`` and ``engines`` existed."""

    def encode(self) -> bytes:
        """Compact bytes: the scalars, each array's length, then every value (int64)."""
        arrays = [np.asarray(getattr(self, n), np.int64).ravel() for n in self._ARRAYS]
        head = np.array(
            [
                self.decisions,
                self.rules,
                self.with_features,
                self.failed,
                self.timed_out,
                *(len(a) for a in arrays),
            ],
            np.int64,
        )
        return np.concatenate([head, *arrays]).astype("<i8").tobytes()

    @classmethod
    def decode(cls, data: bytes) -> Tally:
        """The tally ``encode`` gave."""
        values = np.frombuffer(data, dtype="<i8").astype(np.int64)
        n = len(cls._ARRAYS)
        if 5 + n > len(values) or 5 + n + int(values[5 : 5 + n].sum()) != len(values):
            # A checkpoint of an older build: its arrays are a prefix of ours.
            n = cls._BEFORE_CASCADE
        out = cls(
            decisions=int(values[0]),
            rules=int(values[1]),
            with_features=int(values[2]),
            failed=int(values[3]),
            timed_out=int(values[4]),
        )
        lengths = values[5 : 5 + n]
        at = 5 + n
        for name, length in zip(cls._ARRAYS[:n], lengths, strict=True):
            array = values[at : at + int(length)].copy()
            at += int(length)
            setattr(out, name, array.reshape(3, 3) if name == "agreement" else array)
        return out


@dataclass(frozen=True)
class Layout:
    """How one version's reference bins its score and features."""

    reference: ModelReference | None
    features: tuple[str, ...] = ()
    """The reference's features, in order."""
    offsets: tuple[int, ...] = (0,)
    """Where each feature's bins start in ``Tally.feature_bins`` (and the end)."""

    @classmethod
    def of(cls, reference: ModelReference | None) -> Layout:
        """The layout of a version with this reference (None: counts without bins)."""
        if reference is None:
            return cls(None)
        names = tuple(reference.features)
        sizes = [len(reference.features[n].proportions) for n in names]
        return cls(reference, names, tuple(int(x) for x in np.r_[0, np.cumsum(sizes)]))

    def empty(self) -> Tally:
        """A tally of this layout with nothing counted."""
        tally = Tally()
        if self.reference is not None:
            tally.score_bins = np.zeros(len(self.reference.score.proportions), np.int64)
            if self.reference.answered is not None:
                tally.answered_bins = np.zeros(len(self.reference.answered.proportions), np.int64)
            tally.feature_bins = np.zeros(self.offsets[-1], np.int64)
            tally.missing = np.zeros(len(self.features), np.int64)
        return tally

    def fits(self, tally: Tally) -> bool:
        """True when ``tally`` has this layout's bins."""
        if self.reference is None:
            return True
        answered = self.reference.answered
        return (
            len(tally.score_bins) == len(self.reference.score.proportions)
            and len(tally.answered_bins) == (len(answered.proportions) if answered else 0)
            and len(tally.feature_bins) == self.offsets[-1]
        )


@dataclass(frozen=True)
class Scored:
    """A batch of one version's answers (or shadow scores) in one slice, column-wise."""

    scores: np.ndarray
    decisions: np.ndarray
    """Index into ``DECISIONS``."""
    rules: np.ndarray
    """True where the rules answered."""
    sources: np.ndarray
    """Index into ``SOURCES``."""
    latency_ms: np.ndarray
    features: np.ndarray | None = None
    """Rows × the reference's features (NaN where missing), or None."""
    answered: np.ndarray | None = None
    """Shadow only: the decision answered (index into ``DECISIONS``)."""
    engines: np.ndarray | None = None
    """Who answered (index into ``ENGINES``); None: the full model (or the rules where
    ``rules``)."""

    def engine(self) -> np.ndarray:
        """Who answered each row."""
        if self.engines is not None:
            return self.engines
        return np.where(self.rules, RULES, MODEL)


def count(layout: Layout, batch: Scored, into: Tally) -> None:
    """Adds a batch's counts to ``into`` (of ``layout``)."""
    n = len(batch.scores)
    if n == 0:
        return
    into.decisions += n
    into.by_decision += np.bincount(batch.decisions, minlength=3)[:3]
    into.rules += int(batch.rules.sum())
    into.by_source += np.bincount(batch.sources, minlength=3)[:3]
    engines = batch.engine()
    into.engines += np.bincount(engines, minlength=len(ENGINES))[: len(ENGINES)]
    into.score_grid += np.bincount(grid_bins(batch.scores), minlength=GRID_BINS)
    edges = np.asarray(LATENCY_EDGES_MS)
    into.latency += np.bincount(
        np.searchsorted(edges, batch.latency_ms, "left"), minlength=len(edges) + 1
    )
    if batch.answered is not None:
        np.add.at(into.agreement, (batch.answered, batch.decisions), 1)
    reference = layout.reference
    if reference is None:
        return
    scored = batch.scores[(engines == MODEL) | (engines == FIRST_STAGE)]
    into.score_bins += reference.score.counts(scored)
    if reference.answered is not None:
        into.answered_bins += reference.answered.counts(scored)
    if batch.features is None:
        return
    into.with_features += len(batch.features)
    x = batch.features
    for j, name in enumerate(layout.features):
        ref = reference.features[name]
        column = x[:, j]
        missing = np.isnan(column)
        into.missing[j] += int(missing.sum())
        if isinstance(ref, metrics.NumericReference):
            bins = ref.counts(column)
        else:
            codes, counts = np.unique(column[~missing], return_counts=True)
            names = category_codes(codes)
            bins = ref.counts_of(
                {str(c): int(k) for c, k in zip(names, counts, strict=True)}, int(missing.sum())
            )
        into.feature_bins[layout.offsets[j] : layout.offsets[j + 1]] += bins


def merged(tallies: Iterable[Tally]) -> Tally:
    """The sum of ``tallies``."""
    out = Tally()
    for tally in tallies:
        out.add(tally)
    return out


@dataclass(frozen=True)
class Drift:
    """A window's distances from its version's reference."""

    decisions: int
    score_psi: float
    feature_psi: dict[str, float]
    missing_ratio: dict[str, float]
    reference_missing: dict[str, float]
    score_against: str = "model"
    """The reference distribution the score was compared with: ``model`` (the full model's
    scores) or ``cascade`` (as the version answers with its cascade)."""
    scored: int = 0
    """Answers in the score's distribution (the full model's and the first stage's)."""


def through_cascade(tally: Tally) -> bool:
    """True when the window's answers came through a cascade (any first-stage answer)."""
    return bool(tally.engines[FIRST_STAGE] > 0)


def score_psi(layout: Layout, tally: Tally, min_decisions: int) -> tuple[float, str, int]:
    """The score's PSI against the matching reference distribution, which one, and how many
    answers it covers (NaN below ``min_decisions`` of them)."""
    reference = layout.reference
    assert reference is not None
    cascade = through_cascade(tally) and reference.answered is not None
    bins = tally.answered_bins if cascade else tally.score_bins
    scored = int(bins.sum())
    against = reference.score_reference(cascade)
    psi = metrics.psi(against.proportions, bins) if scored >= min_decisions else math.nan
    return psi, "cascade" if cascade else "model", scored


def drift(layout: Layout, tally: Tally, min_decisions: int) -> Drift:
    """PSI of the score and of every feature against the reference (NaN below
    ``min_decisions``: a handful of payments says nothing), and each feature's missing share."""
    reference = layout.reference
    if reference is None or not layout.fits(tally):
        return Drift(tally.decisions, math.nan, {}, {}, {})
    score, against, scored = score_psi(layout, tally, min_decisions)
    features: dict[str, float] = {}
    missing: dict[str, float] = {}
    enough_features = tally.with_features >= min_decisions
    for j, name in enumerate(layout.features):
        bins = tally.feature_bins[layout.offsets[j] : layout.offsets[j + 1]]
        proportions = reference.features[name].proportions
        features[name] = metrics.psi(proportions, bins) if enough_features else math.nan
        missing[name] = tally.missing[j] / tally.with_features if tally.with_features else math.nan
    reference_missing = {name: reference.missing_share(name) for name in layout.features}
    return Drift(tally.decisions, score, features, missing, reference_missing, against, scored)


def decision_ratios(tally: Tally) -> dict[str, float]:
    """Shares of each decision (NaN without decisions)."""
    if tally.decisions == 0:
        return dict.fromkeys(DECISIONS, math.nan)
    return {d: float(tally.by_decision[i] / tally.decisions) for i, d in enumerate(DECISIONS)}


def latency_quantile(tally: Tally, q: float) -> float:
    """The latency bin's upper bound (ms) under which a ``q`` share of answers fall
    (infinity beyond the last bound; NaN without answers)."""
    total = int(tally.latency.sum())
    if total == 0:
        return math.nan
    rank = math.ceil(q * total)
    index = int(np.searchsorted(np.cumsum(tally.latency), rank, "left"))
    return LATENCY_EDGES_MS[index] if index < len(LATENCY_EDGES_MS) else math.inf


def grid_psi(reference: Tally, live: Tally, bins: int = metrics.PSI_BINS) -> float:
    """PSI between two tallies' scores (arm against arm), on the quantile bins of
    ``reference``'s scores merged from the fine grid; NaN when a side is empty."""
    ref, cur = reference.score_grid, live.score_grid
    if ref.sum() == 0 or cur.sum() == 0:
        return math.nan
    cumulative = np.cumsum(ref) / ref.sum()
    cuts = sorted({int(np.searchsorted(cumulative, i / bins, "left")) for i in range(1, bins)})
    groups = np.searchsorted(np.asarray(cuts), np.arange(len(ref)), "left")
    return metrics.psi(
        np.bincount(groups, ref, minlength=len(cuts) + 1),
        np.bincount(groups, cur, minlength=len(cuts) + 1),
    )


def feature_names_of(
    names: Sequence[str], known: Mapping[str, tuple[str, ...]], schema: str
) -> tuple[str, ...] | None:
    """The feature order of an event: its names, else the order its schema id names."""
    if names:
        return tuple(names)
    return known.get(schema)
