"""The field's metrics against scikit-learn and scipy where they have them, and by definition
where they do not (card precision, nearest-rank percentiles, PSI)."""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon
from scipy.stats import binomtest, ks_2samp
from sklearn.metrics import (
    average_precision_score,
    precision_recall_curve,
    precision_score,
    recall_score,
    roc_auc_score,
    roc_curve,
)

from services.domain import metrics

SEEDS = [1, 2, 3, 4]


def _sample(seed: int, n: int = 600, decimals: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores; rounded scores make ties, which every metric must handle."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.int64)
    scores = np.round(rng.random(n) * 0.6 + y * 0.3, decimals)
    return y, scores


@pytest.mark.parametrize("seed", SEEDS)
def test_average_precision_is_scikit_learns(seed: int) -> None:
    y, scores = _sample(seed)
    assert metrics.average_precision(y, scores) == pytest.approx(
        average_precision_score(y, scores), abs=1e-12
    )
    assert metrics.average_precision(y.astype(bool), scores) == metrics.average_precision(y, scores)


def test_average_precision_edge_cases() -> None:
    # scikit-learn says 0 (with a warning) without a fraud; nothing is defined there: NaN.
    assert np.isnan(metrics.average_precision(np.zeros(5), np.ones(5)))
    assert metrics.average_precision(np.ones(4), [0.1, 0.2, 0.2, 0.9]) == 1.0
    # Every score tied: precision is the fraud share at the one threshold.
    assert metrics.average_precision([1, 0, 0, 0], [0.5] * 4) == pytest.approx(0.25)
    assert metrics.average_precision([1, 0, 0, 0], [0.5] * 4) == pytest.approx(
        average_precision_score([1, 0, 0, 0], [0.5] * 4)
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_roc_auc_is_scikit_learns(seed: int) -> None:
    y, scores = _sample(seed, decimals=1)
    assert metrics.roc_auc(y, scores) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)


def test_roc_auc_edge_cases() -> None:
    assert np.isnan(metrics.roc_auc([0, 0, 0], [0.1, 0.2, 0.3]))
    assert np.isnan(metrics.roc_auc([1, 1], [0.1, 0.2]))
    assert metrics.roc_auc([0, 1], [0.5, 0.5]) == 0.5
    assert metrics.roc_auc([0, 1], [0.2, 0.9]) == 1.0
    assert metrics.roc_auc([1, 0], [0.2, 0.9]) == 0.0


@pytest.mark.parametrize("seed", SEEDS)
def test_precision_recall_curve_is_scikit_learns(seed: int) -> None:
    y, scores = _sample(seed)
    ours = metrics.precision_recall_curve(y, scores)
    theirs = precision_recall_curve(y, scores)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_recall_at_fpr_is_the_roc_curves_best_recall_within_the_rate(seed: int) -> None:
    y, scores = _sample(seed, n=3000, decimals=3)
    for rate in (0.0, 0.01, 0.05, 0.2):
        fpr, tpr, _ = roc_curve(y, scores)
        assert metrics.recall_at_fpr(y, scores, rate) == pytest.approx(tpr[fpr <= rate].max())


def test_threshold_at_fpr_flags_at_most_the_rate_and_is_the_lowest_such() -> None:
    negatives = np.random.default_rng(5).random(1000)
    threshold = metrics.threshold_at_fpr(negatives, 0.01)
    assert (negatives >= threshold).sum() == 10
    below = np.nextafter(threshold, -np.inf)
    assert (negatives >= below).sum() > 10
    assert metrics.threshold_at_fpr(negatives, 1.0) == 0.0
    assert metrics.threshold_at_fpr([], 0.01) == 0.0
    with pytest.raises(ValueError, match="within"):
        metrics.threshold_at_fpr(negatives, 1.5)


@pytest.mark.parametrize("seed", SEEDS)
def test_operating_point_is_scikit_learns_precision_and_recall(seed: int) -> None:
    y, scores = _sample(seed)
    for threshold in (0.3, 0.5, 0.8):
        point = metrics.operating_point(y, scores, threshold)
        flagged = scores >= threshold
        assert point.precision == pytest.approx(precision_score(y, flagged))
        assert point.recall == pytest.approx(recall_score(y, flagged))
        assert point.fpr == pytest.approx(flagged[y == 0].mean())
        assert point.flagged == int(flagged.sum())


def test_operating_point_with_nothing_flagged_or_no_fraud() -> None:
    point = metrics.operating_point([1, 0], [0.1, 0.2], threshold=0.9)
    assert (point.precision, point.recall, point.fpr, point.flagged) == (0.0, 0.0, 0.0, 0)
    point = metrics.operating_point([0, 0], [0.1, 0.9], threshold=0.5)
    assert (point.precision, point.recall, point.fpr) == (0.0, 0.0, 0.5)


@pytest.mark.parametrize(
    ("labels", "scores", "message"),
    [
        ([], [], "no rows"),
        ([0, 1], [0.1], "2 labels but 1 scores"),
        ([0, 2], [0.1, 0.2], "0 or 1"),
        ([0, 1], [0.1, math.nan], "NaN"),
        ([[0, 1]], [[0.1, 0.2]], "one-dimensional"),
    ],
)
def test_bad_input_is_a_clear_value_error(labels: list, scores: list, message: str) -> None:
    for metric in (metrics.average_precision, metrics.roc_auc, metrics.precision_recall_curve):
        with pytest.raises(ValueError, match=message):
            metric(labels, scores)
    with pytest.raises(ValueError, match=message):
        metrics.operating_point(labels, scores, 0.5)


def test_decision_rates_follow_the_gateways_rule() -> None:
    scores = [0.1, 0.5, 0.7, 0.7, 0.95]
    rates = metrics.decision_rates(scores, review=0.5, decline=0.9)
    assert rates == pytest.approx({"approve": 0.2, "review": 0.6, "decline": 0.2})
    assert all(np.isnan(v) for v in metrics.decision_rates([], 0.5, 0.9).values())


def _card_precision_pandas(
    days: np.ndarray, cards: np.ndarray, y: np.ndarray, scores: np.ndarray, k: int
) -> pd.Series:
    """Card precision per day as pandas states it (groups in order of appearance, a stable
    sort by day then score): the reference the numpy definition must reproduce, ties too."""
    frame = pd.DataFrame({"day": days, "card": cards, "score": scores, "fraud": y.astype(bool)})
    per_card = frame.groupby(["day", "card"], sort=False).agg(
        score=("score", "max"), fraud=("fraud", "max")
    )
    per_card = per_card.reset_index().sort_values(["day", "score"], ascending=[True, False])
    top = per_card.groupby("day", sort=True).head(k)
    return top.groupby("day", sort=True)["fraud"].mean()


def _card_sample(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 4000
    days = pd.to_datetime("2024-03-01") + pd.to_timedelta(rng.integers(0, 7, n), unit="D")
    cards = np.array([f"card-{c:04d}" for c in rng.integers(0, 600, n)], dtype=object)
    y = (rng.random(n) < 0.03).astype(np.int64)
    scores = np.round(rng.random(n) * 0.7 + y * 0.25, 1)  # coarse: many ties at the cut
    return days.to_numpy(), cards, y, scores


@pytest.mark.parametrize("seed", SEEDS)
def test_card_precision_per_day_matches_its_pandas_statement(seed: int) -> None:
    days, cards, y, scores = _card_sample(seed)
    for k in (1, 20, 100, 1000):
        found_days, figures = metrics.card_precision_per_day(days, cards, y, scores, k)
        expected = _card_precision_pandas(days, cards, y, scores, k)
        assert list(found_days) == list(expected.index.to_numpy())
        np.testing.assert_allclose(figures, expected.to_numpy(), rtol=0, atol=1e-15)


def _card_precision_handbook(
    days: np.ndarray, cards: np.ndarray, y: np.ndarray, scores: np.ndarray, k: int
) -> list[float]:
    """The Handbook's loop: cards caught on earlier days leave the ranking; share of k."""
    frame = pd.DataFrame({"day": days, "card": cards, "score": scores, "fraud": y})
    detected: set[str] = set()
    out = []
    for _, today in frame.groupby("day", sort=True):
        today = today[~today["card"].isin(detected)]
        per_card = today.groupby("card").agg(score=("score", "max"), fraud=("fraud", "max"))
        top = per_card.sort_values("score", ascending=False, kind="stable").head(k)
        found = set(top.index[top["fraud"] == 1])
        out.append(len(found) / k)
        detected |= found
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_card_precision_without_earlier_detected_cards_is_the_handbooks(seed: int) -> None:
    days, cards, y, _ = _card_sample(seed)
    # Distinct scores: the Handbook's loop orders ties its own way.
    scores = np.random.default_rng(seed + 100).random(len(y)) * 0.7 + y * 0.25
    for k in (10, 50):
        _, figures = metrics.card_precision_per_day(
            days, cards, y, scores, k, exclude_detected=True, divide_by_k=True
        )
        assert figures.tolist() == pytest.approx(
            _card_precision_handbook(days, cards, y, scores, k)
        )
        _, kept = metrics.card_precision_per_day(days, cards, y, scores, k, divide_by_k=True)
        assert figures.sum() <= kept.sum()


def test_card_precision_on_a_quiet_day_and_bad_input() -> None:
    days = np.array(["d1", "d1", "d1", "d2"])
    cards = np.array(["a", "a", "b", "a"])
    y, scores = np.array([0, 1, 0, 1]), np.array([0.1, 0.9, 0.5, 0.8])
    found, figures = metrics.card_precision_per_day(days, cards, y, scores, k=5)
    assert found.tolist() == ["d1", "d2"]
    assert figures.tolist() == [0.5, 1.0]  # card a is fraudulent on d1 by its second payment
    _, figures = metrics.card_precision_per_day(days, cards, y, scores, k=5, divide_by_k=True)
    assert figures.tolist() == [0.2, 0.2]
    # a was caught on d1, so d2 has no card left to rank: nothing found.
    _, figures = metrics.card_precision_per_day(
        days, cards, y, scores, k=5, exclude_detected=True, divide_by_k=True
    )
    assert figures.tolist() == [0.2, 0.0]
    with pytest.raises(ValueError, match="at least 1"):
        metrics.card_precision_per_day(days, cards, y, scores, k=0)
    with pytest.raises(ValueError, match="one entry per row"):
        metrics.card_precision_per_day(days[:2], cards, y, scores, k=1)


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(Fraction(str(q)) * len(ordered) / 100)) - 1]


