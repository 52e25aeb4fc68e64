"""Importing a transaction history: read it in batches, check every row, publish a dataset.

``import_transactions`` reads a CSV or Parquet file in the documented schema (``SCHEMA``;
``--map`` renames columns), batch by batch, so the file itself may be larger than memory.
Each row is checked with the rules serving applies (``domain.validation``: ids;
``domain.money``: currencies) and normalized: amounts to minor units of their currency,
timestamps to UTC microseconds, labels to booleans, optional columns to their defaults.
Rows that fail a check are counted by reason, with the positions of the first ones (CSV:
line numbers, the header being line 1; Parquet: row numbers from 1); more than
``max_bad_rows`` of them fail the import (``ImportRejected``) and change nothing.

The accepted rows (in memory as columns, about 200 bytes a row) then become a dataset with
``pipelines.dataset`` (the aggregation serving's live updater runs per event), written
into a new folder and published by one atomic rename: the previous dataset stays in use
until the new one is complete. The caller then registers it with Feast and materializes
the newest features into the online store (``cli.data`` does both).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Literal, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from services.domain import aggregation, featurespec, money
from services.domain.validation import id_problem
from services.featurestore import layout
from services.pipelines import dataset

Format = Literal["csv", "parquet"]

SCHEMA: dict[str, str] = {
    "transaction_id": "required; string or integer, unique",
    "timestamp": "required; ISO 8601 with a zone (naive = UTC) or epoch seconds",
    "card_id": "required; the paying card",
    "merchant_id": "required; the accepting merchant",
    "amount": "required unless amount_minor is given; decimal, major units of the currency",
    "amount_minor": "required unless amount is given; integer, minor units (cents)",
    "is_fraud": "required; 0/1 or true/false",
    "currency": "optional; ISO 4217 code (default EUR)",
    "channel": "optional; card_present (default) or card_not_present",
    "terminal_id": "optional; the terminal, unique across merchants (default: none)",
    "fraud_reported_at": "optional; when the label became known (default timestamp + delay)",
    "card_home_country": "optional; ISO 3166 numeric (default unknown)",
    "merchant_country": "optional; ISO 3166 numeric (default unknown)",
    "merchant_category": "optional; MCC (default unknown)",
    "fraud_scenario": "optional; what produced a fraud, reported as recall per scenario",
}
"""The import schema: column → what it holds (the README and ``--help`` show it)."""

REQUIRED = ("transaction_id", "timestamp", "card_id", "merchant_id", "is_fraud")
"""Columns every import needs, besides ``amount`` or ``amount_minor``."""
DEFAULT_CURRENCY = "EUR"
"""Currency of rows without one."""
DEFAULT_CHANNEL = featurespec.CARD_PRESENT
"""Channel of rows without one: what serving assumes for an unspecified channel."""
EXAMPLES = 5
"""Positions listed per reason of rejection."""
BATCH_BYTES = 16 << 20
"""CSV block read at a time."""
BATCH_ROWS = 250_000
"""Parquet rows read at a time."""

_CODES = ("card_home_country", "merchant_country", "merchant_category")
_MAX_CODE = 9_999
# A zone after the time of day: Z, ±HH, ±HHMM or ±HH:MM.
_ZONE = r"[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"
# Plausible epoch seconds: 1970 up to 2200. Milliseconds would be far beyond it.
_MAX_EPOCH_S = 7_258_118_400
_STRING = pa.string()
_TIME = pa.timestamp("us", tz="UTC")
_ARROW_TYPES: dict[str, pa.DataType] = {
    "transaction_id": _STRING,
    "timestamp": _TIME,
    "card_id": _STRING,
    "merchant_id": _STRING,
    "amount_minor": pa.int64(),
    "currency": _STRING,
    "channel": _STRING,
    "is_fraud": pa.bool_(),
    "fraud_reported_at": _TIME,
    "terminal_id": _STRING,
    **dict.fromkeys(_CODES, pa.int64()),
    "fraud_scenario": _STRING,
}
_ROW = "__row"

Progress = Callable[[str, int, int], None]
"""Called with (step, done, total); steps: ``read`` (bytes or rows), ``features`` (tables)."""


class ImportRejected(Exception):
    """The file cannot be imported as it is: nothing was changed. The message says why."""

    def __init__(self, message: str, bad_rows: BadRows | None = None, unit: str = "row") -> None:
        super().__init__(message)
        self.bad_rows = bad_rows
        self.unit = unit
        """What the positions in ``bad_rows`` count: CSV lines or rows."""


@dataclass
class BadRows:
    """Rejected rows by reason: how many, and the positions of the first ``EXAMPLES``."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Rejected rows in all."""
        return sum(self.counts.values())

    def add(self, reasons: np.ndarray, positions: np.ndarray) -> None:
        """Counts the rows whose reason is not None (``reasons`` and ``positions`` align)."""
        bad = pd.notna(reasons)
        if not bad.any():
            return
        for reason, where in pd.Series(positions[bad]).groupby(reasons[bad], sort=False):
            text = str(reason)
            self.counts[text] = self.counts.get(text, 0) + len(where)
            shown = self.examples.setdefault(text, [])
            shown.extend(int(p) for p in where.iloc[: max(0, EXAMPLES - len(shown))])

    def lines(self, unit: str) -> list[str]:
        """One line per reason, most frequent first: count, reason, first positions."""
        out = []
        for reason, count in sorted(self.counts.items(), key=lambda item: -item[1]):
            where = ", ".join(str(p) for p in self.examples[reason])
            more = ", …" if count > len(self.examples[reason]) else ""
            out.append(f"{count:,} × {reason} ({unit} {where}{more})")
        return out


