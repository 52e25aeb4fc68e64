"""The payments a backtest replays from the decision log: each transaction's first decision
with its latest outcome (``joined``, what ``fraudmesh decisions export`` writes) and the
features it was decided on, by name. ``fraudmesh rules backtest`` and the console's backtest
page read them here; the imported history is read by ``services.pipelines.backtest``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from services.common.errors import FailedPrecondition
from services.decisionlog.joined import ExportSummary, joined
from services.decisionlog.reader import feature_orders
from services.domain.backtest import LoggedPayment


class BacktestSourceError(FailedPrecondition):
    """Nothing to replay: no decisions, no outcomes, or no history."""


def _features(names: tuple[str, ...] | None, values: list[float] | None) -> Mapping[str, float]:
    if not names or not values or len(names) != len(values):
        return {}
    return dict(zip(names, values, strict=True))


def _payments(table: pa.Table) -> list[LoggedPayment]:
    orders = feature_orders(table)
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
    table, summary = joined(root, since, until)
    if summary.decisions == 0:
        raise BacktestSourceError(f"the decision log at {root} holds no decision in the window")
    if summary.outcomes == 0:
        raise BacktestSourceError(
            f"the decision log at {root} holds no outcome: report outcomes "
            "(fraud.v1.OutcomeService) or backtest the imported history"
        )
    return _payments(table), summary