def test_percentile_is_the_nearest_rank() -> None:
    # The textbook example: 15, 20, 35, 40, 50.
    values = [50, 15, 40, 20, 35]
    assert [metrics.percentile(values, q) for q in (0, 5, 30, 40, 50, 100)] == [
        15,
        15,
        20,
        20,
        35,
        50,
    ]
    # Exact ranks where floating point would round up a rank: 99.9 % of 1000 is the 999th.
    assert metrics.percentile(np.arange(1, 1001), 99.9) == 999
    assert metrics.percentile(np.arange(1, 101), 7) == 7
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100, 999, 12_345):
        sample = rng.exponential(size=n).tolist()
        qs = (0, 50, 90, 99, 99.9, 100)
        assert metrics.percentiles(sample, qs) == tuple(_nearest_rank(sample, q) for q in qs)
        for q in (50, 90, 99):
            assert metrics.percentile(sample, q) == np.percentile(sample, q, method="inverted_cdf")


def test_percentile_edge_cases() -> None:
    assert np.isnan(metrics.percentile([], 99))
    assert metrics.percentile([], 99, empty=0.0) == 0.0
    assert metrics.percentiles([], (50, 99), empty=0.0) == (0.0, 0.0)
    assert metrics.percentile([3.0], 99.9) == 3.0
    with pytest.raises(ValueError, match="within"):
        metrics.percentile([1.0], 101)
    with pytest.raises(ValueError, match="within"):
        metrics.percentile([], -1)
    with pytest.raises(ValueError, match="NaN"):
        metrics.percentile([1.0, math.nan], 50)