@dataclass(frozen=True)
class ImportOptions:
    """How to read the file and how strict to be."""

    format: Format | None = None
    """csv or parquet; None guesses from the file name."""
    mapping: Mapping[str, str] = field(default_factory=dict)
    """Schema column → the file's column that holds it."""
    label_delay: timedelta = aggregation.LABEL_DELAY
    """Default time from a transaction to its label (when ``fraud_reported_at`` is absent)."""
    max_bad_rows: int = 0
    """Rejected rows tolerated (they are left out); one more fails the import."""
    batch_rows: int = BATCH_ROWS
    """Parquet rows per batch."""
    batch_bytes: int = BATCH_BYTES
    """CSV bytes per batch."""


@dataclass(frozen=True)
class ImportResult:
    """What an import read, kept and published."""

    source: Path
    rows_read: int
    rows_imported: int
    frauds: int
    bad_rows: BadRows
    position_unit: str
    columns: dict[str, str]
    """Schema column → the file's column it came from."""
    defaulted: list[str]
    """Optional schema columns the file lacks (their defaults were used)."""
    ignored: list[str]
    """The file's columns no schema column uses."""
    first: datetime
    last: datetime
    data_dir: Path
    version_dir: Path
    seconds: dict[str, float]


def parse_mapping(items: list[str]) -> dict[str, str]:
    """``TARGET=SOURCE`` items → {target: source}; raises ImportRejected on a bad item."""
    mapping: dict[str, str] = {}
    for item in items:
        target, sep, source = item.partition("=")
        target, source = target.strip(), source.strip()
        if not sep or not target or not source:
            raise ImportRejected(f"--map {item!r}: expected TARGET=SOURCE, e.g. card_id=customer")
        if target not in SCHEMA:
            raise ImportRejected(
                f"--map {item!r}: {target!r} is not a schema column ({', '.join(SCHEMA)})"
            )
        if target in mapping:
            raise ImportRejected(f"--map names {target!r} twice")
        mapping[target] = source
    return mapping


def guess_format(path: Path) -> Format:
    """csv or parquet from the file name (``.csv``, ``.csv.gz``, ``.parquet``, ``.pq``)."""
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz", ".csv.bz2", ".csv.zst")):
        return "csv"
    raise ImportRejected(f"cannot tell the format of {path.name}: give --format csv|parquet")


