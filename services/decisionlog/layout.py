"""Where the decision log lives on disk and what its Parquet parts hold.

One folder per kind of event, partitioned by UTC day (Hive style, so that Arrow datasets,
DuckDB and Spark read it as it is)::

    <root>/decisions/day=YYYY-MM-DD/part-<flush>[.<sink>].parquet     decisions, by decided_at
    <root>/outcomes/day=YYYY-MM-DD/part-<flush>[.<sink>].parquet      outcomes, by received_at
    <root>/_sink/journal[.<sink>].json                                each sink's flush journal
    <root>/_sink/lock[.<sink>]                                        each sink's lock

``<flush>`` is a sink's flush number (12 digits): one flush writes at most one part per
kind and day, and a sink's numbers only grow, so sorting one sink's part names sorts them
by arrival. Several sinks may write one log, each a member of the same consumer group on
its own share of the event log's partitions (``docs/decisionlog.md``, "Several sinks"):
each is named by its consumer name, which its parts, journal and lock carry, so that no
two sinks ever write the same file and none waits for another. The sink named ``main``
(the default) writes the names without a suffix. A compacted part is named
``part-<last>-c<first>.parquet`` (it replaces parts first..last, of any sinks). Parts are
written to a hidden temporary name, fsynced and renamed, so a reader never sees half a
part. Readers take every part of a day folder, of every sink, as one log (deduplicated by
event id). The sink writer and the readers (``services.pipelines.decisions``) share this
module, and nothing here imports the transport.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Literal

import pyarrow as pa

Kind = Literal["decisions", "outcomes"]
"""The two tables of the log."""

KINDS: tuple[Kind, ...] = ("decisions", "outcomes")
"""Every table, in the order the sink writes them."""

SINK_DIR = "_sink"
"""The sink's own state (its flush journal), beside the tables."""

PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
TMP_PREFIX = ".tmp-"
"""Prefix of a part being written; readers skip names that do not start with ``part-``."""

DEFAULT_SINK = "main"
"""The name of a sink that writes part, journal and lock names without a suffix (the event
log's default consumer name)."""

_SINK_NAME = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}"
SINK_NAME = re.compile(f"^{_SINK_NAME}$")
"""What a sink's name may be: the event log's consumer names, not starting with a dot."""
_PART = re.compile(rf"^part-(\d{{12}})(?:-c(\d{{12}})|\.({_SINK_NAME}))?\.parquet$")
_DAY = re.compile(r"^day=(\d{4}-\d{2}-\d{2})$")
_EPOCH = date(1970, 1, 1)
_EPOCH_DT = datetime(1970, 1, 1, tzinfo=UTC)

TIMESTAMP = pa.timestamp("us", tz="UTC")
"""Every time column: microseconds, UTC."""

DECISION_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("transaction_id", pa.string(), nullable=False),
        pa.field("card_id", pa.string()),
        pa.field("merchant_id", pa.string()),
        pa.field("terminal_id", pa.string()),
        pa.field("amount_minor", pa.int64()),
        pa.field("currency", pa.string()),
        pa.field("card_not_present", pa.bool_()),
        pa.field("transaction_at", TIMESTAMP),
        pa.field("decision", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("model_version", pa.string()),
        pa.field("scored_by", pa.string()),
        pa.field("feature_source", pa.string()),
        pa.field("route", pa.string()),
        pa.field("shadow_score", pa.float64()),
        pa.field("shadow_model_version", pa.string()),
        pa.field("reasons", pa.list_(pa.string())),
        pa.field("elapsed_ms", pa.float64()),
        pa.field("decided_at", TIMESTAMP),
        pa.field("features", pa.list_(pa.float32())),
        pa.field("feature_names", pa.list_(pa.string())),
        pa.field("feature_schema", pa.string()),
        pa.field("log_position", pa.string()),
        # Positions in ``features`` that took the version's default (parts written before
        # this column existed read it as null).
        pa.field("missing_features", pa.list_(pa.int32())),
        # The fraud team's shadow rules that fired, ``name=action`` (null in parts written
        # before this column existed).
        pa.field("shadow_rules", pa.list_(pa.string())),
    ],
    metadata={"fraudmesh.table": "decisions", "fraudmesh.layout": "1"},
)
"""One row per decision event (a retried Score call gives a second row: readers dedupe)."""

