"""Training's model selection: class weighting, the refit on the whole window, and thresholds
from scores the published model did not train on."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import log_loss

from services.models import repository
from services.pipelines import train
from services.pipelines.training.params import TrainParams
from services.pipelines.training.selection import Rows, lgb_params, predict, select
from tests.unit.tiny_models import synthetic

FAST = TrainParams(max_trees=60, early_stopping_rounds=10, threads=1)


def _rows(n: int, seed: int) -> Rows:
    x, y = synthetic(n, seed)
    return Rows(x, y, np.ones(len(y)))


def test_each_row_counts_once_unless_up_weighting_is_asked() -> None:
    rows = _rows(2000, seed=1)
    imbalance = float((rows.y == 0).sum()) / float((rows.y == 1).sum())
    assert lgb_params(TrainParams(), 31, 10, rows)["scale_pos_weight"] == 1.0
    weighted = lgb_params(TrainParams(fraud_weight="sqrt"), 31, 10, rows)
    assert weighted["scale_pos_weight"] == pytest.approx(math.sqrt(imbalance))


def test_selection_keeps_the_best_candidate_at_its_best_number_of_trees() -> None:
    chosen = select(_rows(3000, seed=1), _rows(1500, seed=2), FAST, lambda *_: None)
    assert [(f["num_leaves"], f["min_child_samples"]) for f in chosen.figures] == list(
        FAST.candidates
    )
    best = max(chosen.figures, key=lambda f: f["validation_average_precision"])
    assert (chosen.lgb_params["num_leaves"], chosen.trees) == (best["num_leaves"], best["trees"])
    assert chosen.booster.num_trees() == chosen.trees


def _dataset(n_days: int = 10, per_day: int = 600) -> train._Dataset:
    """A training window of synthetic rows, one day per block: the last two days validate,
    the test period follows."""
    x, y = synthetic(n_days * per_day, seed=4)
    day = np.repeat(np.arange(n_days), per_day)
    fit, valid, test = day < 6, (day >= 6) & (day < 8), day >= 8
    start = datetime(2026, 1, 1, tzinfo=UTC)
    window = repository.TrainingWindow(
        start=start,
        end=datetime(2026, 1, 11, tzinfo=UTC),
        holdout_start=datetime(2026, 1, 9, tzinfo=UTC),
        train_end=datetime(2026, 1, 9, tzinfo=UTC),
        validation_start=datetime(2026, 1, 7, tzinfo=UTC),
    )
    return train._Dataset(
        window, pd.Timestamp(start), {}, x, y, fit, valid, test, {}, pd.DataFrame()
    )


def test_the_published_model_is_refitted_on_the_whole_window() -> None:
    data = _dataset()
    kept = train._fit(data, FAST, lambda *_: None)
    alone = train._fit(data, replace(FAST, refit=False), lambda *_: None)
    chosen = max(kept.selection, key=lambda f: f["validation_average_precision"])
    # The same setting and number of trees, grown on more rows: another model.
    assert kept.booster.num_trees() == alone.booster.num_trees() == chosen["trees"]
    refit_scores = predict(kept.booster, data.x[data.valid])
    assert not np.array_equal(refit_scores, predict(alone.booster, data.x[data.valid]))
    # The refit saw the validation rows: it fits them better than the candidate that did not.
    y = data.y[data.valid]
    assert log_loss(y, refit_scores) < log_loss(y, predict(alone.booster, data.x[data.valid]))


def test_thresholds_come_from_scores_the_published_model_did_not_train_on() -> None:
    data = _dataset()
    kept = train._fit(data, FAST, lambda *_: None)
    alone = train._fit(data, replace(FAST, refit=False), lambda *_: None)
    # The selected candidate's validation scores, not the refit's (which trained on them).
    assert np.array_equal(kept.valid_scores, predict(alone.booster, data.x[kept.valid_rows]))
    assert not np.array_equal(kept.valid_scores, predict(kept.booster, data.x[kept.valid_rows]))


def test_refit_split_thresholds_are_float32() -> None:
    kept = train._fit(_dataset(), FAST, lambda *_: None)
    model = kept.booster.dump_model()

    def thresholds(node: dict[str, object]) -> list[float]:
        if "threshold" not in node:
            return []
        left = node["left_child"]
        right = node["right_child"]
        assert isinstance(left, dict) and isinstance(right, dict)
        value = node["threshold"]
        assert isinstance(value, float)
        return [value, *thresholds(left), *thresholds(right)]

    values = [t for tree in model["tree_info"] for t in thresholds(tree["tree_structure"])]
    assert values
    assert all(float(np.float32(v)) == v for v in values)


def test_progress_ends_at_its_total() -> None:
    seen: list[tuple[str, int, int]] = []
    train._fit(_dataset(), FAST, lambda step, done, total: seen.append((step, done, total)))
    totals = {total for _, _, total in seen}
    assert totals == {FAST.max_trees * (len(FAST.candidates) + 1)}
    assert seen[-1][1] == seen[-1][2]
    assert all(b[1] >= a[1] for a, b in itertools.pairwise(seen))