def import_transactions(
    path: Path,
    data_dir: Path,
    options: ImportOptions | None = None,
    progress: Progress | None = None,
) -> ImportResult:
    """Reads, checks and publishes ``path`` as the dataset in ``data_dir`` (see the module).

    Raises ImportRejected (nothing changed) when a required column is missing or more than
    ``max_bad_rows`` rows fail their checks.
    """
    options = options or ImportOptions()
    report = progress or (lambda step, done, total: None)
    if not path.is_file():
        raise ImportRejected(f"{path} is not a file")
    fmt = options.format or guess_format(path)
    source: _Source = _CsvSource(path, options) if fmt == "csv" else _ParquetSource(path, options)
    columns = _resolve(source.names, options.mapping)
    seconds: dict[str, float] = {}
    bad = BadRows()
    started = time.perf_counter()
    with dataset.staging(data_dir) as folder:
        raw_path = folder / ".accepted.parquet"
        produced = {*REQUIRED, "amount_minor", "currency", "channel", *columns}
        schema = pa.schema(
            [(name, kind) for name, kind in _ARROW_TYPES.items() if name in produced]
            + [(_ROW, pa.int64())]
        )
        rows_read = 0
        with pq.ParquetWriter(raw_path, schema, compression="zstd") as writer:
            for batch, positions in source.batches(columns, report):
                rows_read += len(positions)
                accepted, reasons = _normalize(batch, columns)
                bad.add(reasons, positions)
                ok = pd.isna(reasons)
                accepted[_ROW] = positions[ok]
                writer.write_table(pa.Table.from_pandas(accepted, schema, preserve_index=False))
        seconds["read"] = round(time.perf_counter() - started, 3)
        if rows_read == 0:
            raise ImportRejected(f"{path} holds no rows")

        started = time.perf_counter()
        tx = pq.read_table(raw_path).to_pandas()
        raw_path.unlink()
        for name in _CODES:
            if name in tx.columns:
                tx[name] = tx[name].astype("Int64")
        duplicate = tx["transaction_id"].duplicated(keep="first").to_numpy()
        duplicates = _Reasons(len(tx))
        duplicates.flag(duplicate, "duplicate transaction_id")
        bad.add(duplicates.values, tx[_ROW].to_numpy())
        if bad.total > options.max_bad_rows:
            raise ImportRejected(
                f"{bad.total:,} of {rows_read:,} rows fail their checks "
                f"(--max-bad-rows {options.max_bad_rows:,}); nothing was imported",
                bad,
                source.unit,
            )
        if duplicate.any():
            tx = tx[~duplicate]
        tx = tx.sort_values("timestamp", kind="stable").drop(columns=[_ROW])
        tx = tx.reset_index(drop=True)
        if len(tx) == 0:
            raise ImportRejected(
                f"no row of {path} passes its checks; nothing was imported", bad, source.unit
            )
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
        first, last = tx["timestamp"].iloc[0], tx["timestamp"].iloc[-1]
        manifest = {
            "source": path.name,
            "imported_at": datetime.now(UTC).isoformat(),
            "rows_read": rows_read,
            "rows": len(tx),
            "frauds": int(tx["is_fraud"].sum()),
            "bad_rows": bad.counts,
            "columns": columns,
            "label_delay_days": options.label_delay / timedelta(days=1),
            "first": first.isoformat(),
            "last": last.isoformat(),
            "seconds": seconds,
        }
        (folder / layout.MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    version = data_dir.resolve()
    present = set(columns) | {"amount", "amount_minor"}
    used = set(columns.values())
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
        version_dir=version,
        seconds=seconds,
    )


# --- columns -----------------------------------------------------------------------------