def test_psi_by_its_formula() -> None:
    ref, live = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.4, 0.2])
    expected = sum((b - a) * math.log(b / a) for a, b in zip(ref, live, strict=True))
    assert metrics.psi(ref, live) == pytest.approx(expected)
    # Counts are proportions once normalised.
    assert metrics.psi(ref * 1000, live * 37) == pytest.approx(expected)
    assert metrics.psi(ref, ref) == 0.0
    # An empty bin counts as the epsilon share, not as impossible.
    eps = metrics.PSI_EPSILON
    assert metrics.psi([1.0, 0.0], [0.5, 0.5]) == pytest.approx(
        (0.5 - 1.0) * math.log(0.5 / 1.0) + (0.5 - eps) * math.log(0.5 / eps)
    )
    assert np.isnan(metrics.psi([1, 2], [0, 0]))
    with pytest.raises(ValueError, match="bins"):
        metrics.psi([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="non-negative"):
        metrics.psi([1, -2], [1, 2])


def test_numeric_reference_bins_by_quantile_and_catches_a_shift() -> None:
    values = np.arange(1000, dtype=np.float64)
    reference = metrics.NumericReference.fit(values)
    assert reference.edges == tuple(float(99 + 100 * i) for i in range(9))
    assert reference.proportions == pytest.approx([0.1] * 10 + [0.0])
    # Right-closed bins, the last one above the last edge, then missing values.
    assert reference.counts([-5, 99, 99.5, 899, 900, 2000, math.nan]).tolist() == [
        2, 1, 0, 0, 0, 0, 0, 0, 1, 2, 1,
    ]  # fmt: skip
    rng = np.random.default_rng(0)
    same = rng.choice(values, 5000)
    assert reference.psi(same) < 0.02
    assert reference.psi(same * 3) > 0.2
    assert metrics.reference_from_dict(reference.to_dict()) == reference


def test_numeric_reference_of_a_discrete_feature_and_missing_values() -> None:
    values = np.array([0.0] * 80 + [1.0] * 10 + [5.0] * 5 + [math.nan] * 5)
    reference = metrics.NumericReference.fit(values)
    # Ties merge the deciles: at or below 0, up to 1, above 1 (the fives), missing.
    assert reference.edges == (0.0, 1.0)
    assert reference.proportions == pytest.approx([0.8, 0.1, 0.05, 0.05])
    assert sum(reference.proportions) == pytest.approx(1.0)
    # A feature gone missing moves PSI although no value changed.
    assert reference.psi([math.nan] * 50 + [0.0] * 50) > 0.2
    empty = metrics.NumericReference.fit([])
    assert empty.edges == () and np.isnan(empty.psi([1.0]))
    with pytest.raises(ValueError, match="increase"):
        metrics.NumericReference((1.0, 1.0), (0.5, 0.5, 0.0, 0.0))


def test_categorical_reference_keeps_the_top_categories() -> None:
    values = ["card"] * 60 + ["web"] * 30 + ["phone"] * 6 + ["mail"] * 2 + [None, math.nan]
    reference = metrics.CategoricalReference.fit(values, max_categories=2)
    assert reference.categories == ("card", "web")
    assert reference.proportions == pytest.approx([0.6, 0.3, 0.08, 0.02])
    # Unseen categories fall in the other bin.
    assert reference.counts(["web", "kiosk", None, "card", "phone"]).tolist() == [1, 1, 2, 1]
    assert reference.counts_of({"card": 3, "kiosk": 2}, missing=1).tolist() == [3, 0, 2, 1]
    assert reference.psi(values) == pytest.approx(0.0)
    assert reference.psi(["kiosk"] * 50 + ["card"] * 50) > 0.2
    assert metrics.reference_from_dict(reference.to_dict()) == reference
    with pytest.raises(ValueError, match="kind"):
        metrics.reference_from_dict({"kind": "other", "proportions": []})


@pytest.mark.parametrize("seed", SEEDS)
def test_js_distance_is_scipys_in_base_two(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p, q = rng.integers(0, 50, 12), rng.integers(0, 50, 12)
    assert metrics.js_distance(p, q) == pytest.approx(jensenshannon(p, q, base=2), abs=1e-12)
    assert metrics.js_distance(p, q, base=math.e) == pytest.approx(jensenshannon(p, q), abs=1e-12)
    assert metrics.js_distance(p, p) == pytest.approx(0.0, abs=1e-7)
    assert metrics.js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    assert np.isnan(metrics.js_distance([0, 0], [1, 1]))


@pytest.mark.parametrize("seed", SEEDS)
def test_ks_statistic_is_scipys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = np.round(rng.normal(size=300), 1)  # ties within and across samples
    b = np.round(rng.normal(0.2, 1.2, size=170), 1)
    assert metrics.ks_statistic(a, b) == pytest.approx(ks_2samp(a, b).statistic, abs=1e-12)
    assert metrics.ks_statistic(a, a) == 0.0
    assert metrics.ks_statistic([0, 1], [5, 6]) == 1.0
    assert np.isnan(metrics.ks_statistic([], b))


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (37, 1000), (1, 1), (500, 800)])
def test_wilson_interval_is_scipys(k: int, n: int) -> None:
    for level in (0.9, 0.95, 0.99):
        ours = metrics.wilson_interval(k, n, level)
        theirs = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
        assert ours.estimate == k / n
        assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)


