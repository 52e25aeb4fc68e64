"""Reading an import file batch by batch: CSV (plain, gzip, bz2 or zstd) and Parquet.

Every problem with the file itself becomes an ``ImportRejected`` with one line naming the
file and, where known, the line or row: a missing path, a directory or device, an unreadable
or empty file, text that is not UTF-8, compressed data that is truncated or corrupt, a zip
archive, a Parquet file read as CSV and the reverse, a truncated or corrupt Parquet file,
malformed CSV lines. Compression is told by the file's first bytes, not by its name.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from services.pipelines.dataimport.schema import (
    EXAMPLES,
    ImportOptions,
    ImportRejected,
    Progress,
    guess_format,
    shown,
)

Batches = Iterator[tuple[dict[str, pa.Array], np.ndarray]]
"""{schema column: array} per batch, with each row's position in the file."""

_STRING = pa.string()
_PARQUET_MAGIC = b"PAR1"
_COMPRESSION_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\x28\xb5\x2f\xfd": "zstd"}
_ZIP_MAGIC = b"PK\x03\x04"
_HEAD = 8
# Arrow names the line of a conversion or parse error "Row #N", counting the header as 1.
_ARROW_ROW = re.compile(r"^(?:In CSV column #\d+: )?(?:CSV parse error: )?Row #(\d+): ")
_EMPTY = "Empty CSV file"
_PARSE_ERROR = "CSV parse error: "


class Source(Protocol):
    """A file read batch by batch."""

    unit: str
    """What a position counts: CSV lines or Parquet rows."""
    names: list[str]
    """The file's columns."""

    def batches(self, columns: Mapping[str, str], report: Progress) -> Batches:
        """The schema columns of every batch (``columns``: schema column → file column)."""
        ...


def open_source(path: Path, options: ImportOptions) -> Source:
    """``path`` opened as ``options.format`` (None: told by its name), its columns known;
    raises ImportRejected (see the module)."""
    head = _head(path)
    if (options.format or guess_format(path)) == "parquet":
        return ParquetSource(path, head, options)
    if head.startswith(_PARQUET_MAGIC):
        raise ImportRejected(f"{shown(path)} is a Parquet file, not CSV: give --format parquet")
    if head.startswith(_ZIP_MAGIC):
        raise ImportRejected(
            f"{shown(path)} is a zip archive: extract the CSV from it "
            "(gzip, bz2 and zstd files are read as they are)"
        )
    return CsvSource(path, head, options)


def _head(path: Path) -> bytes:
    """The first bytes of a regular, readable, non-empty file."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ImportRejected(f"{shown(path)} does not exist") from None
    except OSError as error:
        raise ImportRejected(f"{shown(path)} cannot be read: {error.strerror}") from error
    if stat.S_ISDIR(info.st_mode):
        raise ImportRejected(f"{shown(path)} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise ImportRejected(f"{shown(path)} is not a regular file")
    if info.st_size == 0:
        raise ImportRejected(f"{shown(path)} is empty (0 bytes)")
    try:
        with path.open("rb") as file:
            return file.read(_HEAD)
    except OSError as error:
        raise ImportRejected(f"{shown(path)} cannot be read: {error.strerror}") from error


def _arrow_text(error: BaseException) -> str:
    """Arrow's message without the detail lines (they may quote the file's bytes)."""
    return str(error).strip().split("\n", 1)[0]


class _NotUtf8(Exception):
    """Bytes that are not UTF-8 text, on a known line."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


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


class _Utf8(io.RawIOBase):
    """The text on its way to the CSV parser, checked to be UTF-8; raises ``_NotUtf8`` with
    the line of the first bad byte (Arrow would only name a column, or quote the bytes)."""

    def __init__(self, source: pa.NativeFile | _Counting) -> None:
        self._source = source
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._line = 1

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._source.read(len(buffer))
        pending = len(self._decoder.getstate()[0])
        try:
            # ASCII needs no decoding (ids, times and numbers mostly are): checked in place.
            if pending or not data.isascii():
                self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            before = max(error.start - pending, 0)
            raise _NotUtf8(self._line + data.count(b"\n", 0, before)) from None
        self._line += data.count(b"\n")
        buffer[: len(data)] = data
        return len(data)


