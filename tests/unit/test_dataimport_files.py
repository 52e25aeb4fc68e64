"""Files the importer cannot take as they are: rejected in one line naming the file (and the
line, row, column or option where known), with nothing written; and the compressed and
encoded forms it does take."""

from __future__ import annotations

import bz2
import gzip
import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.pipelines import dataimport
from services.pipelines.dataimport import ImportOptions, ImportRejected

HEADER = "transaction_id,timestamp,card_id,merchant_id,amount,currency,is_fraud\n"
ROWS = "".join(
    f"t{i},2026-01-01T00:{i % 60:02d}:00Z,c{i % 3},m1,{i + 1}.50,EUR,0\n" for i in range(300)
)
CSV = (HEADER + ROWS).encode()


def _parquet(table: pa.Table, **options: object) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, **options)  # type: ignore[arg-type]
    return out.getvalue()


def _frame_parquet() -> bytes:
    return _parquet(pa.Table.from_pandas(pd.read_csv(io.BytesIO(CSV))), row_group_size=100)


def _one_row(**columns: pa.Array) -> bytes:
    base = {
        "transaction_id": pa.array(["a"]),
        "timestamp": pa.array(["2026-01-01T00:00:00Z"]),
        "card_id": pa.array(["c"]),
        "merchant_id": pa.array(["m"]),
        "amount": pa.array([1.0]),
        "is_fraud": pa.array([0]),
    }
    return _parquet(pa.table(base | columns))


