"""Importing a transaction history: read it in batches, check every row, publish a dataset.

``import_transactions`` reads a CSV or Parquet file in the documented schema (``SCHEMA``;
``--map`` renames columns), batch by batch, so the file itself may be larger than memory.
Each row is checked with the rules serving applies (``domain.validation``: ids;
``domain.money``: currencies) and normalized: amounts to minor units of their currency,
timestamps to UTC microseconds, labels to booleans, optional columns to their defaults.
Rows that fail a check are counted by reason, with the positions of the first ones (CSV:
line numbers, the header being line 1; Parquet: row numbers from 1); more than
``max_bad_rows`` of them fail the import (``ImportRejected``) and change nothing. So does
a file that cannot be read as it claims to be (``reading``: missing, empty, not UTF-8,
truncated or corrupt) or lacks a required column (``schema``): the error is one line naming
the file and, where known, the line, row, column or option.

The accepted rows (in memory as columns, about 200 bytes a row) then become a dataset with
``pipelines.dataset`` (the aggregation serving's live updater runs per event), written
into a new folder and published by one atomic rename: the previous dataset stays in use
until the new one is complete. The caller then registers it with Feast and materializes
the newest features into the online store (``cli.data`` does both).

The work is split by job: ``schema`` (what is accepted, options, results, errors),
``reading`` (files to batches), ``rows`` (checks and normalization of a batch) and this
module (the steps in order, and publishing).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from services.featurestore import layout
from services.pipelines import dataset
from services.pipelines.dataimport import rows
from services.pipelines.dataimport.reading import Source, open_source
from services.pipelines.dataimport.schema import (
    BATCH_BYTES,
    BATCH_ROWS,
    DEFAULT_CHANNEL,
    DEFAULT_CURRENCY,
    EXAMPLES,
    REQUIRED,
    SCHEMA,
    BadRows,
    Format,
    ImportOptions,
    ImportRejected,
    ImportResult,
    Progress,
    guess_format,
    parse_mapping,
    resolve_columns,
    shown,
)

__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "DEFAULT_CHANNEL",
    "DEFAULT_CURRENCY",
    "EXAMPLES",
    "REQUIRED",
    "SCHEMA",
    "BadRows",
    "Format",
    "ImportOptions",
    "ImportRejected",
    "ImportResult",
    "Progress",
    "guess_format",
    "import_transactions",
    "parse_mapping",
]

_ACCEPTED = ".accepted.parquet"


def import_transactions(
    path: Path,
    data_dir: Path,
    options: ImportOptions | None = None,
    progress: Progress | None = None,
) -> ImportResult:
    """Reads, checks and publishes ``path`` as the dataset in ``data_dir`` (see the module).

    Raises ImportRejected (nothing changed) when the file cannot be read as it claims to be,
    a required column is missing or more than ``max_bad_rows`` rows fail their checks;
    OSError when the dataset cannot be written (nothing changed either).
    """
    options = options or ImportOptions()
    report = progress or (lambda step, done, total: None)
    source = open_source(path, options)
    columns = resolve_columns(path, source.names, options.mapping)
    _check_destination(data_dir)
    seconds: dict[str, float] = {}
    with _created_folders_removed_on_failure(data_dir), dataset.staging(data_dir) as folder:
        started = time.perf_counter()
        rows_read, bad = _read_accepted(path, source, columns, folder / _ACCEPTED, report)
        seconds["read"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        tx = _checked(path, folder / _ACCEPTED, rows_read, bad, options, source.unit)
        seconds["check"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        dataset.write_table(
            pa.Table.from_pandas(tx, preserve_index=False), folder / layout.TRANSACTIONS_FILE
        )
        dataset.write_feature_tables(
            tx,
            folder,
            options.label_delay,
            lambda done, total: report("features", done, total),
        )
        seconds["features"] = round(time.perf_counter() - started, 3)
        _write_manifest(folder, path, tx, rows_read, bad, columns, options, seconds)
    present = set(columns) | {"amount", "amount_minor"}
    used = set(columns.values())
    first, last = tx["timestamp"].iloc[0], tx["timestamp"].iloc[-1]
    return ImportResult(
        source=path,
        rows_read=rows_read,
        rows_imported=len(tx),
        frauds=int(tx["is_fraud"].sum()),
        bad_rows=bad,
        position_unit=source.unit,
        columns=columns,
        defaulted=[name for name in SCHEMA if name not in present],
        ignored=[name for name in source.names if name not in used],
        first=first.to_pydatetime(),
        last=last.to_pydatetime(),
        data_dir=data_dir,
        version_dir=data_dir.resolve(),
        seconds=seconds,
    )


def _check_destination(data_dir: Path) -> None:
    """Rejects a ``data_dir`` that cannot be a dataset folder, before anything is read."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ImportRejected(f"cannot publish the dataset as {shown(data_dir)}: it is a file")
    for folder in data_dir.parents:
        if folder.exists():
            if not folder.is_dir():
                raise ImportRejected(
                    f"cannot publish the dataset in {shown(data_dir)}: "
                    f"{shown(folder)} is a file, not a folder"
                )
            return


