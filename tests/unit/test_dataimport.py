"""The importer's row checks and normalization, on small in-memory files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from services.domain import featurespec
from services.domain.validation import MAX_ID_LENGTH
from services.featurestore import layout
from services.pipelines import dataimport
from services.pipelines.dataimport import ImportOptions, ImportRejected
from services.pipelines.dataimport.reading import csv_lines

HEADER = "transaction_id,timestamp,card_id,merchant_id,amount,currency,is_fraud\n"


def _csv(tmp_path: Path, body: str, header: str = HEADER, name: str = "tx.csv") -> Path:
    path = tmp_path / name
    path.write_text(header + body)
    return path


def _rows(n: int, start: int = 0) -> str:
    return "".join(
        f"t{i},2026-01-01T00:{i % 60:02d}:00Z,c{i % 7},m{i % 3},{i + 1}.50,EUR,{int(i % 10 == 0)}\n"
        for i in range(start, start + n)
    )


def _import(path: Path, **options: object) -> dataimport.ImportResult:
    return dataimport.import_transactions(
        path,
        path.parent / "data",
        ImportOptions(**options),  # type: ignore[arg-type]
    )


def test_values_are_normalized_as_serving_reads_them(tmp_path: Path) -> None:
    body = (
        "a,2026-01-01T01:00:00+01:00,c1,m1,12.34,EUR,1\n"
        "b,2026-01-01 00:00:01,c1,m1,1234,JPY,false\n"
        "c,1767225602,c1,m1,1.234,KWD,TRUE\n"
        "d,1767225602.5,c1,m1,7,,0\n"
        "e,2026-01-01T00:00:03Z,c1,m1,0.01,EUR,0\n"
        "f,2026-01-01T00:00:04Z,c1,m1,0.00,EUR,0\n"  # an account verification
        "g,2026-01-01T00:00:05Z,c1,m1,0,JPY,1\n"
    )
    result = _import(_csv(tmp_path, body))
    assert result.bad_rows.total == 0
    tx = pd.read_parquet(result.data_dir / layout.TRANSACTIONS_FILE).set_index("transaction_id")
    t0 = pd.Timestamp("2026-01-01", tz="UTC")
    seconds = (tx["timestamp"] - t0).dt.total_seconds().to_dict()
    assert seconds == {"a": 0.0, "b": 1.0, "c": 2.0, "d": 2.5, "e": 3.0, "f": 4.0, "g": 5.0}
    assert tx["amount_minor"].to_dict() == {
        "a": 1234,
        "b": 1234,
        "c": 1234,
        "d": 700,
        "e": 1,
        "f": 0,
        "g": 0,
    }
    assert tx["currency"].to_dict()["d"] == "EUR"  # the default
    assert tx["is_fraud"].tolist() == [True, False, True, False, False, False, True]
    assert set(tx["channel"]) == {featurespec.CARD_PRESENT}
    assert result.defaulted == [
        "channel",
        "terminal_id",
        "fraud_reported_at",
        "card_home_country",
        "merchant_country",
        "merchant_category",
        "fraud_scenario",
    ]


def test_each_broken_row_is_counted_by_reason_with_its_line(tmp_path: Path) -> None:
    long_id = "x" * (MAX_ID_LENGTH + 1)
    body = _rows(5) + (
        "bad1,2026-01-01T00:00:00Z,,m1,1.00,EUR,0\n"  # line 7
        "bad2,2026-01-01T00:00:00Z,c1,m1,-1.00,EUR,0\n"  # line 8
        "bad3,2026-01-01T00:00:00Z,c1,m1,1.00,EURO,0\n"  # line 9
        "bad4,not a time,c1,m1,1.00,EUR,0\n"  # line 10
        f"bad5,2026-01-01T00:00:00Z,{long_id},m1,1.00,EUR,0\n"  # line 11
        "bad6,2026-01-01T00:00:00Z,c1,m1,1.00,EUR,2\n"  # line 12
        "bad7,1767225600000,c1,m1,1.00,EUR,0\n"  # line 13: milliseconds
        "t1,2026-01-01T00:00:00Z,c1,m1,1.00,EUR,0\n"  # line 14: duplicate of line 3
        "bad9,2026-01-01T00:00:00Z,c1,m1,abc,EUR,0\n"  # line 15
    )
    with pytest.raises(ImportRejected) as caught:
        _import(_csv(tmp_path, body))
    bad = caught.value.bad_rows
    assert bad is not None and caught.value.unit == "line"
    assert bad.examples == {
        "missing card_id": [7],
        "negative amount": [8],
        "unknown currency": [9],
        "unparseable timestamp": [10],
        f"card_id is longer than {MAX_ID_LENGTH} characters": [11],
        "is_fraud is not 0/1 or true/false": [12],
        "timestamp out of range (epoch seconds expected)": [13],
        "duplicate transaction_id": [14],
        "unparseable amount": [15],
    }
    assert not (tmp_path / "data").exists()
    # Tolerated: left out, the rest imported.
    result = _import(_csv(tmp_path, body), max_bad_rows=9)
    assert result.rows_imported == 5 and result.bad_rows.total == 9


def test_examples_are_the_first_lines_of_each_reason(tmp_path: Path) -> None:
    body = "".join(f"x{i},2026-01-01T00:00:00Z,c1,m1,-1,EUR,0\n" for i in range(12))
    with pytest.raises(ImportRejected) as caught:
        _import(_csv(tmp_path, body), batch_bytes=200)
    bad = caught.value.bad_rows
    assert bad is not None
    assert bad.counts == {"negative amount": 12}
    assert bad.examples["negative amount"] == [2, 3, 4, 5, 6]
    assert bad.lines("line") == ["12 × negative amount (line 2, 3, 4, 5, 6, …)"]


def test_malformed_lines_reject_the_file_and_shift_no_line_number() -> None:
    # Data rows 1..5 after the header; lines 3 and 4 were malformed and skipped.
    assert csv_lines(np.arange(1, 4), [3, 4]).tolist() == [2, 5, 6]
    assert csv_lines(np.arange(1, 4), []).tolist() == [2, 3, 4]
    assert csv_lines(np.arange(1, 3), [2]).tolist() == [3, 4]


def test_a_malformed_line_is_reported(tmp_path: Path) -> None:
    body = _rows(3) + "oops,only,three\n" + _rows(2, start=3)
    with pytest.raises(ImportRejected, match=r"malformed CSV line.*line\(s\) 5"):
        _import(_csv(tmp_path, body))


def test_mapping_and_missing_columns_are_explained(tmp_path: Path) -> None:
    header = "id,when,customer,shop,value,label\n"
    body = "1,2026-01-01T00:00:00Z,c1,m1,1.00,0\n2,2026-01-01T00:00:01Z,c2,m1,2.00,1\n"
    path = _csv(tmp_path, body, header)
    with pytest.raises(ImportRejected, match=r"lacks required column.*transaction_id"):
        _import(path)
    mapping = dataimport.parse_mapping(
        [
            "transaction_id=id",
            "timestamp=when",
            "card_id=customer",
            "merchant_id=shop",
            "amount=value",
            "is_fraud=label",
        ]
    )
    result = _import(path, mapping=mapping)
    assert result.rows_imported == 2 and result.columns["card_id"] == "customer"
    tx = pd.read_parquet(result.data_dir / layout.TRANSACTIONS_FILE)
    assert tx["transaction_id"].tolist() == ["1", "2"]  # integers kept as their text
    with pytest.raises(ImportRejected, match="not a schema column"):
        dataimport.parse_mapping(["card=customer"])
    with pytest.raises(ImportRejected, match="TARGET=SOURCE"):
        dataimport.parse_mapping(["card_id"])
    with pytest.raises(ImportRejected, match="lacks"):
        _import(path, mapping={"card_id": "nope"})


def test_parquet_types_are_read_natively(tmp_path: Path) -> None:
    table = pa.table(
        {
            "transaction_id": pa.array([10, 11, 12], pa.int64()),
            "timestamp": pa.array(
                pd.to_datetime(["2026-01-01 01:00", "2026-01-01 02:00", None]).tz_localize(
                    "Europe/Paris"
                )
            ),
            "card_id": ["c1", "c1", "c2"],
            "merchant_id": ["m1", "m1", "m1"],
            "amount_minor": pa.array([100, 250, 300], pa.int64()),
            "is_fraud": pa.array([True, False, None]),
            "terminal_id": ["t1", None, ""],
            "merchant_category": pa.array([5411.0, None, 5411.0]),
        }
    )
    path = tmp_path / "tx.parquet"
    pa.parquet.write_table(table, path)
    with pytest.raises(ImportRejected) as caught:
        _import(path)
    bad = caught.value.bad_rows
    assert bad is not None and caught.value.unit == "row"
    assert bad.examples == {"missing timestamp": [3]}
    result = _import(path, max_bad_rows=1)
    tx = pd.read_parquet(result.data_dir / layout.TRANSACTIONS_FILE)
    assert tx["timestamp"].dt.hour.tolist() == [0, 1]  # Paris 01:00 and 02:00 in UTC
    assert tx["terminal_id"].tolist() == ["t1", None]
    assert tx["merchant_category"].dtype == "Int64"
    assert tx["merchant_category"].isna().tolist() == [False, True]


def test_the_help_text_names_every_schema_column() -> None:
    from services.cli.data import _schema_help

    text = _schema_help()
    for name in dataimport.SCHEMA:
        assert name in text, name