def test_wilson_interval_edge_cases() -> None:
    nothing = metrics.wilson_interval(0, 0)
    assert np.isnan(nothing.estimate) and (nothing.low, nothing.high) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        metrics.wilson_interval(5, 3)
    with pytest.raises(ValueError, match="level"):
        metrics.wilson_interval(1, 3, level=1.0)


def test_group_resamples_keep_groups_whole_and_match_a_pandas_statement() -> None:
    groups = np.array(["b", "a", "b", "c", "a", "b", "d"], dtype=object)
    sampler = metrics.Resampler(groups=groups, seed=11)
    # The same draws as factorizing the groups (order of appearance) and drawing whole ones.
    rng = np.random.default_rng(11)
    codes, uniques = pd.factorize(groups)
    rows_of = {g: np.flatnonzero(codes == g) for g in range(len(uniques))}
    for _ in range(5):
        drawn = rng.integers(0, len(uniques), size=len(uniques))
        expected = np.concatenate([rows_of[g] for g in drawn])
        assert sampler.draw().tolist() == expected.tolist()
    rows = metrics.Resampler(5, seed=2).draw()
    assert rows.tolist() == np.random.default_rng(2).integers(0, 5, size=5).tolist()
    with pytest.raises(ValueError, match="either"):
        metrics.Resampler()


def test_bootstrap_interval_holds_the_estimate_and_narrows_with_data() -> None:
    small_y, small_s = _sample(1, n=400)
    big_y, big_s = _sample(1, n=8000)
    small = metrics.bootstrap_interval(metrics.average_precision, small_y, small_s, resamples=300)
    big = metrics.bootstrap_interval(metrics.average_precision, big_y, big_s, resamples=300)
    for interval in (small, big):
        assert interval.low <= interval.estimate <= interval.high
    assert big.high - big.low < small.high - small.low
    again = metrics.bootstrap_interval(metrics.average_precision, small_y, small_s, resamples=300)
    assert again == small
    cards = np.arange(len(small_y)) // 4
    grouped = metrics.bootstrap_interval(
        metrics.roc_auc, small_y, small_s, groups=cards, resamples=300, level=0.9
    )
    assert grouped.low <= grouped.estimate <= grouped.high and grouped.level == 0.9


def test_the_module_needs_numpy_only() -> None:
    source = Path(metrics.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    allowed = {"__future__", "collections", "dataclasses", "fractions", "math", "statistics"}
    assert imported <= allowed | {"typing", "numpy"}, imported - allowed
