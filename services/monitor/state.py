"""The monitor's durable state: slices, cohorts, the decision index and outcomes, in SQLite.

One file (write-ahead log, ``synchronous=FULL``); a checkpoint is one transaction and the
event log position is committed only after it. After a crash the state is the last
checkpoint's and the log delivers what followed again: a decision already in the index is
skipped, an outcome already stored changes nothing, so nothing is counted twice.

Tables::

    meta(key, value)                           format, last checkpoint
    slices(version, arm, start, tally)         tally.Tally per version, arm and slice
    cohorts(version, hour, cohort)             evaluation.Cohort per version and decision hour
    decided(key, version, hour, decision, bin) one row per decision younger than the index
                                               horizon: what an outcome is joined to
    outcomes(key, label, reported, received,   the latest outcome of a transaction; hour is
             hour)                             its decision's (NULL until the decision came)
    rule_fired(key, hour, rules)               the fraud team's rules that fired on a decision
                                               (``rulewatch``), for its outcome to come

``key`` is a 64-bit hash of the transaction id (``transaction_key``); ``version`` in
``decided`` is a code from ``versions(code, version)``.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

FORMAT = "2"
"""Version of the table layout (2: tallies count canary failures); a file of another
format is started afresh."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS versions (code INTEGER PRIMARY KEY, version TEXT UNIQUE NOT NULL)",
    "CREATE TABLE IF NOT EXISTS slices (version TEXT NOT NULL, arm TEXT NOT NULL, "
    "start INTEGER NOT NULL, tally BLOB NOT NULL, PRIMARY KEY (version, arm, start)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS cohorts (version TEXT NOT NULL, hour INTEGER NOT NULL, "
    "cohort BLOB NOT NULL, PRIMARY KEY (version, hour)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS decided (key INTEGER PRIMARY KEY, version INTEGER NOT NULL, "
    "hour INTEGER NOT NULL, decision INTEGER NOT NULL, bin INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS decided_by_hour ON decided (hour)",
    "CREATE TABLE IF NOT EXISTS outcomes (key INTEGER PRIMARY KEY, label INTEGER NOT NULL, "
    "reported INTEGER NOT NULL, received INTEGER NOT NULL, hour INTEGER)",
    "CREATE INDEX IF NOT EXISTS outcomes_by_received ON outcomes (received)",
    "CREATE TABLE IF NOT EXISTS rule_fired (key INTEGER PRIMARY KEY, hour INTEGER NOT NULL, "
    "rules TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS rule_fired_by_hour ON rule_fired (hour)",
)
_TABLES = ("meta", "versions", "slices", "cohorts", "decided", "outcomes", "rule_fired")
_CHUNK = 500
"""Keys per ``IN (...)`` query (well under SQLite's variable limit)."""


def transaction_key(transaction_id: str) -> int:
    """A signed 64-bit hash of a transaction id (two ids share one with chance 2^-64)."""
    digest = hashlib.blake2b(transaction_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True, slots=True)
class Decided:
    """What the index keeps of a decision: enough to count an outcome against it."""

    version: str
    hour: int
    decision: int
    bin: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """A transaction's latest outcome."""

    label: int
    reported_us: int
    received_us: int
    hour: int | None
    """Hour of the decision it was counted against; None while the decision is unknown."""

    def newer_than(self, other: Outcome) -> bool:
        """True when this outcome replaces ``other`` (later reported, then received)."""
        return (self.reported_us, self.received_us) > (other.reported_us, other.received_us)


