"""Reading the decision log's tables: parts by day, events once, decisions once per
transaction, each transaction's latest outcome, and the feature order of each vector.

The sink writes what the event log carried, at least once per event. These functions make it
exact, the same way for every reader (the export and retraining in
``services.pipelines.decisions``, the console's review queue and lookup):

* events are deduplicated by ``event_id`` (a redelivered event, a part left twice by an
  interrupted compaction);
* decisions are deduplicated by ``transaction_id``: a client that retries Score for the same
  transaction gets a decision each time; the first (earliest ``decided_at``) is kept, since
  that is the one the payment went ahead on;
* a transaction's outcome is its *latest* report (greatest ``reported_at``, then
  ``received_at``, then arrival): a dispute later settled as fraud reads as fraud.

Reads are bounded by day partitions, columns and an optional row filter, so that a reader
that wants the last day or one transaction never loads the whole log. Nothing here imports
the transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from services.decisionlog import layout
from services.domain import featurespec
from services.eventlog import events


def part_files(
    root: Path, kind: layout.Kind, first: date | None = None, last: date | None = None
) -> list[Path]:
    """The finished parts of one table in the day partitions ``first``..``last`` (inclusive,
    None: unbounded), oldest day first and in flush order within a day."""
    files: list[Path] = []
    for day, day_dir in layout.day_dirs(root, kind):
        if (first is not None and day < first) or (last is not None and day > last):
            continue
        files += layout.parts(day_dir)
    return files


def read_parts(
    files: Sequence[Path],
    kind: layout.Kind,
    columns: Sequence[str] | None = None,
    where: pc.Expression | None = None,
) -> pa.Table:
    """The rows of ``files`` (parts of one table) in the table's schema, in file order;
    only ``columns`` (all when None) and only rows matching ``where``. A part written before
    a column was added reads that column as nulls."""
    schema = layout.SCHEMAS[kind]
    if not files:
        table = schema.empty_table()
        if where is not None:
            table = table.filter(where)
        return table.select(list(columns)) if columns is not None else table
    dataset = pads.dataset([str(f) for f in files], schema=schema, format="parquet")
    return dataset.to_table(columns=list(columns) if columns is not None else None, filter=where)


def read_table(
    root: Path,
    kind: layout.Kind,
    first_day: date | None = None,
    last_day: date | None = None,
    columns: Sequence[str] | None = None,
    where: pc.Expression | None = None,
) -> pa.Table:
    """Every row of one table in the day partitions ``first_day``..``last_day`` (inclusive),
    in the table's schema, in flush order; duplicates included."""
    return read_parts(part_files(root, kind, first_day, last_day), kind, columns, where)


def unique_events(table: pa.Table) -> pa.Table:
    """Each event of ``table`` once (its first row by ``event_id``), in the table's order."""
    ids = table.column("event_id").to_numpy(zero_copy_only=False)
    _, first = np.unique(ids, return_index=True)
    return table.take(pa.array(np.sort(first)))


def first_decisions(table: pa.Table) -> tuple[pa.Table, int, int]:
    """One decision per transaction (its first by ``decided_at``, else ``transaction_at``),
    in decision order; with the numbers of duplicate events and retried transactions dropped."""
    keys = pd.DataFrame(
        {
            "event_id": table.column("event_id").to_numpy(zero_copy_only=False),
            "transaction_id": table.column("transaction_id").to_numpy(zero_copy_only=False),
            "at": pc.coalesce(table.column("decided_at"), table.column("transaction_at"))
            .cast(pa.int64())
            .to_numpy(zero_copy_only=False),
        }
    )
    keys["row"] = np.arange(len(keys))
    unique = keys.drop_duplicates("event_id")
    duplicate_events = len(keys) - len(unique)
    ordered = unique.sort_values(["at", "row"], kind="stable", na_position="last")
    first_each = ordered.drop_duplicates("transaction_id")
    retried = len(ordered) - len(first_each)
    return table.take(pa.array(first_each["row"].to_numpy())), duplicate_events, retried


def latest_outcomes(outcomes: pa.Table) -> pd.DataFrame:
    """One row per transaction: its latest outcome (by reported_at, then received_at, then
    arrival), its source, who gave it and its times, and how many outcome reports it had.
    ``outcomes`` holds each event once (``unique_events``)."""
    frame = pd.DataFrame(
        {
            "transaction_id": outcomes.column("transaction_id").to_numpy(zero_copy_only=False),
            "outcome": outcomes.column("outcome").to_numpy(zero_copy_only=False),
            "outcome_source": outcomes.column("outcome_source").to_numpy(zero_copy_only=False),
            "outcome_reported_by": outcomes.column("reported_by").to_numpy(zero_copy_only=False),
            "outcome_reported_at": outcomes.column("reported_at")
            .cast(pa.int64())
            .to_numpy(zero_copy_only=False),
            "outcome_received_at": outcomes.column("received_at")
            .cast(pa.int64())
            .to_numpy(zero_copy_only=False),
        }
    )
    frame["arrival"] = np.arange(len(frame))
    frame = frame.sort_values(
        ["outcome_reported_at", "outcome_received_at", "arrival"],
        kind="stable",
        na_position="first",
    )
    counts = frame.groupby("transaction_id", sort=False).size().rename("outcome_reports")
    latest = frame.drop_duplicates("transaction_id", keep="last").set_index("transaction_id")
    return latest.drop(columns="arrival").join(counts)


def feature_orders(table: pa.Table) -> dict[str, tuple[str, ...]]:
    """Feature orders by schema fingerprint: the model's own, plus any the rows carry."""
    orders = {events.feature_schema_id(featurespec.MODEL_FEATURES): featurespec.MODEL_FEATURES}
    if "feature_names" in table.column_names:
        names = table.column("feature_names")
        schemas = table.column("feature_schema")
        for i in pc.indices_nonzero(pc.is_valid(names)).to_pylist():
            found = tuple(names[i].as_py())
            orders.setdefault(schemas[i].as_py() or events.feature_schema_id(found), found)
    return orders