def _resolve(names: list[str], mapping: Mapping[str, str]) -> dict[str, str]:
    """Schema column → source column, from the mapping and same-named columns."""
    present = set(names)
    missing_sources = sorted({s for s in mapping.values() if s not in present})
    if missing_sources:
        raise ImportRejected(
            f"--map names column(s) {missing_sources} that the file lacks; it has: "
            + ", ".join(names)
        )
    columns = dict(mapping)
    for name in SCHEMA:
        if name not in columns and name in present:
            columns[name] = name
    lacking = [name for name in REQUIRED if name not in columns]
    if "amount" not in columns and "amount_minor" not in columns:
        lacking.append("amount or amount_minor")
    if lacking:
        raise ImportRejected(
            f"the file lacks required column(s): {', '.join(lacking)}; it has: "
            + ", ".join(names)
            + ". Rename with --map TARGET=SOURCE (e.g. --map card_id=customer_ref)"
        )
    if "amount" in columns and "amount_minor" in columns:
        del columns["amount"]  # the exact one wins
    return columns


Batches = Iterator[tuple[dict[str, pa.Array], np.ndarray]]
"""{schema column: array} per batch, with each row's position in the file."""


class _Source(Protocol):
    """A file read batch by batch."""

    unit: str
    """What a position counts: CSV lines or Parquet rows."""
    names: list[str]
    """The file's columns."""

    def batches(self, columns: Mapping[str, str], report: Progress) -> Batches:
        """The schema columns of every batch (``columns``: schema column → file column)."""
        ...


class _Counting(io.RawIOBase):
    """A read-only file that counts the bytes read (progress through a CSV file)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.done = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        self.done += len(data)
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}


class _CsvSource:
    """CSV through Arrow's streaming reader, every column read as text."""

    unit = "line"

    def __init__(self, path: Path, options: ImportOptions) -> None:
        self._path = path
        self._options = options
        with self._open(None, []) as (reader, _):
            self.names = list(reader.schema.names)

    @contextlib.contextmanager
    def _open(
        self, types: Mapping[str, pa.DataType] | None, skipped: list[int]
    ) -> Iterator[tuple[pacsv.CSVStreamingReader, _Counting]]:
        """A streaming reader (text columns ``types``, or inferred) and its byte counter;
        malformed lines are skipped and their numbers appended to ``skipped``."""

        def invalid(row: pacsv.InvalidRow) -> str:
            skipped.append(int(row.number) if row.number is not None else -1)
            return "skip"

        counting = _Counting(self._path.open("rb"))
        try:
            stream: object = counting
            compression = _COMPRESSION.get(self._path.suffix.lower())
            if compression:
                stream = pa.CompressedInputStream(pa.PythonFile(counting, mode="r"), compression)
            reader = pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(
                    block_size=self._options.batch_bytes, use_threads=False
                ),
                parse_options=pacsv.ParseOptions(invalid_row_handler=invalid),
                convert_options=pacsv.ConvertOptions(
                    column_types=dict(types or {}),
                    include_columns=list(types) if types else None,
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=True,
                ),
            )
            yield reader, counting
        finally:
            counting.close()

    def batches(self, columns: Mapping[str, str], report: Progress) -> Batches:
        """Every batch; raises ImportRejected at the end if lines were malformed."""
        sources = sorted(set(columns.values()))
        total = max(self._path.stat().st_size, 1)
        skipped: list[int] = []
        parsed = 0
        with self._open(dict.fromkeys(sources, _STRING), skipped) as (reader, counting):
            report("read", 0, total)
            for record_batch in reader:
                n = record_batch.num_rows
                positions = _csv_lines(np.arange(parsed + 1, parsed + n + 1), skipped)
                parsed += n
                yield {t: record_batch.column(s) for t, s in columns.items()}, positions
                report("read", min(counting.done, total), total)
            report("read", total, total)
        if skipped:
            raise ImportRejected(
                f"{len(skipped):,} malformed CSV line(s) (wrong number of fields), e.g. line(s) "
                + ", ".join(str(line) for line in skipped[:EXAMPLES])
                + "; fix the file (nothing was imported)"
            )