class MonitorStore:
    """The SQLite file of the monitor's state."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        held = self._format()
        if held is not None and held != FORMAT:
            for table in _TABLES:
                self._db.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (FORMAT,))
        self._codes: dict[str, int] = {}
        self._names: dict[int, str] = {}
        for code, version in self._db.execute("SELECT code, version FROM versions"):
            self._codes[version] = code
            self._names[code] = version

    def _format(self) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        except sqlite3.OperationalError:
            return None
        return None if row is None else str(row[0])

    def close(self) -> None:
        """Closes the file."""
        self._db.close()

    # -- reads -----------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A meta value."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def slices(self, since: int) -> Iterator[tuple[str, str, int, bytes]]:
        """(version, arm, start, tally bytes) of every slice starting at or after ``since``."""
        yield from self._db.execute(
            "SELECT version, arm, start, tally FROM slices WHERE start >= ?", (since,)
        )

    def cohorts(self, since_hour: int) -> Iterator[tuple[str, int, bytes]]:
        """(version, hour, cohort bytes) of every cohort from ``since_hour`` on."""
        yield from self._db.execute(
            "SELECT version, hour, cohort FROM cohorts WHERE hour >= ?", (since_hour,)
        )

    def decided(self, keys: Sequence[int]) -> dict[int, Decided]:
        """The index rows of those of ``keys`` it holds."""
        found: dict[int, Decided] = {}
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            for key, code, hour, decision, grid_bin in self._db.execute(
                f"SELECT key, version, hour, decision, bin FROM decided WHERE key IN ({marks})",
                chunk,
            ):
                found[key] = Decided(self._names[code], hour, decision, grid_bin)
        return found

    def outcomes(self, keys: Sequence[int]) -> dict[int, Outcome]:
        """The stored outcomes of those of ``keys`` that have one."""
        found: dict[int, Outcome] = {}
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            for key, label, reported, received, hour in self._db.execute(
                f"SELECT key, label, reported, received, hour FROM outcomes WHERE key IN ({marks})",
                chunk,
            ):
                found[key] = Outcome(label, reported, received, hour)
        return found

    def fired(self, keys: Sequence[int]) -> dict[int, tuple[int, str]]:
        """The decision hour and stored rules of the decisions of ``keys`` a rule fired on."""
        found: dict[int, tuple[int, str]] = {}
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            query = f"SELECT key, hour, rules FROM rule_fired WHERE key IN ({marks})"
            for key, hour, rules in self._db.execute(query, chunk):
                found[int(key)] = (int(hour), str(rules))
        return found

    def counts(self) -> dict[str, int]:
        """Rows per table (for logs and tests)."""
        return {
            table: int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            for table in ("slices", "cohorts", "decided", "outcomes")
        }

    # -- the checkpoint --------------------------------------------------------------------

    def save(
        self,
        decided: Iterable[tuple[int, Decided]],
        outcomes: Iterable[tuple[int, Outcome]],
        slices: Iterable[tuple[str, str, int, bytes]],
        cohorts: Iterable[tuple[str, int, bytes]],
        meta: dict[str, str],
        fired: Iterable[tuple[int, int, str]] = (),
    ) -> None:
        """Writes one checkpoint in one transaction (``fired``: key, hour and rules of the
        decisions a rule of the fraud team fired on)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = [(k, self._code(d.version), d.hour, d.decision, d.bin) for k, d in decided]
            db.executemany("INSERT OR IGNORE INTO decided VALUES (?, ?, ?, ?, ?)", rows)
            db.executemany(
                "INSERT OR REPLACE INTO outcomes VALUES (?, ?, ?, ?, ?)",
                [(k, o.label, o.reported_us, o.received_us, o.hour) for k, o in outcomes],
            )
            db.executemany("INSERT OR REPLACE INTO slices VALUES (?, ?, ?, ?)", slices)
            db.executemany("INSERT OR REPLACE INTO cohorts VALUES (?, ?, ?)", cohorts)
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
            db.executemany("INSERT OR IGNORE INTO rule_fired VALUES (?, ?, ?)", fired)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            # Codes given inside the rolled-back transaction do not exist.
            self._codes = {v: c for c, v in db.execute("SELECT code, version FROM versions")}
            self._names = {c: v for v, c in self._codes.items()}
            raise

    def _code(self, version: str) -> int:
        code = self._codes.get(version)
        if code is None:
            cursor = self._db.execute("INSERT INTO versions (version) VALUES (?)", (version,))
            code = int(cursor.lastrowid or 0)
            self._codes[version] = code
            self._names[code] = version
        return code

    def prune(
        self,
        slices_before: int,
        cohorts_before_hour: int,
        index_before_hour: int,
        outcomes_received_before: int,
    ) -> None:
        """Deletes slices, cohorts, index rows and outcomes older than the horizons."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM slices WHERE start < ?", (slices_before,))
            db.execute("DELETE FROM cohorts WHERE hour < ?", (cohorts_before_hour,))
            db.execute("DELETE FROM decided WHERE hour < ?", (index_before_hour,))
            db.execute("DELETE FROM rule_fired WHERE hour < ?", (index_before_hour,))
            db.execute(
                "DELETE FROM outcomes WHERE received < ? AND (hour IS NULL OR hour < ?)",
                (outcomes_received_before, index_before_hour),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _chunks(keys: Sequence[int]) -> Iterator[list[int]]:
    keys = list(keys)
    for i in range(0, len(keys), _CHUNK):
        yield keys[i : i + _CHUNK]
