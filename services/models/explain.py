"""Reasons from the model itself: exact TreeSHAP contributions of a version's own trees.

A published version keeps the LightGBM model it was exported from (``BOOSTER_FILE``) beside
``model.onnx``. Each feature's exact TreeSHAP contribution to the raw score (the log-odds)
of one input, plus the expected value over the training data (the base), comes from the
trees' contribution tables (``treeshap.py``, the values of LightGBM's ``pred_contrib`` at a
fraction of its cost; LightGBM itself explains models they do not cover): base +
contributions = raw score, and sigmoid(raw score) is
the fraud probability ONNX Runtime serves for the same float32 input. The input is given
to the trees as the float32 values the scorer receives, so both follow the same branches.

``Explanation.reasons`` writes the top k contributions by magnitude as the answer's
reasons, with sign and the feature's value, and one line that accounts for the rest, so
that the reasons sum to the raw score. Transport-free: no grpc here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from services.models.treeshap import TreeTables

if TYPE_CHECKING:
    import lightgbm as lgb


_OPTIONAL = ("sklearn", "pandas", "pyarrow", "dask", "matplotlib", "graphviz", "datatable")
"""What LightGBM imports whenever it is installed, for its estimator classes and the data
frames it accepts, and what explaining one numpy row never needs."""


def _lightgbm(lean: bool = False) -> Any:
    """LightGBM, imported on first use. ``lean`` (a gateway, which only ever explains numpy
    rows with a Booster) imports it without the optional packages in ``_OPTIONAL`` that this
    process has not loaded yet: here they are 0.7 of its 1.0 s of CPU, and 100 MB, taken from
    the calls the other gateway serves while this one restarts. A lean import must be the
    process's first import of LightGBM; after it, LightGBM takes no data frame."""
    import sys

    if not lean or "lightgbm" in sys.modules:
        import lightgbm

        return lightgbm
    blocked = [name for name in _OPTIONAL if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import lightgbm
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return lightgbm


BOOSTER_FILE = "lightgbm.txt"
"""The version's LightGBM model text inside its folder (absent in versions imported without it)."""

DEFAULT_TOP_K = 3
"""How many of the model's features an answer names by default."""

SERVED_TOLERANCE = 1e-6
"""Largest |sigmoid(base + contributions) - served probability| an explanation may show: a
larger gap means the explained trees are not the served ones, and the answer goes without."""

_DIGITS = 9
"""Decimals of the log-odds in the reasons: enough that their sum is exact within 1e-6."""


@dataclass(frozen=True, slots=True)
class Contribution:
    """One feature's share of the raw score: its value and its contribution in log-odds."""

    feature: str
    value: float
    log_odds: float


@dataclass(frozen=True, slots=True)
class Explanation:
    """The TreeSHAP decomposition of one input's raw score (log-odds)."""

    base: float
    """The expected raw score over the training data."""
    contributions: tuple[Contribution, ...]
    """Every input feature's contribution, in the version's feature order."""

    @property
    def raw(self) -> float:
        """base + every contribution: the trees' raw score of the input."""
        return math.fsum([self.base, *(c.log_odds for c in self.contributions)])

    @property
    def probability(self) -> float:
        """The fraud probability the raw score stands for."""
        return 1.0 / (1.0 + math.exp(-self.raw))

    def matches(self, served: float, tolerance: float = SERVED_TOLERANCE) -> bool:
        """Whether the explained probability is the ``served`` one within ``tolerance``."""
        return abs(self.probability - served) <= tolerance

    def top(self, k: int) -> list[Contribution]:
        """The ``k`` largest contributions by magnitude, largest first (ties: feature order)."""
        order = sorted(
            range(len(self.contributions)),
            key=lambda i: (-abs(self.contributions[i].log_odds), i),
        )
        return [self.contributions[i] for i in order[:k]]

    def reasons(self, k: int) -> list[str]:
        """The answer's reasons: the top ``k`` features, then how the raw score adds up."""
        top = self.top(k)
        shown = math.fsum(c.log_odds for c in top)
        rest = self.raw - self.base - shown
        others = len(self.contributions) - len(top)
        lines = [_feature_reason(c) for c in top]
        lines.append(
            f"model log-odds {self.raw:.{_DIGITS}f} = base {self.base:.{_DIGITS}f} "
            f"{_signed(shown)} from {len(top)} features above "
            f"{_signed(rest)} from {others} others"
        )
        return lines


def _signed(value: float) -> str:
    return f"{value:+.{_DIGITS}f}"


def _feature_reason(c: Contribution) -> str:
    toward = "fraud" if c.log_odds >= 0 else "legitimate"
    return (
        f"model feature {c.feature} = {c.value:.6g}: {_signed(c.log_odds)} log-odds "
        f"(toward {toward})"
    )


class BoosterMismatch(ValueError):
    """The booster text does not take the version's inputs."""


class TreeExplainer:
    """A version's trees, ready to explain one input at a time (synchronously)."""

    def __init__(self, booster: lgb.Booster, feature_order: Sequence[str]) -> None:
        names = list(booster.feature_name())
        order = list(feature_order)
        if booster.num_feature() != len(order):
            raise BoosterMismatch(
                f"the trees take {booster.num_feature()} features, the version {len(order)}"
            )
        # Trees trained on a frame carry its column names; they must be the version's own.
        if not all(n.startswith("Column_") for n in names) and names != order:
            raise BoosterMismatch("the trees' feature names are not the version's feature order")
        self._booster = booster
        self.feature_order = tuple(order)
        self._tables = TreeTables.build(booster.dump_model())
        """The trees' contribution tables (``treeshap.py``); None: LightGBM explains."""

    @property
    def num_trees(self) -> int:
        """How many trees the model holds."""
        return int(self._booster.num_trees())

    @classmethod
    def load(
        cls, folder: Path, feature_order: Sequence[str], lean: bool = False
    ) -> TreeExplainer | None:
        """The explainer of the version in ``folder``; None when it has no booster text.
        ``lean``: see ``_lightgbm``."""
        path = folder / BOOSTER_FILE
        if not path.is_file():
            return None
        return cls(_lightgbm(lean).Booster(model_file=str(path)), feature_order)

    @property
    def tabulated(self) -> bool:
        """Whether the contribution tables explain (else LightGBM's ``pred_contrib``)."""
        return self._tables is not None

    def explain(self, vector: Sequence[float]) -> Explanation:
        """The exact TreeSHAP decomposition of the input ``vector`` (in feature order)."""
        if self._tables is None:
            return self.explain_by_predict(vector)
        row = _float32_row(vector)[0]
        return self._explanation(row, self._tables.contributions(row))

    def explain_by_predict(self, vector: Sequence[float]) -> Explanation:
        """``explain`` by LightGBM's own TreeSHAP (``pred_contrib``): the reference."""
        row = _float32_row(vector)
        return self._explanation(
            row[0], self._booster.predict(row, pred_contrib=True, num_threads=1)[0]
        )

    def _explanation(self, row: np.ndarray, shares: np.ndarray) -> Explanation:
        contributions = tuple(
            Contribution(name, value, c)
            for name, value, c in zip(
                self.feature_order, row.tolist(), shares[:-1].tolist(), strict=True
            )
        )
        return Explanation(float(shares[-1]), contributions)

    def raw_score(self, vector: Sequence[float]) -> float:
        """The trees' raw score (log-odds) of ``vector``, computed directly (for checks)."""
        row = _float32_row(vector)
        return float(self._booster.predict(row, raw_score=True, num_threads=1)[0])


def _float32_row(vector: Sequence[float]) -> np.ndarray:
    """One float64 row of ``vector``'s float32 values: the scorer receives float32, so the
    trees must see the very same values."""
    return np.asarray([vector], dtype=np.float32).astype(np.float64)
