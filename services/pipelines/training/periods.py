"""The training, validation and test periods of a run, and the caveats they call for."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd

from services.domain.aggregation import LABEL_DELAY
from services.models import repository
from services.pipelines.training.params import TrainingDataError, TrainParams


@dataclass(frozen=True)
class Periods:
    """Explicit periods (UTC, ``until`` exclusive); a None bound takes the default."""

    train_from: datetime | None = None
    train_until: datetime | None = None
    test_from: datetime | None = None
    test_until: datetime | None = None


def _utc(value: datetime) -> pd.Timestamp:
    stamp = pd.Timestamp(value)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def training_window(
    timestamps: pd.Series,
    params: TrainParams,
    periods: Periods,
    label_horizon: datetime | None = None,
) -> repository.TrainingWindow:
    """The training, validation and test periods: the explicit bounds, defaults elsewhere.
    By default the data ends with its last day, or with the label horizon's day when that
    comes first (after it the labels are incomplete)."""
    first = timestamps.min().floor("D")
    data_end = timestamps.max().floor("D") + pd.Timedelta(days=1)
    if label_horizon is not None:
        data_end = min(data_end, _utc(label_horizon).floor("D"))
    train_from = (
        _utc(periods.train_from)
        if periods.train_from
        else first + pd.Timedelta(days=params.warmup_days)
    )
    test_until = _utc(periods.test_until) if periods.test_until else data_end
    if periods.test_from:
        test_from = _utc(periods.test_from)
    elif periods.train_until:
        test_from = _utc(periods.train_until)
    else:
        days = (data_end - train_from).days
        holdout_days = max(1, round(days * params.holdout_fraction))
        if days - holdout_days < 2:
            raise TrainingDataError(
                f"{days} days after the warm-up are too few to train, validate and test"
            )
        test_from = data_end - pd.Timedelta(days=holdout_days)
    train_until = _utc(periods.train_until) if periods.train_until else test_from
    if not train_from < train_until <= test_from < test_until:
        raise TrainingDataError(
            f"periods out of order: training {train_from:%Y-%m-%d} → {train_until:%Y-%m-%d}, "
            f"test {test_from:%Y-%m-%d} → {test_until:%Y-%m-%d} (need train-from < "
            "train-until <= test-from < test-until)"
        )
    span = train_until - train_from
    validation = max(pd.Timedelta(days=1), (span * params.validation_fraction).ceil("D"))
    if validation >= span:
        raise TrainingDataError(
            f"the training window {train_from:%Y-%m-%d} → {train_until:%Y-%m-%d} is too short "
            "to carve a validation period from its end: give it at least two days"
        )
    return repository.TrainingWindow(
        start=train_from.to_pydatetime(),
        end=test_until.to_pydatetime(),
        holdout_start=test_from.to_pydatetime(),
        train_end=train_until.to_pydatetime(),
        validation_start=(train_until - validation).to_pydatetime(),
    )


def period_strings(window: repository.TrainingWindow) -> dict[str, list[str]]:
    """Each period's [start, end) as ISO 8601 strings, for the report."""
    assert window.train_end is not None and window.validation_start is not None
    bounds = {
        "train": (window.start, window.validation_start),
        "validation": (window.validation_start, window.train_end),
        "test": (window.holdout_start, window.end),
    }
    return {name: [a.isoformat(), b.isoformat()] for name, (a, b) in bounds.items()}


def describe(window: repository.TrainingWindow, name: str) -> str:
    """The days of period ``name`` (training, validation or test), for a message."""
    period = {"training": "train", "validation": "validation", "test": "test"}[name]
    start, end = period_strings(window)[period]
    return f"{start[:10]} → {end[:10]}"


def period_notes(
    window: repository.TrainingWindow,
    first: pd.Timestamp,
    params: TrainParams,
    label_horizon: datetime | None = None,
    unlabelled: dict[str, int] | None = None,
) -> list[str]:
    """Caveats about the periods, for the report."""
    notes = []
    if label_horizon is not None and window.end > label_horizon:
        notes.append(
            f"The test period ends after the label horizon ({label_horizon:%Y-%m-%d %H:%M} "
            "UTC): after it only payments with a reported outcome are labelled, mostly frauds, "
            "so the test figures overstate fraud. Leave --test-until out to end at the horizon."
        )
    for period, count in (unlabelled or {}).items():
        if count:
            notes.append(
                f"{count:,} payment(s) in the {period} window have no label yet (younger than "
                "the label delay without an outcome, or disputed): they count in the features "
                "of later payments, not as rows."
            )
    assert window.train_end is not None
    gap = window.holdout_start - window.train_end
    if gap < LABEL_DELAY:
        notes.append(
            f"The training window ends {gap.days} day(s) before the test period, less than the "
            f"label delay ({LABEL_DELAY.days} days): in production the labels of the last "
            f"{LABEL_DELAY.days} days are not known when a model is trained, so these test "
            "figures may be slightly optimistic. Leave a gap (--train-until) to measure that."
        )
    history = window.start - first.to_pydatetime()
    if history < timedelta(days=params.warmup_days):
        notes.append(
            f"Training starts {history / timedelta(days=1):.1f} day(s) after the first "
            "transaction: the windows of its first rows (up to 30 days) hold little history."
        )
    return notes
