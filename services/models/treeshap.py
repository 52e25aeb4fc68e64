"""Exact path-dependent TreeSHAP of a LightGBM model, with each leaf's share tabulated once.

The contribution a leaf makes to each feature's SHAP value depends on the input only
through one bit per feature on the leaf's path: whether the input goes the path's way at
every split on that feature. Everything else is the tree's own (the leaf's value, and per
path feature the share of the training rows that went the path's way at its splits, the
"zero fraction" of Lundberg et al.). So for a leaf whose path tests ``d`` distinct
features, the ``2**d`` possible contribution vectors are computed when the model loads,
and explaining one input is: decide every split, read one table row per leaf, add up.
LightGBM's own ``pred_contrib`` walks every path for every input instead; here it costs a
fraction of that (``docs/cascade.md``, "Reasons from the model"), and gives the same values
within floating-point rounding (``tests/unit/test_treeshap.py`` compares them).

For a leaf with value ``v``, path features ``U`` (``|U| = d``), zero fractions ``z`` and
the input's bits ``o``, the game ``g(S) = v * prod(o_j, j in S) * prod(z_j, j in U - S)``
has the Shapley values

    phi_i = v * (o_i - z_i) * sum_k  k! (d-k-1)! / d!  *  e_k(i)

where ``e_k(i)`` is the coefficient of ``t**k`` in ``prod(z_j + o_j t, j in U, j != i)``;
a tree's SHAP values are the sum over its leaves, the model's the sum over its trees, and
the base is the sum of ``g`` at the empty set (the trees' expected raw score). The tables
are filled by TreeSHAP's own extend and unwind steps, which compute exactly that sum, for
every leaf and bit pattern at once.

Numerical splits only (LightGBM's missing-value rules included). ``TreeTables.build``
returns None for a model with categorical splits, or one whose tables would exceed
``MAX_TABLE_VALUES``: such a model is explained by LightGBM itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_TABLE_VALUES = 16_000_000
"""Largest table, in float64 values (128 MB), before the model is left to LightGBM."""

MAX_PATH_FEATURES = 16
"""Most distinct features on one leaf's path (a table of ``2**d * d`` values, 8 MB at 16);
a model with a longer path is left to LightGBM."""

_CHUNK_VALUES = 2_000_000
"""Values of one building array at once (leaves of one path length are built in chunks)."""

_ZERO = 1e-35
"""LightGBM's kZeroThreshold: |x| at most this is zero for a split whose missing type is Zero."""

_MISSING = {"None": 0, "Zero": 1, "NaN": 2}


@dataclass
class _Splits:
    """Every split of the model, one entry per split in each list."""

    feature: list[int] = field(default_factory=list)
    threshold: list[float] = field(default_factory=list)
    default_left: list[bool] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)


@dataclass
class _Leaf:
    """One leaf: its value and, per distinct feature on its path, the zero fraction and
    the (split, goes left) steps that test it."""

    value: float
    features: list[int]
    zero: list[float]
    steps: list[list[tuple[int, bool]]]


def _walk(node: dict[str, Any], splits: _Splits) -> Iterator[_Leaf]:
    """The leaves under ``node``, registering its splits in ``splits``."""
    stack: list[tuple[dict[str, Any], dict[int, tuple[float, list[tuple[int, bool]]]]]] = [
        (node, {})
    ]
    while stack:
        current, path = stack.pop()
        if "split_feature" not in current:
            features = list(path)
            yield _Leaf(
                float(current["leaf_value"]),
                features,
                [path[f][0] for f in features],
                [path[f][1] for f in features],
            )
            continue
        if current["decision_type"] != "<=":
            raise _Unsupported(f"split kind {current['decision_type']}")
        index = len(splits.feature)
        feature = int(current["split_feature"])
        splits.feature.append(feature)
        splits.threshold.append(float(current["threshold"]))
        splits.default_left.append(bool(current["default_left"]))
        splits.missing.append(_MISSING[current["missing_type"]])
        total = float(current["internal_count"])
        for child, left in ((current["left_child"], True), (current["right_child"], False)):
            share = _count(child) / total if total > 0 else 0.0
            zero, steps = path.get(feature, (1.0, []))
            branch = dict(path)
            branch[feature] = (zero * share, [*steps, (index, left)])
            stack.append((child, branch))


def _count(node: dict[str, Any]) -> float:
    return float(node["leaf_count"] if "split_feature" not in node else node["internal_count"])


