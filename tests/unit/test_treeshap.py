"""The contribution tables give LightGBM's own TreeSHAP values (``pred_contrib``) for real
trees: every kind of missing value, deep and one-leaf trees, and the base; models they do
not cover are left to LightGBM."""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
import pytest

from services.models import treeshap
from services.models.treeshap import TreeTables

N = 6


def _train(x: np.ndarray, y: np.ndarray, rounds: int = 30, **params: Any) -> lgb.Booster:
    base = {
        "objective": "binary",
        "verbose": -1,
        "seed": 3,
        "num_leaves": 31,
        "min_data_in_leaf": 5,
    }
    return lgb.train({**base, **params}, lgb.Dataset(x, y), num_boost_round=rounds)


def _data(seed: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N))
    logit = 1.5 * x[:, 0] - x[:, 1] * x[:, 2] + 0.5 * (x[:, 3] > 0.7) - 1.0
    return x, rng.random(n) < 1.0 / (1.0 + np.exp(-logit))


def _check(booster: lgb.Booster, rows: np.ndarray) -> None:
    tables = TreeTables.build(booster.dump_model())
    assert tables is not None
    rows = rows.astype(np.float32).astype(np.float64)
    expected = booster.predict(rows, pred_contrib=True)
    raw = booster.predict(rows, raw_score=True)
    for row, want, score in zip(rows, expected, raw, strict=True):
        got = tables.contributions(row)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
        assert got.sum() == pytest.approx(score, abs=1e-9)


def test_deep_trees_on_plain_values() -> None:
    x, y = _data(1)
    _check(_train(x, y, num_leaves=63, max_depth=-1), _data(2, 300)[0])


def test_missing_values_nan_kind_both_default_directions() -> None:
    x, y = _data(3)
    x[::4, 0] = np.nan  # the splits on feature 0 learn where NaN goes
    x[1::5, 1] = np.nan
    booster = _train(x, y)
    kinds = {
        (node["missing_type"], node["default_left"])
        for node in _splits(booster.dump_model())
        if node["split_feature"] in (0, 1)
    }
    assert ("NaN", True) in kinds or ("NaN", False) in kinds
    rows = _data(4, 300)[0]
    rows[::3, 0] = np.nan
    rows[::4, 1] = np.nan
    rows[::5, 2] = np.nan  # no NaN in training: treated as zero
    _check(booster, rows)


def test_zero_as_missing() -> None:
    x, y = _data(5)
    x[::3, 0] = 0.0
    booster = _train(x, y, zero_as_missing=True)
    assert any(n["missing_type"] == "Zero" for n in _splits(booster.dump_model()))
    rows = _data(6, 300)[0]
    rows[::2, 0] = 0.0
    rows[1::4, 0] = 1e-36  # zero to LightGBM
    rows[::5, 3] = np.nan
    _check(booster, rows)


def test_one_leaf_trees_only_move_the_base() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(500, N))
    y = rng.random(500) < 0.5
    # No split is worth making: every tree is one leaf.
    booster = _train(x, y, rounds=5, min_gain_to_split=1e9)
    assert all(
        "split_feature" not in t["tree_structure"] for t in booster.dump_model()["tree_info"]
    )
    _check(booster, x[:20])


def test_models_the_tables_do_not_cover_are_left_to_lightgbm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(8)
    x = rng.integers(0, 8, size=(2000, 2)).astype(np.float64)
    y = (x[:, 0] % 3 == 0) ^ (rng.random(2000) < 0.1)
    categorical = lgb.train(
        {"objective": "binary", "verbose": -1, "min_data_per_group": 5, "cat_smooth": 1},
        lgb.Dataset(x, y, categorical_feature=[0]),
        num_boost_round=5,
    )
    assert TreeTables.build(categorical.dump_model()) is None
    multiclass = lgb.train(
        {"objective": "multiclass", "num_class": 3, "verbose": -1},
        lgb.Dataset(x, (x[:, 0] % 3).astype(int)),
        num_boost_round=3,
    )
    assert TreeTables.build(multiclass.dump_model()) is None
    x, y = _data(9)
    booster = _train(x, y, rounds=5)
    monkeypatch.setattr(treeshap, "MAX_TABLE_VALUES", 10)
    assert TreeTables.build(booster.dump_model()) is None


def _splits(model: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [tree["tree_structure"] for tree in model["tree_info"]]
    while stack:
        node = stack.pop()
        if "split_feature" in node:
            found.append(node)
            stack += [node["left_child"], node["right_child"]]
    return found