class CsvSource:
    """CSV through Arrow's streaming reader, every column read as text."""

    unit = "line"

    def __init__(self, path: Path, head: bytes, options: ImportOptions) -> None:
        self._path = path
        self._options = options
        self._compression = next(
            (name for magic, name in _COMPRESSION_MAGIC.items() if head.startswith(magic)), None
        )
        with self._rejecting(), self._open(None, []) as (reader, _):
            self.names = list(reader.schema.names)

    @contextlib.contextmanager
    def _rejecting(self) -> Iterator[None]:
        """Turns what reading raised into an ImportRejected naming the file and line."""
        name, compressed = shown(self._path), self._compression
        try:
            yield
        except _NotUtf8 as error:
            raise ImportRejected(
                f"{name} line {error.line}: not UTF-8 text; save the file as UTF-8"
            ) from None
        except (pa.ArrowException, OSError) as error:
            text = _arrow_text(error)
            row = _ARROW_ROW.match(text)
            if text.removeprefix(_PARSE_ERROR).startswith(_EMPTY):
                message = f"{name} holds no header line"
            elif compressed and text == "Truncated compressed stream":
                message = f"{name} ends early: its {compressed} data is truncated"
            elif compressed and ("inflate" in text or "decompress" in text.lower()):
                message = f"{name}: its {compressed} data is corrupt ({text})"
            elif row:
                message = f"{name} line {row.group(1)}: {text[row.end() :]}"
            elif isinstance(error, OSError) and error.strerror:
                message = f"{name} cannot be read: {error.strerror}"
            else:
                message = f"{name} cannot be read as CSV: {text}"
            raise ImportRejected(message) from error

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
            stream: pa.NativeFile | _Counting = counting
            if self._compression:
                stream = pa.CompressedInputStream(
                    pa.PythonFile(counting, mode="r"), self._compression
                )
            reader = pacsv.open_csv(
                _Utf8(stream),
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
        with self._rejecting(), self._open(dict.fromkeys(sources, _STRING), skipped) as opened:
            reader, counting = opened
            report("read", 0, total)
            for record_batch in reader:
                n = record_batch.num_rows
                positions = csv_lines(np.arange(parsed + 1, parsed + n + 1), skipped)
                parsed += n
                yield {t: record_batch.column(s) for t, s in columns.items()}, positions
                report("read", min(counting.done, total), total)
            report("read", total, total)
        if skipped:
            raise ImportRejected(
                f"{len(skipped):,} malformed CSV line(s) in {shown(self._path)} (wrong number "
                "of fields), e.g. line(s) "
                + ", ".join(str(line) for line in skipped[:EXAMPLES])
                + "; fix the file (nothing was imported)"
            )


def csv_lines(rows: np.ndarray, skipped: list[int]) -> np.ndarray:
    """Line numbers of parsed data rows 1, 2, … given the malformed lines skipped so far.

    The header is line 1. ``s_j - j`` (j from 1) is how many good lines precede skipped line
    ``s_j``; a row is preceded by the skipped lines with fewer good lines before them.
    """
    if not skipped:
        return rows + 1
    marks = np.array(sorted(skipped), dtype=np.int64) - np.arange(1, len(skipped) + 1)
    return rows + 1 + np.searchsorted(marks, rows + 1, side="left")


class ParquetSource:
    """Parquet through ``ParquetFile.iter_batches``."""

    unit = "row"

    def __init__(self, path: Path, head: bytes, options: ImportOptions) -> None:
        self._path = path
        self._options = options
        name = shown(path)
        if not head.startswith(_PARQUET_MAGIC):
            raise ImportRejected(f"{name} is not a Parquet file (it does not begin with PAR1)")
        try:
            self._file = pq.ParquetFile(path)
            self.names = list(self._file.schema_arrow.names)
        except (pa.ArrowException, OSError) as error:
            text = _arrow_text(error)
            if "magic bytes not found in footer" in text or "minimum file footer" in text:
                raise ImportRejected(
                    f"{name} is truncated or corrupt: it lacks the Parquet footer"
                ) from error
            raise ImportRejected(f"{name} is not a readable Parquet file: {text}") from error

    def batches(self, columns: Mapping[str, str], report: Progress) -> Batches:
        """Every batch of ``batch_rows`` rows."""
        sources = sorted(set(columns.values()))
        for source in sources:
            kind = self._file.schema_arrow.field(source).type
            if pa.types.is_nested(kind):
                raise ImportRejected(
                    f"{shown(self._path)} column {source!r} holds {kind} values, "
                    "not text, numbers or times"
                )
        total = max(self._file.metadata.num_rows, 1)
        done = 0
        report("read", 0, total)
        batches = self._file.iter_batches(batch_size=self._options.batch_rows, columns=sources)
        while True:
            try:
                record_batch = next(batches, None)
            except (pa.ArrowException, OSError) as error:
                raise ImportRejected(
                    f"{shown(self._path)} is corrupt after row {done:,}: {_arrow_text(error)}"
                ) from error
            if record_batch is None:
                break
            n = record_batch.num_rows
            positions = np.arange(done + 1, done + n + 1)
            arrays = {s: self._text_if_bytes(s, record_batch.column(s), done) for s in sources}
            done += n
            yield {t: arrays[s] for t, s in columns.items()}, positions
            report("read", min(done, total), total)
        report("read", total, total)

    def _text_if_bytes(self, source: str, array: pa.Array, done: int) -> pa.Array:
        """A binary column as text; raises ImportRejected naming it if it is not UTF-8."""
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            return array
        try:
            return array.cast(pa.string())
        except pa.ArrowInvalid as error:
            raise ImportRejected(
                f"{shown(self._path)} column {source!r}, rows {done + 1:,} to "
                f"{done + len(array):,}: bytes that are not UTF-8 text"
            ) from error
