"""Model selection: candidates grown with early stopping on the validation period, the best one
refitted on the whole training window, with split thresholds the scorer's float32 inputs cannot
flip."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import lightgbm as lgb
import numpy as np

from services.pipelines.training.params import Progress, TrainParams


@dataclass(frozen=True)
class Rows:
    """Model inputs, labels and sample weights of one period."""

    x: np.ndarray
    y: np.ndarray
    weight: np.ndarray


def sample_genuine(
    y: np.ndarray, rows: np.ndarray, cap: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``rows`` (a mask) with at most ``cap`` of them: every fraud, a uniform sample
    of the genuine ones; and weights (1 for frauds, 1 / sampling rate for genuine rows)."""
    index = np.flatnonzero(rows)
    weights = np.ones(len(index), dtype=np.float64)
    if len(index) <= cap:
        return index, weights
    fraud = y[index] == 1
    genuine = index[~fraud]
    keep = max(cap - int(fraud.sum()), min(len(genuine), cap // 2))
    kept = np.sort(rng.choice(genuine, size=keep, replace=False))
    index = np.sort(np.concatenate([index[fraud], kept]))
    weights = np.where(y[index] == 1, 1.0, len(genuine) / keep)
    return index, weights


@dataclass(frozen=True)
class Selection:
    """What selection chose and saw."""

    booster: lgb.Booster
    """The best candidate, grown on the fit rows and cut to its best number of trees."""
    lgb_params: dict[str, float | int | str | bool]
    """The best candidate's LightGBM parameters (a refit reuses them)."""
    trees: int
    """Its best number of trees."""
    figures: list[dict[str, float]]
    """Each candidate's validation average precision, best number of trees and row counts."""


def lgb_params(
    params: TrainParams, leaves: int, min_child: int, rows: Rows
) -> dict[str, float | int | str | bool]:
    """LightGBM's parameters for one candidate setting grown on ``rows``."""
    # The class balance of the population the (weighted) rows stand for.
    positives = max(float(rows.weight[rows.y == 1].sum()), 1.0)
    negatives = float(rows.weight[rows.y == 0].sum())
    return {
        "objective": "binary",
        "metric": "average_precision",
        "learning_rate": params.learning_rate,
        "num_leaves": leaves,
        "min_child_samples": min_child,
        "feature_fraction": 0.9,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "lambda_l2": 1.0,
        # Each row counts once unless asked: up-weighting the ~1% fraud class by the square
        # root of the imbalance cost average precision on every dataset measured, and the
        # thresholds are set on the scores' own ranking anyway.
        "scale_pos_weight": (
            math.sqrt(negatives / positives) if params.fraud_weight == "sqrt" else 1.0
        ),
        "seed": params.seed,
        "deterministic": True,
        "force_col_wise": True,
        "num_threads": params.threads,
        "verbose": -1,
    }


def select(
    fit: Rows, valid: Rows, params: TrainParams, report: Progress, total: int | None = None
) -> Selection:
    """Grows each candidate with early stopping on the validation period; the best one, cut
    to its best number of trees, and every candidate's figures. ``total`` is the progress
    total when more work follows (a refit)."""
    total = total or params.max_trees * len(params.candidates)
    done = 0
    report("train", 0, total)
    best: Selection | None = None
    best_score = -1.0
    figures: list[dict[str, float]] = []
    names = list(params.feature_order)
    for leaves, min_child in params.candidates:
        chosen = lgb_params(params, leaves, min_child, fit)
        fit_set = lgb.Dataset(fit.x, label=fit.y, weight=fit.weight, feature_name=names)
        valid_set = lgb.Dataset(
            valid.x, label=valid.y, weight=valid.weight, feature_name=names, reference=fit_set
        )
        offset = done

        def on_iteration(env: lgb.callback.CallbackEnv, offset: int = offset) -> None:
            report("train", offset + env.iteration + 1, total)

        booster = lgb.train(
            chosen,
            fit_set,
            num_boost_round=params.max_trees,
            valid_sets=[valid_set],
            valid_names=["validation"],
            callbacks=[
                lgb.early_stopping(params.early_stopping_rounds, verbose=False),
                on_iteration,
            ],
        )
        done += params.max_trees
        report("train", done, total)
        score = float(booster.best_score["validation"]["average_precision"])
        trees = int(booster.best_iteration) or booster.current_iteration()
        figures.append(
            {
                "num_leaves": leaves,
                "min_child_samples": min_child,
                "trees": trees,
                "validation_average_precision": score,
                "fit_rows": len(fit.y),
                "validation_rows": len(valid.y),
            }
        )
        if best is None or score > best_score:
            cut = booster.model_to_string(num_iteration=trees)
            best_score = score
            best = Selection(float32_thresholds(lgb.Booster(model_str=cut)), chosen, trees, [])
    assert best is not None
    return Selection(best.booster, best.lgb_params, best.trees, figures)


def refit(
    selection: Selection,
    rows: Rows,
    params: TrainParams,
    report: Progress,
    progress: tuple[int, int],
) -> lgb.Booster:
    """The selected setting grown again on ``rows`` (the whole training window) with the
    selected number of trees. ``progress`` is (trees done before, total) for the report."""
    chosen = lgb_params(
        params, int(selection.lgb_params["num_leaves"]),
        int(selection.lgb_params["min_child_samples"]), rows,
    )  # fmt: skip
    offset, total = progress

    def on_iteration(env: lgb.callback.CallbackEnv) -> None:
        report("train", offset + env.iteration + 1, total)

    data = lgb.Dataset(
        rows.x, label=rows.y, weight=rows.weight, feature_name=list(params.feature_order)
    )
    booster = lgb.train(chosen, data, num_boost_round=selection.trees, callbacks=[on_iteration])
    report("train", total, total)
    return float32_thresholds(booster)


def predict(booster: lgb.Booster, x: np.ndarray) -> np.ndarray:
    """Fraud probabilities of float32 rows, widened exactly (as the scorer receives them)."""
    return np.asarray(booster.predict(x.astype(np.float64)), dtype=np.float64)


_THRESHOLD_LINE = re.compile(r"^threshold=(.*)$", re.MULTILINE)
# Byte offsets of the trees in the model text; stale once thresholds are rewritten, and
# optional: without them LightGBM parses the trees one after another.
_TREE_SIZES_LINE = re.compile(r"^tree_sizes=.*\n", re.MULTILINE)


def float32_thresholds(booster: lgb.Booster) -> lgb.Booster:
    """The same model with each split threshold t replaced by the largest float32 <= t.

    The scorer's inputs are float32, and for a float32 x, ``x <= t`` holds exactly when
    ``x <= that float32`` does: the model's decisions on such inputs do not change. ONNX
    stores thresholds as float32, rounded to nearest, which flips the decision for the x
    just above t; with float32 thresholds there is nothing left to round.
    """

    def round_down(match: re.Match[str]) -> str:
        exact = np.array(match.group(1).split(), dtype=np.float64)
        nearest = exact.astype(np.float32)
        down = np.where(nearest.astype(np.float64) > exact, np.nextafter(nearest, -np.inf), nearest)
        return "threshold=" + " ".join(repr(float(v)) for v in down)

    text = _THRESHOLD_LINE.sub(round_down, booster.model_to_string())
    return lgb.Booster(model_str=_TREE_SIZES_LINE.sub("", text))
