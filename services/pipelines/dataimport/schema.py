"""What an import accepts and reports: the schema, options, results and the rejection error.

Every rejection is an ``ImportRejected`` with a one-line message naming the file and, where
known, the line, row, column or option at fault; nothing has been changed when it is raised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from services.domain import aggregation, featurespec

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
MESSAGE_LIMIT = 300
"""Longest rejection message, in characters: enough to name the problem, never a screenful."""

_NAMES_SHOWN = 20
_DELIMITERS = {";": "semicolons", "\t": "tabs", "|": "vertical bars"}

Progress = Callable[[str, int, int], None]
"""Called with (step, done, total); steps: ``read`` (bytes or rows), ``features`` (tables)."""


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` as one printable line (control characters escaped), cut to ``limit``."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return escaped if len(escaped) <= limit else escaped[: limit - 1] + "…"


def shown(path: Path) -> str:
    """A path for a message: as given, control characters escaped."""
    return one_line(str(path), limit=MESSAGE_LIMIT // 2)


class ImportRejected(Exception):
    """The file cannot be imported as it is: nothing was changed. The message (one line)
    says why, naming the file, line, row, column or option at fault."""

    def __init__(self, message: str, bad_rows: BadRows | None = None, unit: str = "row") -> None:
        super().__init__(one_line(message))
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
            examples = self.examples.setdefault(text, [])
            examples.extend(int(p) for p in where.iloc[: max(0, EXAMPLES - len(examples))])

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
    raise ImportRejected(
        f"cannot tell the format of {shown(path)} from its name "
        "(.csv, .csv.gz, .csv.bz2, .csv.zst, .parquet, .pq): give --format csv|parquet"
    )


def resolve_columns(path: Path, names: list[str], mapping: Mapping[str, str]) -> dict[str, str]:
    """Schema column → the file's column, from the mapping and same-named columns.

    Raises ImportRejected when ``--map`` names a column the file lacks, a required column is
    missing (with a hint when the header looks separated by something else than commas) or
    a column the import reads appears more than once in the file.
    """
    present = set(names)
    missing_sources = sorted({s for s in mapping.values() if s not in present})
    if missing_sources:
        raise ImportRejected(
            f"--map names column(s) {', '.join(map(repr, missing_sources))} that "
            f"{shown(path)} lacks; it has: {_listed(names)}"
        )
    columns = dict(mapping)
    for name in SCHEMA:
        if name not in columns and name in present:
            columns[name] = name
    counts = Counter(names)
    repeated = sorted({source for source in columns.values() if counts[source] > 1})
    if repeated:
        raise ImportRejected(
            f"{shown(path)} has more than one column named {', '.join(map(repr, repeated))}: "
            "rename all but one (which one holds the data is ambiguous)"
        )
    lacking = [name for name in REQUIRED if name not in columns]
    if "amount" not in columns and "amount_minor" not in columns:
        lacking.append("amount or amount_minor")
    if lacking:
        raise ImportRejected(
            f"{shown(path)} lacks required column(s) {', '.join(lacking)}; "
            + (
                _delimiter_hint(names)
                or "name yours with --map TARGET=SOURCE (e.g. --map card_id=customer_ref); "
                f"it has: {_listed(names)}"
            )
        )
    if "amount" in columns and "amount_minor" in columns:
        del columns["amount"]  # the exact one wins
    return columns


def _listed(names: list[str]) -> str:
    shown_names = ", ".join(repr(n) for n in names[:_NAMES_SHOWN])
    more = len(names) - _NAMES_SHOWN
    return shown_names + (f" and {more:,} more" if more > 0 else "")


def _delimiter_hint(names: list[str]) -> str | None:
    """What to say when the header is one column holding another separator."""
    if len(names) != 1:
        return None
    for delimiter, plural in _DELIMITERS.items():
        if names[0].count(delimiter) >= 2:
            return (
                f"its header is one column split by {plural}, not commas: "
                "save it as comma-separated CSV"
            )
    return None