@contextlib.contextmanager
def _created_folders_removed_on_failure(data_dir: Path) -> Iterator[None]:
    """On failure, removes the (empty) folders publishing ``data_dir`` created on its way."""
    versions = dataset.versions_dir(data_dir)
    created = [folder for folder in (versions, *versions.parents) if not folder.exists()]
    try:
        yield
    except BaseException:
        for folder in created:  # the deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _read_accepted(
    path: Path, source: Source, columns: Mapping[str, str], out: Path, report: Progress
) -> tuple[int, BadRows]:
    """Reads and checks every batch; the accepted rows go to ``out`` (Parquet) with their
    positions. Returns the rows read and the rejected rows."""
    produced = {*REQUIRED, "amount_minor", "currency", "channel", *columns}
    schema = pa.schema(
        [(name, kind) for name, kind in rows.ARROW_TYPES.items() if name in produced]
        + [(rows.ROW, pa.int64())]
    )
    bad = BadRows()
    rows_read = 0
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        for batch, positions in source.batches(columns, report):
            if not len(positions):
                continue
            rows_read += len(positions)
            try:
                accepted, reasons = rows.normalize(batch, columns)
            except pa.ArrowException as error:
                where = f"{source.unit}s {positions[0]:,} to {positions[-1]:,}"
                raise ImportRejected(
                    f"{shown(path)} {where}: a column cannot be read as text, numbers or "
                    f"times ({str(error).splitlines()[0]})"
                ) from error
            bad.add(reasons, positions)
            accepted[rows.ROW] = positions[pd.isna(reasons)]
            writer.write_table(pa.Table.from_pandas(accepted, schema, preserve_index=False))
    if rows_read == 0:
        raise ImportRejected(f"{shown(path)} holds column names but no rows")
    return rows_read, bad


def _checked(
    path: Path,
    accepted: Path,
    rows_read: int,
    bad: BadRows,
    options: ImportOptions,
    unit: str,
) -> pd.DataFrame:
    """The accepted rows without repeated transaction ids, in time order; raises
    ImportRejected when more than ``max_bad_rows`` rows failed, or none passed."""
    tx = pq.read_table(accepted).to_pandas()
    accepted.unlink()
    for name in rows.CODES:
        if name in tx.columns:
            tx[name] = tx[name].astype("Int64")
    duplicate = tx["transaction_id"].duplicated(keep="first").to_numpy()
    duplicates = rows.Reasons(len(tx))
    duplicates.flag(duplicate, "duplicate transaction_id")
    bad.add(duplicates.values, tx[rows.ROW].to_numpy())
    if bad.total > options.max_bad_rows:
        raise ImportRejected(
            f"{bad.total:,} of {rows_read:,} rows of {shown(path)} fail their checks "
            f"(--max-bad-rows {options.max_bad_rows:,}); nothing was imported",
            bad,
            unit,
        )
    if duplicate.any():
        tx = tx[~duplicate]
    tx = tx.sort_values("timestamp", kind="stable").drop(columns=[rows.ROW])
    tx = tx.reset_index(drop=True)
    if len(tx) == 0:
        raise ImportRejected(
            f"no row of {shown(path)} passes its checks; nothing was imported", bad, unit
        )
    return tx


def _write_manifest(
    folder: Path,
    path: Path,
    tx: pd.DataFrame,
    rows_read: int,
    bad: BadRows,
    columns: Mapping[str, str],
    options: ImportOptions,
    seconds: Mapping[str, float],
) -> None:
    """What was imported, from where and how: the dataset's ``manifest.json``."""
    manifest = {
        "source": path.name,
        "imported_at": datetime.now(UTC).isoformat(),
        "rows_read": rows_read,
        "rows": len(tx),
        "frauds": int(tx["is_fraud"].sum()),
        "bad_rows": bad.counts,
        "columns": dict(columns),
        "label_delay_days": options.label_delay / timedelta(days=1),
        "first": tx["timestamp"].iloc[0].isoformat(),
        "last": tx["timestamp"].iloc[-1].isoformat(),
        "seconds": dict(seconds),
    }
    (folder / layout.MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
