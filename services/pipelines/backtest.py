"""The payments a backtest replays: the decision log joined with outcomes, or the imported
history the store was built from (``services.domain.backtest`` does the replay).

From the decision log, each transaction's first decision with its latest outcome
(``decisions.joined``, what ``fraudmesh decisions export`` writes) and the features it was
decided on, by name. From the history, the labelled transactions training reads, each with
its point-in-time store features from Feast (``training.frame.training_frame``) and the
request-time features computed as serving computes them; a store value missing there stays
missing (a rule on it does not fire), where serving would have used the version's default.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain.backtest import FRAUD, LEGITIMATE, LoggedPayment
from services.featurestore.settings import FeatureStoreSettings
from services.pipelines import decisions
from services.pipelines.decisions import ExportSummary
from services.pipelines.training.params import TrainingDataError


class BacktestSourceError(FailedPrecondition):
    """Nothing to replay: no decisions, no outcomes, or no history."""


def _features(names: tuple[str, ...] | None, values: list[float] | None) -> Mapping[str, float]:
    if not names or not values or len(names) != len(values):
        return {}
    return dict(zip(names, values, strict=True))


def _payments(table: pa.Table) -> list[LoggedPayment]:
    orders = decisions.feature_orders(table)
    rows = table.select(
        [
            "transaction_id", "card_id", "merchant_id", "terminal_id", "amount_minor",
            "currency", "card_not_present", "features", "feature_schema", "outcome",
            "decision", "score", "scored_by", "model_version", "reasons", "shadow_rules",
        ]
    ).to_pylist()  # fmt: skip
    return [
        LoggedPayment(
            transaction_id=r["transaction_id"],
            card_id=r["card_id"] or "",
            merchant_id=r["merchant_id"] or "",
            terminal_id=r["terminal_id"] or "",
            amount_minor=int(r["amount_minor"] or 0),
            currency=r["currency"] or "",
            card_not_present=bool(r["card_not_present"]),
            features=_features(orders.get(r["feature_schema"] or ""), r["features"]),
            outcome=r["outcome"],
            decision=r["decision"] or "",
            score=r["score"],
            scored_by=r["scored_by"] or "",
            model_version=r["model_version"] or "",
            reasons=tuple(r["reasons"] or ()),
            shadow_rules=tuple(r["shadow_rules"] or ()),
        )
        for r in rows
    ]


def from_log(
    root: Path, since: datetime | None = None, until: datetime | None = None
) -> tuple[list[LoggedPayment], ExportSummary]:
    """Each decided transaction in the window with its latest outcome; raises
    ``BacktestSourceError`` when the log holds no decision or no outcome at all."""
    if not root.is_dir():
        raise BacktestSourceError(f"no decision log at {root}")
    table, summary = decisions.joined(root, since, until)
    if summary.decisions == 0:
        raise BacktestSourceError(f"the decision log at {root} holds no decision in the window")
    if summary.outcomes == 0:
        raise BacktestSourceError(
            f"the decision log at {root} holds no outcome: report outcomes "
            "(fraud.v1.OutcomeService) or backtest the imported history"
        )
    return _payments(table), summary


_NO_DEFAULTS: Mapping[str, float] = collections.defaultdict(lambda: math.nan)


def from_history(settings: FeatureStoreSettings) -> list[LoggedPayment]:
    """The imported transactions with their point-in-time features and labels; raises
    ``BacktestSourceError`` without a dataset, a registered feature service or labels."""
    # Feast is imported only for a backtest of the history.
    from services.pipelines.training.frame import training_frame

    try:
        frame = training_frame(settings)
    except TrainingDataError as error:
        raise BacktestSourceError(error.message) from error
    if "is_fraud" not in frame.columns:
        raise BacktestSourceError(f"the history in {settings.data_path} has no is_fraud labels")
    store_names = [n for n in featurespec.STORE_FEATURES if n in frame.columns]
    store = frame[store_names].to_dict("records")
    payments = []
    for i, row in enumerate(frame.itertuples(index=False)):
        values = featurespec.model_vector(
            store[i],
            amount_minor=int(row.amount_minor),
            currency=str(row.currency),
            timestamp_s=float(row.timestamp_s),
            card_not_present=bool(row.card_not_present),
            defaults=_NO_DEFAULTS,
            helpers=True,
        )
        terminal = getattr(row, "terminal_id", "")
        payments.append(
            LoggedPayment(
                transaction_id=str(row.transaction_id),
                card_id=str(row.card_id),
                merchant_id=str(row.merchant_id),
                terminal_id=terminal if isinstance(terminal, str) else "",
                amount_minor=int(row.amount_minor),
                currency=str(row.currency),
                card_not_present=bool(row.card_not_present),
                features=dict(zip(featurespec.SERVABLE_FEATURES, values, strict=False)),
                outcome=FRAUD if bool(row.is_fraud) else LEGITIMATE,
            )
        )
    return payments
