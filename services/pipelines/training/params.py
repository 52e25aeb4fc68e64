"""The knobs of a training run, its progress callback and the error for unusable data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.pipelines import evaluate

Progress = Callable[[str, int, int], None]
"""Called with (step, done, total); a step starts at done=0 and ends at done=total."""


class TrainingDataError(FailedPrecondition):
    """The data or the feature registry is missing or unusable; the message says what to run."""


@dataclass(frozen=True)
class TrainParams:
    """Knobs of a training run; recorded in the published metadata."""

    seed: int = 7
    max_trees: int = 1000
    """Most trees a candidate grows; early stopping usually ends it sooner."""
    early_stopping_rounds: int = 50
    """Trees without a better validation average precision before a candidate stops."""
    learning_rate: float = 0.05
    candidates: tuple[tuple[int, int], ...] = ((31, 10), (15, 5))
    """(num_leaves, min_child_samples) settings compared on the validation period. Small
    leaves: the frauds of a short window are a few hundred, and a rare pattern (a compromised
    terminal's few payments) needs a leaf of that size to be learnt at all."""
    fraud_weight: Literal["none", "sqrt"] = "none"
    """How the fraud class is weighted: ``none`` (each row once) or ``sqrt`` (up-weighted by
    the square root of the imbalance). Up-weighting cost average precision on every dataset
    measured (``docs/training.md``)."""
    refit: bool = True
    """Refit the selected setting on the whole training window (validation period included)
    with the selected number of trees, so that the published model has seen the latest
    labelled days; without it the model is the one grown on the days before validation."""
    warmup_days: int = 7
    holdout_fraction: float = 0.2
    validation_fraction: float = 0.15
    max_fit_rows: int = 250_000
    """Above this many training rows, genuine ones are sampled (every fraud kept) and
    weighted by the inverse of the sampling rate: the cost of a tree stops growing with the
    data while the model still sees the population's class balance."""
    max_validation_rows: int = 100_000
    """The same cap for the rows early stopping scores after every tree (thresholds use all)."""
    review_fpr: float = 0.01
    decline_fpr: float = 0.001
    card_precision_k: int = evaluate.CARD_PRECISION_K
    threads: int = 2
    added_features: tuple[str, ...] = ()
    """Servable features the version takes besides the default inputs, after them in this
    order (``featurespec.trained_order``; ``fraudmesh train --feature``). Every step follows
    the resulting order: the model, its small model, the reference and the gates."""

    optional_features: Literal["choose", "none"] = "choose"
    """``choose``: the selected setting is grown again with the optional features
    (``featurespec.OPTIONAL_FEATURES``, those not already added) after the inputs, and the
    version takes them when they raise the validation average precision by at least
    ``optional_gain`` of the inputs' own; ``none``: never. Which data they help depends on how
    long a compromised terminal stays compromised (``docs/training.md``)."""
    optional_gain: float = 0.01
    """The least relative gain in validation average precision that adds the optional
    features: a gain within the run-to-run spread of one setting leaves the inputs as they
    were."""

    def __post_init__(self) -> None:
        # An unknown or repeated name is refused before any data is read.
        featurespec.trained_order(self.added_features)

    @property
    def feature_order(self) -> tuple[str, ...]:
        """The version's inputs in order: the default inputs, then the added features."""
        return featurespec.trained_order(self.added_features)

    @property
    def optional(self) -> tuple[str, ...]:
        """The optional features the run compares (none unless ``optional_features`` is
        ``choose``): those not already added, in ``OPTIONAL_FEATURES`` order."""
        if self.optional_features == "none":
            return ()
        return tuple(n for n in featurespec.OPTIONAL_FEATURES if n not in self.added_features)

    def record(self) -> dict[str, str | int | float | bool]:
        """The params as metadata values (candidates and added features as text)."""
        values = asdict(self)
        values["candidates"] = " ".join(f"{leaves}/{child}" for leaves, child in self.candidates)
        values["added_features"] = " ".join(self.added_features)
        return values