def _corrupt_pages() -> bytes:
    data = bytearray(_frame_parquet())
    for k in range(len(data) // 4, len(data) // 4 + 400):
        data[k] ^= 0x5A
    return bytes(data)


def _flipped_gzip() -> bytes:
    data = bytearray(gzip.compress(CSV))
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


def _zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("tx.csv", CSV)
    return out.getvalue()


def _repeated_column() -> bytes:
    names = ["transaction_id", "timestamp", "card_id", "card_id", "merchant_id", "amount"]
    arrays = [pa.array([v]) for v in ["a", "2026-01-01T00:00:00Z", "c", "c2", "m", 1.0]]
    return _parquet(pa.Table.from_arrays([*arrays, pa.array([0])], names=[*names, "is_fraud"]))


def _no_rows() -> bytes:
    return _parquet(pa.Table.from_pandas(pd.read_csv(io.BytesIO(CSV)).head(0)))


LATIN_ROW = "t999,2026-01-01T00:00:00Z,café,m1,1.00,EUR,0\n".encode("latin-1")

# name → (file name, content or a builder, what the one line must say)
BAD: dict[str, tuple[str, bytes | Callable[[], bytes], str]] = {
    "empty": ("tx.csv", b"", "is empty (0 bytes)"),
    "empty parquet": ("tx.parquet", b"", "is empty (0 bytes)"),
    "header only": ("tx.csv", HEADER.encode(), "holds column names but no rows"),
    "header only, gzip": ("tx.csv.gz", gzip.compress(HEADER.encode()), "but no rows"),
    "blank lines": ("tx.csv", b"\n\n\n", "holds no header line"),
    "empty gzip": ("tx.csv.gz", gzip.compress(b""), "holds no header line"),
    "unknown extension": ("tx.txt", CSV, "cannot tell the format of"),
    "truncated gzip": (
        "tx.csv.gz",
        gzip.compress(CSV)[:200],
        "ends early: its gzip data is truncated",
    ),
    "truncated bz2": ("tx.csv.bz2", bz2.compress(CSV)[:200], "its bz2 data is truncated"),
    "corrupt gzip": ("tx.csv.gz", _flipped_gzip, "its gzip data is corrupt"),
    "not UTF-8 (Latin-1)": ("tx.csv", CSV + LATIN_ROW, f"line {302}: not UTF-8 text"),
    "not UTF-8 header": ("tx.csv", b"transaction_id,caf\xe9\n" + CSV, "line 1: not UTF-8 text"),
    "UTF-16": ("tx.csv", (HEADER + ROWS).encode("utf-16"), "line 1: not UTF-8 text"),
    "random bytes": ("tx.csv", bytes(range(256)) * 8, "not UTF-8 text"),
    "zip archive": ("tx.csv", _zip, "is a zip archive"),
    "Parquet named .csv": ("tx.csv", _frame_parquet, "is a Parquet file, not CSV"),
    "CSV named .parquet": ("tx.parquet", CSV, "is not a Parquet file"),
    "truncated Parquet": (
        "tx.parquet",
        lambda: _frame_parquet()[:1500],
        "lacks the Parquet footer",
    ),
    "Parquet magic only": ("tx.parquet", b"PAR1", "lacks the Parquet footer"),
    "corrupt Parquet pages": ("tx.parquet", _corrupt_pages, "is corrupt after row"),
    "Parquet without rows": ("tx.parquet", _no_rows, "holds column names but no rows"),
    "Parquet struct column": (
        "tx.parquet",
        lambda: _one_row(card_id=pa.array([{"x": 1}])),
        "column 'card_id' holds struct",
    ),
    "Parquet bytes not UTF-8": (
        "tx.parquet",
        lambda: _one_row(card_id=pa.array([b"caf\xe9"], pa.binary())),
        "column 'card_id', rows 1 to 1: bytes that are not UTF-8 text",
    ),
    "semicolons": ("tx.csv", CSV.replace(b",", b";"), "one column split by semicolons"),
    "tabs": ("tx.csv", CSV.replace(b",", b"\t"), "one column split by tabs"),
    "no required columns": ("tx.csv", b"a,b\n1,2\n", "lacks required column(s) transaction_id"),
    "repeated column": ("tx.parquet", _repeated_column, "more than one column named 'card_id'"),
    "malformed line": ("tx.csv", CSV + b"x,y\n", "1 malformed CSV line(s)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_is_rejected_in_one_line_naming_it_and_nothing_is_written(
    tmp_path: Path, case: str
) -> None:
    name, content, expected = BAD[case]
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(content() if callable(content) else content)
    var = tmp_path / "var"
    with pytest.raises(ImportRejected) as caught:
        dataimport.import_transactions(path, var / "data", ImportOptions(batch_bytes=1 << 12))
    message = str(caught.value)
    assert expected in message and str(path) in message, message
    assert "\n" not in message and len(message) <= 300
    assert not var.exists(), sorted(var.rglob("*"))


def test_paths_that_are_not_readable_files_are_named(tmp_path: Path) -> None:
    var = tmp_path / "var" / "data"
    missing = tmp_path / "missing.csv"
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for path, expected in (
        (missing, "does not exist"),
        (folder, "is a directory, not a file"),
        (fifo, "is not a regular file"),
        (Path("/dev/null"), "is not a regular file"),
    ):
        with pytest.raises(ImportRejected, match=expected) as caught:
            dataimport.import_transactions(path, var)
        assert str(path) in str(caught.value)
    assert not var.parent.exists()


def test_an_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.csv"
    path.write_bytes(CSV)
    path.chmod(0)
    if os.geteuid() == 0:  # root reads any file: refuse it the way the kernel would
        opened = Path.open

        def refuse(self: Path, *args: object, **kwargs: object) -> object:
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return opened(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ImportRejected, match=r"secret\.csv cannot be read: Permission denied"):
        dataimport.import_transactions(path, tmp_path / "var" / "data")


def test_a_destination_under_a_file_is_rejected_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "tx.csv"
    path.write_bytes(CSV)
    blocker = tmp_path / "var"
    blocker.write_text("not a folder")
    with pytest.raises(ImportRejected, match=r"var is a file, not a folder"):
        dataimport.import_transactions(path, blocker / "data")
    assert blocker.read_text() == "not a folder"


def test_a_mapping_to_a_column_the_file_lacks_names_both(tmp_path: Path) -> None:
    path = tmp_path / "tx.csv"
    path.write_bytes(CSV)
    options = ImportOptions(mapping={"card_id": "customer"})
    with pytest.raises(ImportRejected, match=r"--map names column\(s\) 'customer' that .*tx.csv"):
        dataimport.import_transactions(path, tmp_path / "var" / "data", options)
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("tx.csv.gz", gzip.compress(CSV)),
        ("tx.csv.bz2", bz2.compress(CSV)),
        ("tx.csv.zst", pa.compress(CSV, codec="zstd", asbytes=True)),
        ("gzipped-without-suffix.csv", gzip.compress(CSV)),  # told by its bytes
        ("plain-despite-suffix.csv.gz", CSV),
        ("bom.csv", "\ufeff".encode() + CSV),
        ("crlf.csv", CSV.replace(b"\n", b"\r\n")),
    ],
)
def test_compressed_and_encoded_forms_import_the_same_rows(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    result = dataimport.import_transactions(path, tmp_path / "var" / "data")
    assert result.rows_imported == 300 and result.bad_rows.total == 0
    assert result.columns["card_id"] == "card_id"


def test_utf8_is_checked_across_reads_that_split_a_character(tmp_path: Path) -> None:
    # Every id is two-byte characters, so reads of 4 KiB split some of them in half.
    rows = "".join(
        f"{'é' * (i % 7 + 1)}{i},2026-01-01T00:00:00Z,cärd-{i % 5},m,1.00,EUR,0\n"
        for i in range(2_000)
    )
    path = tmp_path / "accents.csv"
    path.write_bytes((HEADER + rows).encode())
    options = ImportOptions(batch_bytes=1 << 12)
    result = dataimport.import_transactions(path, tmp_path / "var" / "data", options)
    assert result.rows_imported == 2_000
    # The last character cut in half: the file's last line is named.
    path.write_bytes((HEADER + rows).encode() + "zz,2026-01-01T00:00:00Z,é".encode()[:-1])
    with pytest.raises(ImportRejected, match=r"accents\.csv line 2002: not UTF-8 text"):
        dataimport.import_transactions(path, tmp_path / "var2" / "data", options)