OUTCOME_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("transaction_id", pa.string(), nullable=False),
        pa.field("outcome", pa.string()),
        pa.field("outcome_source", pa.string()),
        pa.field("reported_at", TIMESTAMP),
        pa.field("received_at", TIMESTAMP),
        pa.field("log_position", pa.string()),
        # Added after layout 1's first parts: readers get null for parts written before it.
        pa.field("reported_by", pa.string()),
    ],
    metadata={"fraudmesh.table": "outcomes", "fraudmesh.layout": "1"},
)
"""One row per outcome event; the latest per transaction is its outcome."""

SCHEMAS: dict[Kind, pa.Schema] = {"decisions": DECISION_SCHEMA, "outcomes": OUTCOME_SCHEMA}
"""The schema of each table."""


def table_path(root: Path, kind: Kind) -> Path:
    """Folder of one table."""
    return root / kind


def day_name(day: date) -> str:
    """Partition folder name of a UTC day."""
    return f"day={day.isoformat()}"


def day_of_index(index: int) -> date:
    """The UTC day ``index`` days after 1970-01-01."""
    return _EPOCH + timedelta(days=index)


def day_index(ts_us: int) -> int:
    """Days since 1970-01-01 (UTC) of a time in microseconds since the epoch."""
    return ts_us // 86_400_000_000


def parse_day(name: str) -> date | None:
    """The day of a partition folder name, or None for anything else."""
    match = _DAY.match(name)
    return date.fromisoformat(match.group(1)) if match else None


def _suffix(sink: str) -> str:
    if not SINK_NAME.match(sink):
        raise ValueError(f"not a sink name: {sink!r}")
    return "" if sink == DEFAULT_SINK else f".{sink}"


def part_name(flush: int, sink: str = DEFAULT_SINK) -> str:
    """File name of the part flush number ``flush`` of sink ``sink`` writes into one day
    folder."""
    return f"{PART_PREFIX}{flush:012d}{_suffix(sink)}{PART_SUFFIX}"


def compacted_name(first: int, last: int) -> str:
    """File name of a part that replaces the parts of flushes ``first``..``last``."""
    return f"{PART_PREFIX}{last:012d}-c{first:012d}{PART_SUFFIX}"


def parse_part(name: str) -> tuple[int, int] | None:
    """(first, last) flush numbers a part file covers, or None if ``name`` is not a part."""
    match = _PART.match(name)
    if match is None:
        return None
    last = int(match.group(1))
    first = int(match.group(2)) if match.group(2) else last
    return first, last


def part_sink(name: str) -> str | None:
    """The sink that wrote a part (by its file name); None for a compacted part (it may
    hold the parts of several sinks) and for anything that is not a part."""
    match = _PART.match(name)
    if match is None or match.group(2):
        return None
    return match.group(3) or DEFAULT_SINK


def tmp_path(final: Path) -> Path:
    """The hidden name a part is written under before its rename."""
    return final.with_name(f"{TMP_PREFIX}{final.name}")


def day_dirs(root: Path, kind: Kind) -> list[tuple[date, Path]]:
    """The day folders of one table, oldest first."""
    base = table_path(root, kind)
    if not base.is_dir():
        return []
    found = []
    for entry in base.iterdir():
        day = parse_day(entry.name)
        if day is not None and entry.is_dir():
            found.append((day, entry))
    return sorted(found)


def parts(day_dir: Path) -> list[Path]:
    """The finished parts of one day folder, in flush order."""
    named = []
    for entry in day_dir.iterdir():
        covered = parse_part(entry.name)
        if covered is not None:
            named.append((covered[1], covered[0], entry))
    return [path for _, _, path in sorted(named)]


def journal_path(root: Path, sink: str = DEFAULT_SINK) -> Path:
    """The flush journal of sink ``sink``."""
    return root / SINK_DIR / f"journal{_suffix(sink)}.json"


def journal_paths(root: Path) -> list[Path]:
    """The flush journals of every sink that ever wrote under ``root``."""
    folder = root / SINK_DIR
    if not folder.is_dir():
        return []
    return sorted(folder.glob("journal*.json"))


def lock_path(root: Path, sink: str = DEFAULT_SINK) -> Path:
    """The lock file sink ``sink`` holds while it writes under ``root``."""
    return root / SINK_DIR / f"lock{_suffix(sink)}"


def utc_us(moment: datetime) -> int:
    """Microseconds since the epoch of an aware (or UTC-naive) datetime."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH_DT) // timedelta(microseconds=1)