def _csv_lines(rows: np.ndarray, skipped: list[int]) -> np.ndarray:
    """Line numbers of parsed data rows 1, 2, … given the malformed lines skipped so far.

    The header is line 1. ``s_j - j`` (j from 1) is how many good lines precede skipped line
    ``s_j``; a row is preceded by the skipped lines with fewer good lines before them.
    """
    if not skipped:
        return rows + 1
    marks = np.array(sorted(skipped), dtype=np.int64) - np.arange(1, len(skipped) + 1)
    return rows + 1 + np.searchsorted(marks, rows + 1, side="left")


class _ParquetSource:
    """Parquet through ``ParquetFile.iter_batches``."""

    unit = "row"

    def __init__(self, path: Path, options: ImportOptions) -> None:
        self._file = pq.ParquetFile(path)
        self._options = options
        self.names = list(self._file.schema_arrow.names)

    def batches(self, columns: Mapping[str, str], report: Progress) -> Batches:
        """Every batch of ``batch_rows`` rows."""
        sources = sorted(set(columns.values()))
        total = max(self._file.metadata.num_rows, 1)
        done = 0
        report("read", 0, total)
        for record_batch in self._file.iter_batches(
            batch_size=self._options.batch_rows, columns=sources
        ):
            n = record_batch.num_rows
            positions = np.arange(done + 1, done + n + 1)
            done += n
            yield {t: record_batch.column(s) for t, s in columns.items()}, positions
            report("read", min(done, total), total)
        report("read", total, total)


# --- one batch ------------------------------------------------------------------------------


class _Reasons:
    """The first reason each row of a batch fails for (None: the row is fine so far)."""

    def __init__(self, n: int) -> None:
        self.values = np.full(n, None, dtype=object)

    def flag(self, mask: np.ndarray, reason: str) -> None:
        self.values[mask & pd.isna(self.values)] = reason


def _normalize(
    batch: Mapping[str, pa.Array], columns: Mapping[str, str]
) -> tuple[pd.DataFrame, np.ndarray]:
    """One batch in the canonical raw schema (accepted rows only) and each row's reason."""
    n = len(next(iter(batch.values())))
    reasons = _Reasons(n)
    out: dict[str, np.ndarray | pd.api.extensions.ExtensionArray] = {}
    for name in ("transaction_id", "card_id", "merchant_id"):
        out[name] = _ids(batch[name], name, reasons, required=True)
    out["timestamp"] = _times(batch["timestamp"], "timestamp", reasons, required=True)

    currency = (
        _text(batch["currency"]) if "currency" in batch else pd.Series([None] * n, dtype=object)
    )
    currency = currency.where(currency.notna() & (currency != ""), DEFAULT_CURRENCY)
    known = {c: money.is_known(c) for c in pd.unique(currency)}
    reasons.flag(~currency.map(known).to_numpy(dtype=bool), "unknown currency")
    out["currency"] = currency.to_numpy(dtype=object)
    out["amount_minor"] = _amounts(batch, currency, reasons)

    if "channel" in batch:
        channel = _text(batch["channel"]).str.strip().str.lower()
        channel = channel.where(channel.notna() & (channel != ""), DEFAULT_CHANNEL)
        valid = channel.isin([featurespec.CARD_PRESENT, featurespec.CARD_NOT_PRESENT])
        reasons.flag(~valid.to_numpy(dtype=bool), "unknown channel")
        out["channel"] = channel.to_numpy(dtype=object)
    else:
        out["channel"] = np.full(n, DEFAULT_CHANNEL, dtype=object)
    out["is_fraud"] = _labels(batch["is_fraud"], reasons)
    if "fraud_reported_at" in batch:
        out["fraud_reported_at"] = _times(
            batch["fraud_reported_at"], "fraud_reported_at", reasons, required=False
        )
    if "terminal_id" in batch:
        out["terminal_id"] = _ids(batch["terminal_id"], "terminal_id", reasons, required=False)
    for name in _CODES:
        if name in batch:
            out[name] = _codes(batch[name], name, reasons)
    if "fraud_scenario" in batch:
        scenario = _text(batch["fraud_scenario"])
        out["fraud_scenario"] = scenario.where(scenario != "", None).to_numpy(dtype=object)
    ok = pd.isna(reasons.values)
    frame = pd.DataFrame({name: values[ok] for name, values in out.items()})
    return frame, reasons.values


