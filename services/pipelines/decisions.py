"""Reading the decision log: decisions joined with their latest outcome, export, tail, compaction.

The sink (``services.decisionlog``) writes what the event log carried, at least once per
event; ``services.decisionlog.reader`` reads it exactly once per event, keeps one decision per
transaction (its first: the number of dropped retries is reported) and gives each its
transaction's latest outcome. An outcome may arrive before its decision; the join does not
care about order.

``fraudmesh decisions export`` and ``tail`` use this module, and training reads decisions
with their labels through ``joined``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from services.common import filecommit
from services.decisionlog import layout, reader, writer
from services.decisionlog.reader import feature_orders, latest_outcomes, read_table
from services.decisionlog.rows import RecentIds

log = logging.getLogger(__name__)

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

FEATURE_PREFIX = "f_"
"""Prefix of the one-column-per-feature columns of a wide export."""


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


def widen(table: pa.Table) -> pa.Table:
    """Adds one float column per feature (``f_<name>``) for rows whose feature order is
    known; other rows get nulls there."""
    orders = feature_orders(table)
    schemas = table.column("feature_schema").to_numpy(zero_copy_only=False)
    features = table.column("features").to_pylist()
    columns: dict[str, np.ndarray] = {}
    for schema_id, names in orders.items():
        rows = np.flatnonzero(schemas == schema_id)
        rows = np.array([r for r in rows if len(features[r] or ()) == len(names)], dtype=int)
        if not len(rows):
            continue
        matrix = np.asarray([features[r] for r in rows], dtype=np.float32)
        for j, name in enumerate(names):
            column = columns.setdefault(
                FEATURE_PREFIX + name, np.full(table.num_rows, np.nan, dtype=np.float32)
            )
            column[rows] = matrix[:, j]
    for name, values in columns.items():
        table = table.append_column(
            pa.field(name, pa.float32()), pa.array(values, mask=np.isnan(values))
        )
    return table


def export(
    root: Path,
    out: Path,
    since: datetime | None = None,
    until: datetime | None = None,
    wide: bool = False,
) -> ExportSummary:
    """Writes the joined decisions to ``out`` (Parquet, atomically); returns the summary."""
    table, summary = joined(root, since, until)
    if wide:
        table = widen(table)
    orders = feature_orders(table)
    metadata = {
        b"fraudmesh.feature_orders": json.dumps({k: list(v) for k, v in orders.items()}).encode()
    }
    table = table.replace_schema_metadata(metadata)
    out.parent.mkdir(parents=True, exist_ok=True)
    with filecommit.replacing(out) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return ExportSummary(**{**summary.__dict__, "path": out})


# -- tail -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Landed:
    """One event as it landed in the decision log."""

    kind: layout.Kind
    row: dict[str, object]
    flush: int


class PartWatcher:
    """Finds the parts that appeared since it last looked, listing only day folders that
    changed."""

    def __init__(self, root: Path, recent_s: float = 5.0) -> None:
        self.root = root
        self.recent_s = recent_s
        self._seen: set[Path] = set()
        self._mtimes: dict[Path, int] = {}

    def _changed(self, path: Path) -> bool:
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return False
        before = self._mtimes.get(path)
        self._mtimes[path] = mtime
        # A folder changed within the last few seconds is listed again: a file created in
        # the same timestamp tick as the last listing leaves the mtime as it was.
        return before != mtime or time.time_ns() - mtime < self.recent_s * 1e9

    def new_parts(self) -> list[tuple[int, layout.Kind, Path]]:
        """Parts not returned before, by flush number."""
        found: list[tuple[int, layout.Kind, Path]] = []
        for kind in layout.KINDS:
            for _, day_dir in layout.day_dirs(self.root, kind):
                if not self._changed(day_dir):
                    continue
                for part in layout.parts(day_dir):
                    covered = layout.parse_part(part.name)
                    if part not in self._seen and covered is not None:
                        self._seen.add(part)
                        found.append((covered[1], kind, part))
        return sorted(found)


def _rows(kind: layout.Kind, path: Path, flush: int) -> list[Landed]:
    try:
        table = pq.read_table(path)
    except FileNotFoundError:  # compacted away meanwhile
        return []
    return [Landed(kind, row, flush) for row in table.to_pylist()]


def follow(
    root: Path,
    last: int = 10,
    interval_s: float = 0.5,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[Landed]:
    """The ``last`` events already in the log, then every event as its part lands, until
    ``stop()`` is true. Events appear once their part is written (the sink's flush
    interval: under 5 s after the decision by default)."""
    watcher = PartWatcher(root)
    existing = watcher.new_parts()
    backlog: list[Landed] = []
    for flush, kind, path in reversed(existing):
        if len(backlog) >= last:
            break
        backlog = _rows(kind, path, flush) + backlog
    # A compaction rewrites events already shown into a new part: show each event once.
    shown = RecentIds(1_000_000)
    for landed in backlog[-last:] if last > 0 else []:
        shown.add(str(landed.row["event_id"]))
        yield landed
    while not stop():
        for flush, kind, path in watcher.new_parts():
            for landed in _rows(kind, path, flush):
                event_id = str(landed.row["event_id"])
                if event_id in shown:
                    continue
                shown.add(event_id)
                yield landed
        time.sleep(interval_s)


# -- compaction -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactSummary:
    """What a compaction did."""

    days: int
    parts_before: int
    parts_after: int
    rows: int
    duplicates: int


def compact(root: Path, before: date, compression: str = "zstd") -> CompactSummary:
    """Merges the parts of each day partition older than ``before`` into one, dropping
    duplicate events. Safe beside a running sink: parts the sink's journal names (its last
    flush, maybe not committed yet) are left alone, and the inputs are deleted only after
    the merged part is durable; a crash in between leaves duplicates readers drop, and the
    next compaction merges again."""
    entry = writer.Journal(root).read()
    keep = {root / p for p in entry.parts} if entry is not None else set()
    days = before_count = after_count = rows = duplicates = 0
    for kind in layout.KINDS:
        for day, day_dir in layout.day_dirs(root, kind):
            if day >= before:
                break
            inputs = [p for p in layout.parts(day_dir) if p not in keep]
            if len(inputs) < 2:
                continue
            covered = [layout.parse_part(p.name) for p in inputs]
            first = min(c[0] for c in covered if c is not None)
            last = max(c[1] for c in covered if c is not None)
            table = pads.dataset(
                [str(p) for p in inputs], schema=layout.SCHEMAS[kind], format="parquet"
            ).to_table()
            ids = table.column("event_id").to_numpy(zero_copy_only=False)
            _, firsts = np.unique(ids, return_index=True)
            merged = table.take(pa.array(np.sort(firsts)))
            final = day_dir / layout.compacted_name(first, last)
            writer.write_part(merged, final, compression, replace=final in inputs)
            for part in inputs:
                if part != final:
                    with contextlib.suppress(FileNotFoundError):
                        part.unlink()
            filecommit.fsync_dir(day_dir)
            days += 1
            before_count += len(inputs)
            after_count += 1
            rows += merged.num_rows
            duplicates += table.num_rows - merged.num_rows
    return CompactSummary(days, before_count, after_count, rows, duplicates)