class _Unsupported(ValueError):
    """A model these tables do not cover."""


def _leaf_tables(values: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """The contribution tables of ``n`` leaves with ``d`` path features each: shape
    ``(n, 2**d, d)``, row ``b`` for the input bits ``o_j = (b >> j) & 1``.

    TreeSHAP's own steps (Lundberg et al., algorithm 2, as LightGBM runs them), for every
    leaf and bit pattern at once: extend the path's permutation weights by each feature,
    then for each feature the sum of the weights with it unwound."""
    n, d = zero.shape
    bits = ((np.arange(2**d)[:, None] >> np.arange(d)[None, :]) & 1).astype(np.float64)
    # The path: the root's element (zero and one fraction 1), then the d features.
    zeros = [np.ones((n, 1)), *(zero[:, j][:, None] for j in range(d))]
    ones = [np.ones((1, 2**d)), *(bits[:, j][None, :] for j in range(d))]
    weights = [np.ones((n, 2**d))]
    for depth in range(1, d + 1):
        weights.append(np.zeros((n, 2**d)))
        for i in range(depth - 1, -1, -1):
            weights[i + 1] += ones[depth] * weights[i] * ((i + 1) / (depth + 1))
            weights[i] = zeros[depth] * weights[i] * ((depth - i) / (depth + 1))
    tables = np.empty((n, 2**d, d))
    for element in range(1, d + 1):
        one, fraction = ones[element], zeros[element]
        # Where the input does not go the path's way (one == 0) the weights divide by the
        # zero fraction; elsewhere they unwind from the top, as LightGBM's UnwoundPathSum.
        following = one != 0
        top = weights[d]
        total = np.zeros((n, 2**d))
        for i in range(d - 1, -1, -1):
            part = top * ((d + 1) / (i + 1))
            top = weights[i] - part * fraction * ((d - i) / (d + 1))
            total += np.where(following, part, weights[i] / fraction * ((d + 1) / (d - i)))
        tables[:, :, element - 1] = total * (one - fraction) * values[:, None]
    return tables


@dataclass(frozen=True)
class TreeTables:
    """A model's splits and leaf tables, ready to explain one input at a time."""

    num_features: int
    base: float
    split_feature: np.ndarray
    split_threshold: np.ndarray
    split_default_left: np.ndarray
    zero_missing: np.ndarray
    """Per split: whether zero is its missing value (missing type Zero)."""
    nan_missing: np.ndarray
    """Per split: whether NaN is its missing value (missing type NaN); else NaN is zero."""
    any_zero_missing: bool
    """Whether any split takes zero as missing (else only NaN needs the slower rule)."""
    step_split: np.ndarray
    """Per (leaf, path feature, split on it): the split."""
    step_left: np.ndarray
    """... and whether the path goes left there."""
    step_slot: np.ndarray
    """... and which (leaf, path feature) slot it belongs to."""
    slot_feature: np.ndarray
    """Per slot: the feature."""
    slot_leaf: np.ndarray
    """Per slot: its leaf."""
    slot_bit: np.ndarray
    """Per slot: 2**(its position on the leaf's path)."""
    slot_base: np.ndarray
    """Per slot: where its leaf's table starts in ``table``, plus its position."""
    slot_width: np.ndarray
    """Per slot: its leaf's number of path features (the length of a table row)."""
    num_leaves: int
    table: np.ndarray
    """Every leaf's table, flat."""

    @classmethod
    def build(cls, model: dict[str, Any]) -> TreeTables | None:
        """The tables of ``Booster.dump_model()``'s output; None when they do not cover it."""
        if int(model.get("num_class", 1)) != 1:
            return None
        splits = _Splits()
        try:
            leaves = [
                leaf
                for tree in model["tree_info"]
                for leaf in _walk(tree["tree_structure"], splits)
            ]
        except _Unsupported:
            return None
        size = sum(2 ** len(leaf.features) * len(leaf.features) for leaf in leaves)
        widest = max((len(leaf.features) for leaf in leaves), default=0)
        if size > MAX_TABLE_VALUES or widest > MAX_PATH_FEATURES:
            return None
        if any(z <= 0 for leaf in leaves for z in leaf.zero):
            return None  # a branch no training row took: the unwinding would divide by zero
        base = math.fsum(leaf.value * math.prod(leaf.zero) for leaf in leaves)
        table = np.empty(size)
        offsets = np.zeros(len(leaves), dtype=np.int64)
        by_width: dict[int, list[int]] = {}
        for index, leaf in enumerate(leaves):
            by_width.setdefault(len(leaf.features), []).append(index)
        at = 0
        for width, members in sorted(by_width.items()):
            if width == 0:
                continue  # no path feature, no table: the leaf only moves the base
            step = 2**width * width
            offsets[members] = at + step * np.arange(len(members))
            chunk = max(1, _CHUNK_VALUES // 2**width)
            for first in range(0, len(members), chunk):
                part = members[first : first + chunk]
                block = _leaf_tables(
                    np.array([leaves[m].value for m in part]),
                    np.array([leaves[m].zero for m in part]),
                )
                table[at : at + block.size] = block.reshape(-1)
                at += block.size
        return cls._arrays(model, splits, leaves, base, offsets, table)

    @classmethod
    def _arrays(
        cls,
        model: dict[str, Any],
        splits: _Splits,
        leaves: list[_Leaf],
        base: float,
        offsets: np.ndarray,
        table: np.ndarray,
    ) -> TreeTables:
        step_split: list[int] = []
        step_left: list[bool] = []
        step_slot: list[int] = []
        slot_feature: list[int] = []
        slot_leaf: list[int] = []
        slot_position: list[int] = []
        for index, leaf in enumerate(leaves):
            for position, (feature, steps) in enumerate(
                zip(leaf.features, leaf.steps, strict=True)
            ):
                slot = len(slot_feature)
                slot_feature.append(feature)
                slot_leaf.append(index)
                slot_position.append(position)
                for split, left in steps:
                    step_split.append(split)
                    step_left.append(left)
                    step_slot.append(slot)
        positions = np.asarray(slot_position, dtype=np.int64)
        leaf_of = np.asarray(slot_leaf, dtype=np.int64)
        widths = np.asarray([len(leaf.features) for leaf in leaves], dtype=np.int64)
        missing = np.asarray(splits.missing, dtype=np.int8)
        return cls(
            num_features=int(model["max_feature_idx"]) + 1,
            base=base,
            split_feature=np.asarray(splits.feature, dtype=np.int64),
            split_threshold=np.asarray(splits.threshold, dtype=np.float64),
            split_default_left=np.asarray(splits.default_left, dtype=bool),
            zero_missing=missing == _MISSING["Zero"],
            nan_missing=missing == _MISSING["NaN"],
            any_zero_missing=bool((missing == _MISSING["Zero"]).any()),
            step_split=np.asarray(step_split, dtype=np.int64),
            step_left=np.asarray(step_left, dtype=bool),
            step_slot=np.asarray(step_slot, dtype=np.int64),
            slot_feature=np.asarray(slot_feature, dtype=np.int64),
            slot_leaf=leaf_of,
            slot_bit=np.left_shift(1, positions),
            slot_base=offsets[leaf_of] + positions,
            slot_width=widths[leaf_of],
            num_leaves=len(leaves),
            table=table,
        )

    def goes_left(self, row: np.ndarray) -> np.ndarray:
        """Per split, whether ``row`` (float64 values of the float32 input) goes left, by
        LightGBM's rule for numerical splits and missing values."""
        value = row[self.split_feature]
        nan = np.isnan(value)
        if not self.any_zero_missing and not nan.any():
            return value <= self.split_threshold
        # NaN is zero unless the split's missing type is NaN.
        value = np.where(nan & ~self.nan_missing, 0.0, value)
        missing = (self.zero_missing & (np.abs(value) <= _ZERO)) | (self.nan_missing & nan)
        return np.where(missing, self.split_default_left, value <= self.split_threshold)

    def contributions(self, row: np.ndarray) -> np.ndarray:
        """Each feature's SHAP value for ``row``, then the base: like ``pred_contrib``."""
        disagrees = self.goes_left(row)[self.step_split] != self.step_left
        off = np.bincount(self.step_slot, weights=disagrees, minlength=len(self.slot_leaf))
        patterns = np.bincount(
            self.slot_leaf, weights=(off == 0) * self.slot_bit, minlength=self.num_leaves
        ).astype(np.int64)
        at = self.slot_base + patterns[self.slot_leaf] * self.slot_width
        shares = np.bincount(self.slot_feature, weights=self.table[at], minlength=self.num_features)
        return np.append(shares, self.base)