def _text(array: pa.Array) -> pd.Series:
    """Any column as text (integers as their digits); nulls as None."""
    if not pa.types.is_string(array.type) and not pa.types.is_large_string(array.type):
        if pa.types.is_floating(array.type):
            # 12.0 → "12": float ids come from integer columns with nulls.
            as_int = pc.cast(array, pa.int64(), safe=False)
            exact = pc.equal(pc.cast(as_int, array.type), array)
            array = pc.if_else(exact, pc.cast(as_int, _STRING), pc.cast(array, _STRING))
        else:
            array = pc.cast(array, _STRING)
    return pd.Series(array.to_pandas(), dtype=object)


def _ids(array: pa.Array, name: str, reasons: _Reasons, *, required: bool) -> np.ndarray:
    """An id column checked with serving's rule (``validation.id_problem``)."""
    values = _text(array)
    missing = (values.isna() | (values == "")).to_numpy()
    if required:
        reasons.flag(missing, f"missing {name}")
    problems = {v: id_problem(v) for v in pd.unique(values[~missing])}
    found = values.map(problems)
    for problem in pd.unique(found.dropna()):
        reasons.flag((found == problem).to_numpy(), f"{name} {problem}")
    out = values.to_numpy(dtype=object)
    out[missing] = None
    return out


def _times(
    array: pa.Array, name: str, reasons: _Reasons, *, required: bool
) -> pd.api.extensions.ExtensionArray:
    """UTC timestamps (microseconds) from timestamps, dates, epoch seconds or ISO 8601 text."""
    n = len(array)
    micros = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    kind = array.type
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        # Zone-aware values are stored in UTC already; naive ones are taken as UTC.
        target = pa.timestamp("us", tz=kind.tz) if pa.types.is_timestamp(kind) else None
        cast = pc.cast(array, target or pa.timestamp("us"), safe=False)
        as_int = pc.cast(cast, pa.int64())
        valid = ~np.asarray(pc.is_null(as_int).to_numpy(zero_copy_only=False), dtype=bool)
        micros = np.asarray(pc.fill_null(as_int, 0).to_numpy(), dtype=np.int64)
        missing = ~valid
    else:
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            seconds = pd.Series(array.to_pandas(), dtype=np.float64)
            text = None
        else:
            text = _text(array).str.strip()
            seconds = pd.to_numeric(text, errors="coerce")
        missing = seconds.isna().to_numpy()
        if text is not None:
            missing = (text.isna() | (text == "")).to_numpy()
        numeric = seconds.notna().to_numpy()
        in_range = numeric & (seconds.abs() < _MAX_EPOCH_S).to_numpy()
        micros[in_range] = np.round(seconds.to_numpy()[in_range] * 1e6).astype(np.int64)
        valid |= in_range
        reasons.flag(numeric & ~in_range, f"{name} out of range (epoch seconds expected)")
        if text is not None:
            iso = ~numeric & ~missing
            if iso.any():
                # Zoned and naive text apart: in one call pandas reads a naive value after a
                # zoned one in that zone, where naive means UTC here.
                zoned = text.str.contains(_ZONE, regex=True, na=False).to_numpy()
                for group in (iso & zoned, iso & ~zoned):
                    if not group.any():
                        continue
                    parsed = pd.to_datetime(
                        text[group], format="ISO8601", utc=True, errors="coerce"
                    )
                    good = parsed.notna().to_numpy()
                    stamps = parsed[good].astype("datetime64[us, UTC]")
                    rows = np.flatnonzero(group)
                    micros[rows[good]] = stamps.array.asi8
                    valid[rows[good]] = True
    if required:
        reasons.flag(missing, f"missing {name}")
    reasons.flag(~valid & ~missing, f"unparseable {name}")
    values = pd.Series(pd.to_datetime(micros, unit="us", utc=True)).astype("datetime64[us, UTC]")
    return values.where(valid).array


