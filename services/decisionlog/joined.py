"""Decisions joined with their latest outcome, read from the decision log's files: what
``fraudmesh decisions export`` writes, what a backtest replays (``payments``) and what the
console's backtest page reads. Transport-free and Feast-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from services.decisionlog import layout, reader
from services.decisionlog.reader import latest_outcomes, read_table

LEADING_COLUMNS = (
    "transaction_id",
    "card_id",
    "merchant_id",
    "amount_minor",
    "currency",
    "decision",
    "score",
    "model_version",
    "scored_by",
    "feature_source",
    "decided_at",
    "outcome",
    "outcome_source",
    "outcome_reported_by",
    "outcome_reported_at",
    "outcome_received_at",
    "outcome_reports",
)
"""The export's first columns; every other decision column follows in the table's order."""

OUTCOME_COLUMNS = pa.schema(
    [
        pa.field("outcome", pa.string()),
        pa.field("outcome_source", pa.string()),
        pa.field("outcome_reported_by", pa.string()),
        pa.field("outcome_reported_at", layout.TIMESTAMP),
        pa.field("outcome_received_at", layout.TIMESTAMP),
        pa.field("outcome_reports", pa.int32()),
    ]
)
"""Columns the join adds to each decision (null and 0 reports without an outcome)."""


@dataclass(frozen=True)
class ExportSummary:
    """What an export read and wrote."""

    decisions: int
    """Decisions written (one per transaction)."""
    duplicate_events: int
    """Decision events dropped because their event_id was already read."""
    retried_transactions: int
    """Later decisions of a transaction already decided (retried Score calls), dropped."""
    with_outcome: int
    """Decisions that have an outcome."""
    outcomes: int
    """Distinct outcome events read (all of them, not only those of exported decisions)."""
    orphan_outcomes: int
    """Transactions with an outcome and no decision in the exported window."""
    path: Path | None = None
    """The file written."""


def _window(table: pa.Table, since: datetime | None, until: datetime | None) -> pa.Table:
    if since is None and until is None:
        return table
    at = pc.coalesce(table.column("decided_at"), table.column("transaction_at"))
    mask = pa.array(np.ones(table.num_rows, dtype=bool))
    if since is not None:
        mask = pc.and_(mask, pc.greater_equal(at, pa.scalar(_utc(since), layout.TIMESTAMP)))
    if until is not None:
        mask = pc.and_(mask, pc.less(at, pa.scalar(_utc(until), layout.TIMESTAMP)))
    return table.filter(pc.fill_null(mask, False))


def _utc(moment: datetime) -> int:
    return layout.utc_us(moment)


def read_decisions(
    root: Path, since: datetime | None = None, until: datetime | None = None
) -> tuple[pa.Table, int, int]:
    """Decisions with ``since <= decided_at < until``, one per transaction (its first), in
    decision order; with the numbers of duplicate events and retried transactions dropped."""
    first = since.date() if since is not None else None
    last = until.date() if until is not None else None
    return reader.first_decisions(_window(read_table(root, "decisions", first, last), since, until))


def read_outcomes(root: Path) -> pa.Table:
    """Every outcome event once (by event_id), in arrival order."""
    return reader.unique_events(read_table(root, "outcomes"))


def _outcome_arrays(transaction_ids: pa.ChunkedArray, latest: pd.DataFrame) -> list[pa.Array]:
    aligned = latest.reindex(transaction_ids.to_numpy(zero_copy_only=False))
    arrays = []
    for field in OUTCOME_COLUMNS:
        values = aligned[field.name]
        if field.name == "outcome_reports":
            arrays.append(pa.array(values.fillna(0).to_numpy(dtype=np.int32), field.type))
        elif pa.types.is_timestamp(field.type):
            mask = values.isna().to_numpy()
            ints = values.fillna(0).to_numpy(dtype=np.int64)
            arrays.append(pa.array(ints, pa.int64(), mask=mask).cast(field.type))
        else:
            arrays.append(pa.array(values.where(values.notna(), None).tolist(), field.type))
    return arrays


def joined(
    root: Path, since: datetime | None = None, until: datetime | None = None
) -> tuple[pa.Table, ExportSummary]:
    """Decisions in the window joined with their latest outcome (``LEADING_COLUMNS`` first)."""
    decisions, duplicate_events, retried = read_decisions(root, since, until)
    outcomes = read_outcomes(root)
    latest = latest_outcomes(outcomes)
    arrays = _outcome_arrays(decisions.column("transaction_id"), latest)
    table = decisions
    for field, array in zip(OUTCOME_COLUMNS, arrays, strict=True):
        table = table.append_column(field, array)
    rest = [name for name in table.column_names if name not in LEADING_COLUMNS]
    table = table.select([*LEADING_COLUMNS, *rest])
    decided = set(decisions.column("transaction_id").to_pylist())
    summary = ExportSummary(
        decisions=table.num_rows,
        duplicate_events=duplicate_events,
        retried_transactions=retried,
        with_outcome=int(pc.sum(pc.greater(table.column("outcome_reports"), 0)).as_py() or 0),
        outcomes=outcomes.num_rows,
        orphan_outcomes=sum(1 for t in latest.index if t not in decided),
    )
    return table, summary
