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
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from services.common import filecommit
from services.decisionlog import layout, writer
from services.decisionlog.joined import (
    ExportSummary,
    joined,
)
from services.decisionlog.reader import feature_orders
from services.decisionlog.rows import RecentIds

log = logging.getLogger(__name__)

FEATURE_PREFIX = "f_"
"""Prefix of the one-column-per-feature columns of a wide export."""


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
    duplicate events. Safe beside running sinks: parts a sink's journal names (its last
    flush, maybe not committed yet) are left alone, and the inputs are deleted only after
    the merged part is durable; a crash in between leaves duplicates readers drop, and the
    next compaction merges again."""
    keep = {root / p for entry in writer.Journal.every(root) for p in entry.parts}
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