def _amounts(batch: Mapping[str, pa.Array], currency: pd.Series, reasons: _Reasons) -> np.ndarray:
    """Amounts in minor units of each row's currency, whole and not negative."""
    if "amount_minor" in batch:
        column, name = batch["amount_minor"], "amount_minor"
        value = _numbers(column)
        scaled = value.to_numpy()
    else:
        column, name = batch["amount"], "amount"
        value = _numbers(column)
        scale = currency.map(money.minor_per_major).to_numpy(dtype=np.float64)
        # Major units to the nearest minor unit (12.345 EUR → 1235 cents, within rounding).
        scaled = np.round(value.to_numpy() * scale)
    missing = _absent(column)
    reasons.flag(missing, f"missing {name}")
    finite = np.isfinite(scaled)
    reasons.flag(~finite & ~missing, f"unparseable {name}")
    whole = finite & (np.floor(scaled) == scaled)
    reasons.flag(finite & ~whole, f"{name} is not a whole number of minor units")
    # Zero is an account verification (and a card tester's favourite): traffic, kept.
    reasons.flag(whole & (scaled < 0), f"negative {name}")
    reasons.flag(whole & (scaled >= 2.0**62), f"{name} too large")
    ok = whole & (scaled >= 0) & (scaled < 2.0**62)
    return np.where(ok, scaled, 0).astype(np.int64)


def _numbers(array: pa.Array) -> pd.Series:
    """Numbers (NaN where absent or not a number)."""
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        return pd.Series(array.to_pandas(), dtype=np.float64)
    if pa.types.is_decimal(array.type):
        return pd.Series(pc.cast(array, pa.float64()).to_pandas(), dtype=np.float64)
    return pd.to_numeric(_text(array).str.strip(), errors="coerce").astype(np.float64)


def _absent(array: pa.Array) -> np.ndarray:
    """Null or empty cells."""
    nulls = np.asarray(pc.is_null(array).to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_string(array.type):
        empty = np.asarray(
            pc.fill_null(pc.equal(pc.utf8_trim_whitespace(array), ""), False).to_numpy(
                zero_copy_only=False
            ),
            dtype=bool,
        )
        return nulls | empty
    return nulls


_TRUE = frozenset({"1", "true", "t", "yes", "y", "1.0"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "0.0"})


def _labels(array: pa.Array, reasons: _Reasons) -> np.ndarray:
    """is_fraud as booleans from 0/1 or true/false (any case)."""
    if pa.types.is_boolean(array.type):
        reasons.flag(_absent(array), "missing is_fraud")
        return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)
    text = _text(array).str.strip().str.lower()
    missing = (text.isna() | (text == "")).to_numpy()
    truth = text.isin(_TRUE).to_numpy()
    falsity = text.isin(_FALSE).to_numpy()
    reasons.flag(missing, "missing is_fraud")
    reasons.flag(~truth & ~falsity & ~missing, "is_fraud is not 0/1 or true/false")
    return truth


def _codes(array: pa.Array, name: str, reasons: _Reasons) -> pd.arrays.IntegerArray:
    """An optional numeric code (ISO 3166 numeric, MCC): whole, 0 to 9999; null where absent."""
    value = _numbers(array)
    missing = _absent(array)
    v = value.to_numpy()
    good = np.isfinite(v) & (np.floor(v) == v) & (v >= 0) & (v <= _MAX_CODE)
    reasons.flag(~good & ~missing, f"{name} is not a code from 0 to {_MAX_CODE}")
    return pd.arrays.IntegerArray(np.where(good, v, 0).astype(np.int64), ~good)
