"""Training's model selection: class weighting, the refit on the whole window, and thresholds
from scores the published model did not train on."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from sklearn.metrics import log_loss

from services.domain import featurespec
from services.models import repository
from services.pipelines import train
from services.pipelines.training.params import TrainParams
from services.pipelines.training.selection import Rows, lgb_params, predict, select
from tests.unit.tiny_models import synthetic

FAST = TrainParams(max_trees=60, early_stopping_rounds=10, threads=1, optional_features="none")


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


def _with_optional(data: train._Dataset, signal: bool) -> train._Dataset:
    """``data`` with the optional features after its inputs: a fraud's terminal had a known
    fraud a few days before (``signal``), or every terminal's columns say the same."""
    rng = np.random.default_rng(11)
    n = len(data.y)
    episode = (data.y == 1) & (rng.random(n) < 0.6) | (rng.random(n) < 0.02)
    days = np.where(episode, rng.uniform(7.0, 20.0, n), featurespec.NO_KNOWN_FRAUD_DAYS)
    if not signal:
        days = np.full(n, featurespec.NO_KNOWN_FRAUD_DAYS)
    columns = np.column_stack([days, days + 1.0]).astype(np.float32)
    return replace(data, x=np.column_stack([data.x, columns]))


@pytest.mark.parametrize("signal", [True, False])
def test_the_optional_features_are_kept_only_when_validation_says_they_help(
    signal: bool,
) -> None:
    params = replace(FAST, optional_features="choose")
    assert params.optional == featurespec.OPTIONAL_FEATURES
    seen: list[tuple[str, int, int]] = []
    model = train._fit(_with_optional(_dataset(), signal), params, lambda *step: seen.append(step))
    base, grown = model.selection[: len(FAST.candidates)], model.selection[-1]
    assert len(model.selection) == len(FAST.candidates) + 1
    best = max(base, key=lambda f: f["validation_average_precision"])
    # The grown one is the best setting again, with the optional features.
    assert (grown["num_leaves"], grown["optional_features"]) == (best["num_leaves"], 2.0)
    gain = grown["validation_average_precision"] / best["validation_average_precision"] - 1.0
    assert (gain >= params.optional_gain) == signal
    assert model.added_features == (featurespec.OPTIONAL_FEATURES if signal else ())
    assert tuple(model.booster.feature_name()) == featurespec.trained_order(model.added_features)
    assert [f["selected"] for f in model.selection].count(1.0) == 1
    assert (grown if signal else best)["selected"] == 1.0
    assert {total for _, _, total in seen} == {FAST.max_trees * (len(FAST.candidates) + 2)}
    assert seen[-1][1] == seen[-1][2]
    assert all(b[1] >= a[1] for a, b in itertools.pairwise(seen))


ADDED = ("merchant_country",)


def _wider(data: train._Dataset, order: tuple[str, ...]) -> train._Dataset:
    """``data`` with one more column, a country code that carries signal of its own."""
    rng = np.random.default_rng(9)
    codes = np.where(data.y == 1, rng.choice([250.0, 840.0], len(data.y)), 276.0)
    codes = np.where(rng.random(len(codes)) < 0.7, 276.0, codes).astype(np.float32)
    days = pd.date_range("2026-01-01", periods=len(data.y), freq="min", tz="UTC")
    tested = pd.DataFrame({"timestamp": days[data.test], "card_id": "c"})
    return replace(
        data,
        x=np.column_stack([data.x, codes]),
        defaults=dict.fromkeys(order, 0.0),
        tested=tested,
        raw_valid=np.column_stack([data.x, codes])[data.valid].astype(np.float64),
        order=order,
    )


def test_training_params_refuse_an_added_feature_nobody_serves() -> None:
    with pytest.raises(
        featurespec.FeatureChoiceError, match="'shoe_size' is not a servable feature"
    ):
        TrainParams(added_features=("shoe_size",))
    assert TrainParams().feature_order == featurespec.MODEL_FEATURES
    assert TrainParams().record()["added_features"] == ""


def test_a_version_trained_with_an_added_feature_takes_it_last_at_every_step(
    tmp_path: Path,
) -> None:
    from services.models import reference as references
    from services.pipelines.training import export, small
    from services.pipelines.training.reference import version_reference

    params = replace(FAST, added_features=ADDED)
    order = params.feature_order
    assert order == (*featurespec.MODEL_FEATURES, *ADDED)
    data = _wider(_dataset(), order)
    model = train._fit(data, params, lambda *_: None)
    assert tuple(model.booster.feature_name()) == order
    # The added column is used: the model takes the country code by name.
    importance = dict(zip(order, model.booster.feature_importance(), strict=True))
    assert importance["merchant_country"] > 0

    onnx_path = tmp_path / "model.onnx"
    export.export_onnx(model.booster, len(order), onnx_path)
    (declared,) = onnx.load(onnx_path).graph.input
    assert declared.type.tensor_type.shape.dim[1].dim_value == len(order)
    scores = predict(model.booster, data.x[data.test])
    assert export.parity_gap(onnx_path, data.x[data.test], scores) <= export.PARITY_TOLERANCE

    thresholds = repository.Thresholds(review=0.3, decline=0.8)
    step = small.build(model.booster, data, thresholds, scores, params)
    assert tuple(step.booster.feature_name()) == order
    assert step.export(tmp_path / "small.onnx", data.x[data.test]) <= export.PARITY_TOLERANCE

    window = data.window
    meta = export.metadata(thresholds, data.defaults, {}, window, 0.0, params, datetime.now(UTC))
    assert meta.feature_order == list(order)
    assert meta.params["added_features"] == "merchant_country"
    cards = np.array(["c"] * int(data.test.sum()))
    fitted = version_reference(
        model.selected, data.x[data.valid], data.raw_valid, window, thresholds,
        (data.y[data.test], scores, cards), names=order,
    )  # fmt: skip
    # A country code drifts by category, not by quantile.
    assert isinstance(fitted.features["merchant_country"], references.metrics.CategoricalReference)
    assert list(fitted.features) == list(order)
