"""The updater's durable state: entity states, the transaction index, held labels.

One SQLite file (write-ahead log, ``synchronous=FULL``): a checkpoint is one transaction,
and the log position is committed only after it, so after a crash the states and the log
agree up to the last checkpoint and what follows is consumed again (and applied
idempotently).

Tables::

    meta(key, value)                            the seed's dataset fingerprint, the format
    cards(id, state, live)                      CardState.to_bytes; live: changed by an event
    merchants(id, state, live)                  MerchantState.to_bytes (live: as for cards)
    terminals(id, state, live)                  a terminal's MerchantState.to_bytes (the same)
    transactions(id, merchant_id, t_us,         which merchant (and terminal, '' for none) a
                 terminal_id)                   transaction paid, for outcomes
    pending_labels(id, is_fraud, reported_us)   outcomes whose decision has not come yet
    due_reports(terminal_id, reported_us,       the seed's fraud reports after its history's
                merchant_id)                    end, each moving a terminal's row when due
    journal(seq, record)                        events applied since the snapshots that lack them

A state is its snapshot with the journal applied again (``engine.py``): checkpoints append to
the journal and write a budget of snapshots, so that none has to rewrite every changed
merchant (tens of KB each) at once.

The transaction index is pruned to the merchant horizon (label delay + 28 days, a terminal's
too): an outcome for an older transaction cannot change any window.

Format 2 (cards and merchants only) is migrated in place to format 3 when opened: the
``terminals`` table and the index's ``terminal_id`` column ('' in the entries it held) are
added, and the ``terminals_seeded`` meta key stays unset, so that the terminal states are
seeded from the history (``UpdaterApp``) while the live card and merchant states are kept.
Any other format is rebuilt from a new seed.

``due_reports`` is written with the seed and only read afterwards: the aggregator moves a
terminal's row to each report when its clock passes it, and a move made again (after a
restart) changes nothing. A file seeded before the table existed has it empty: its seeded
labels then show from each terminal's next payment, as they did when it was seeded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path

from services.domain.aggregation import CardState, Label, MerchantState

FORMAT = "3"
"""Version of the table layout; format 2 is migrated (see the module doc), others rebuilt."""
_MIGRATES = "2"
"""The previous layout, which lacks only the terminals."""
TERMINALS_SEEDED = "terminals_seeded"
"""Meta key set once the terminal states hold the history (unset after a migration)."""

_TERMINALS = (
    "CREATE TABLE IF NOT EXISTS terminals "
    "(id TEXT PRIMARY KEY, state BLOB NOT NULL, live INTEGER NOT NULL) WITHOUT ROWID"
)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS cards "
    "(id TEXT PRIMARY KEY, state BLOB NOT NULL, live INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS merchants "
    "(id TEXT PRIMARY KEY, state BLOB NOT NULL, live INTEGER NOT NULL) WITHOUT ROWID",
    _TERMINALS,
    "CREATE TABLE IF NOT EXISTS transactions "
    "(id TEXT PRIMARY KEY, merchant_id TEXT NOT NULL, t_us INTEGER NOT NULL, "
    "terminal_id TEXT NOT NULL DEFAULT '') WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS transactions_by_time ON transactions (t_us)",
    "CREATE TABLE IF NOT EXISTS pending_labels "
    "(id TEXT PRIMARY KEY, is_fraud INTEGER NOT NULL, reported_us INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY, record BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS due_reports (terminal_id TEXT NOT NULL, "
    "reported_us INTEGER NOT NULL, merchant_id TEXT NOT NULL, "
    "PRIMARY KEY (terminal_id, reported_us)) WITHOUT ROWID",
)

_TABLES = (
    "meta",
    "cards",
    "merchants",
    "terminals",
    "transactions",
    "pending_labels",
    "journal",
    "due_reports",
)

_MIGRATION = (
    _TERMINALS,
    "ALTER TABLE transactions ADD COLUMN terminal_id TEXT NOT NULL DEFAULT ''",
)

IndexEntry = tuple[str, str, str, int]
"""(transaction_id, merchant_id, terminal_id ('' for none), t_us)."""

DueReport = tuple[str, str, int]
"""(terminal_id, merchant_id, reported_us): a fraud report the seed holds for a later instant."""


class StateStore:
    """The SQLite file of the updater's state (one writer: the updater's loop thread)."""

    def __init__(
        self, path: Path, base: StateStore | None = None, *, exclusive: bool = False
    ) -> None:
        """``base``: where an entity or transaction this file does not hold is looked up
        (the seed a partitioned group's members share; ``partitioned.py``). ``exclusive``:
        one connection of one process uses the file (a partition's, held under its lock),
        so SQLite keeps the write-ahead log's index in that process's memory rather than in
        a shared-memory file, and the file may live on a network file system."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._base = base
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False)
        if exclusive:
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self.migrated_from: str | None = None
        """The format this file had when it was migrated on opening, else None."""
        found = self._format()
        if found == _MIGRATES:
            with self._db:
                # sqlite3 opens no transaction before DDL by itself: one explicit transaction,
                # so that a crash leaves format 2 intact and the migration runs again.
                self._db.execute("BEGIN")
                for statement in _MIGRATION:
                    self._db.execute(statement)
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (FORMAT,))
            self.migrated_from = found
        elif found not in (None, FORMAT):
            with self._db:  # another layout: rebuilt (a new seed follows)
                for table in _TABLES:
                    self._db.execute(f"DROP TABLE IF EXISTS {table}")
        with self._db:
            for statement in _SCHEMA:
                self._db.execute(statement)
        self.set_meta("format", FORMAT)

    def _format(self) -> str | None:
        try:
            return self.meta("format")
        except sqlite3.OperationalError:  # a new file: no tables yet
            return None

    # --- reads -------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A metadata value, None when unset."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def card(self, card_id: str) -> CardState | None:
        """A card's saved state."""
        row = self._db.execute("SELECT state FROM cards WHERE id = ?", (card_id,)).fetchone()
        if row is None:
            return None if self._base is None else self._base.card(card_id)
        return CardState.from_bytes(row[0])

    def merchant(self, merchant_id: str) -> MerchantState | None:
        """A merchant's saved state."""
        row = self._db.execute(
            "SELECT state FROM merchants WHERE id = ?", (merchant_id,)
        ).fetchone()
        if row is None:
            return None if self._base is None else self._base.merchant(merchant_id)
        return MerchantState.from_bytes(row[0])

    def terminal(self, terminal_id: str) -> MerchantState | None:
        """A terminal's saved state."""
        row = self._db.execute(
            "SELECT state FROM terminals WHERE id = ?", (terminal_id,)
        ).fetchone()
        if row is None:
            return None if self._base is None else self._base.terminal(terminal_id)
        return MerchantState.from_bytes(row[0])

    def entities_of(self, transaction_id: str) -> tuple[str, str] | None:
        """The merchant and terminal ('' for none) a transaction paid, if it is in the index."""
        row = self._db.execute(
            "SELECT merchant_id, terminal_id FROM transactions WHERE id = ?", (transaction_id,)
        ).fetchone()
        if row is None:
            return None if self._base is None else self._base.entities_of(transaction_id)
        return str(row[0]), str(row[1])

    def pending_label(self, transaction_id: str) -> Label | None:
        """A held label of a transaction not consumed yet."""
        row = self._db.execute(
            "SELECT is_fraud, reported_us FROM pending_labels WHERE id = ?", (transaction_id,)
        ).fetchone()
        return None if row is None else Label(bool(row[0]), int(row[1]))

    def pending_labels(self) -> Iterator[tuple[str, Label]]:
        """Every held label."""
        for tid, is_fraud, reported_us in self._db.execute(
            "SELECT id, is_fraud, reported_us FROM pending_labels"
        ):
            yield str(tid), Label(bool(is_fraud), int(reported_us))

    def live_cards(self) -> Iterator[tuple[str, CardState]]:
        """Cards an event has changed since the seed (their rows differ from the batch's)."""
        for card_id, data in self._db.execute("SELECT id, state FROM cards WHERE live = 1"):
            yield str(card_id), CardState.from_bytes(data)

    def live_merchants(self) -> Iterator[tuple[str, MerchantState]]:
        """Merchants an event has changed since the seed."""
        for merchant_id, data in self._db.execute("SELECT id, state FROM merchants WHERE live = 1"):
            yield str(merchant_id), MerchantState.from_bytes(data)

    def live_terminals(self) -> Iterator[tuple[str, MerchantState]]:
        """Terminals an event has changed since the seed."""
        for terminal_id, data in self._db.execute("SELECT id, state FROM terminals WHERE live = 1"):
            yield str(terminal_id), MerchantState.from_bytes(data)

    def due_reports(self) -> list[DueReport]:
        """The seed's fraud reports after its history's end, in time order (the base's when
        this file holds none: a partition's)."""
        try:
            rows = self._db.execute(
                "SELECT terminal_id, merchant_id, reported_us FROM due_reports "
                "ORDER BY reported_us, terminal_id"
            ).fetchall()
        except sqlite3.OperationalError:  # a frozen seed written before the table existed
            rows = []
        if not rows and self._base is not None:
            return self._base.due_reports()
        return [(str(t), str(m), int(r)) for t, m, r in rows]

    def journal(self) -> Iterator[tuple[int, bytes]]:
        """The journal, oldest first: (sequence, serialized EventEnvelope)."""
        for seq, record in self._db.execute("SELECT seq, record FROM journal ORDER BY seq"):
            yield int(seq), bytes(record)

    def journal_bounds(self) -> tuple[int, int]:
        """(first, last) sequence of the journal; (1, 0) when it is empty."""
        first, last = self._db.execute("SELECT min(seq), max(seq) FROM journal").fetchone()
        return (1, 0) if last is None else (int(first), int(last))

    def counts(self) -> dict[str, int]:
        """Rows per table (for logs and tests)."""
        return {
            table: int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            for table in _TABLES[1:]
        }

    # --- writes ------------------------------------------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        """Sets one metadata value (its own transaction)."""
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def save(
        self,
        cards: Iterable[tuple[str, bytes]] = (),
        merchants: Iterable[tuple[str, bytes]] = (),
        terminals: Iterable[tuple[str, bytes]] = (),
        transactions: Iterable[IndexEntry] = (),
        labels_held: Iterable[tuple[str, Label]] = (),
        labels_released: Iterable[str] = (),
        prune_before_us: int | None = None,
        journal: Iterable[tuple[int, bytes]] = (),
        journal_from: int | None = None,
        live: bool = True,
        meta: dict[str, str] | None = None,
        due: Iterable[DueReport] = (),
    ) -> None:
        """Writes one checkpoint in a single durable transaction: state snapshots (``to_bytes``;
        ``live``: they come from events, not from the seed), index entries, held labels, and
        the journal (new events appended, those before ``journal_from`` deleted), ``meta``
        values (a partition's log position, so that it moves with its state), and the seed's
        ``due`` reports."""
        db = self._db
        flag = int(live)
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO cards (id, state, live) VALUES (?, ?, ?)",
                ((k, data, flag) for k, data in cards),
            )
            db.executemany(
                "INSERT OR REPLACE INTO merchants (id, state, live) VALUES (?, ?, ?)",
                ((k, data, flag) for k, data in merchants),
            )
            db.executemany(
                "INSERT OR REPLACE INTO terminals (id, state, live) VALUES (?, ?, ?)",
                ((k, data, flag) for k, data in terminals),
            )
            db.executemany(
                "INSERT OR REPLACE INTO transactions (id, merchant_id, terminal_id, t_us) "
                "VALUES (?, ?, ?, ?)",
                transactions,
            )
            db.executemany(
                "INSERT OR REPLACE INTO pending_labels (id, is_fraud, reported_us) "
                "VALUES (?, ?, ?)",
                ((k, int(v.is_fraud), v.reported_us) for k, v in labels_held),
            )
            db.executemany(
                "DELETE FROM pending_labels WHERE id = ?", ((k,) for k in labels_released)
            )
            if prune_before_us is not None:
                db.execute("DELETE FROM transactions WHERE t_us <= ?", (prune_before_us,))
            db.executemany("INSERT INTO journal (seq, record) VALUES (?, ?)", journal)
            if journal_from is not None:
                db.execute("DELETE FROM journal WHERE seq < ?", (journal_from,))
            if meta:
                db.executemany(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta.items()
                )
            db.executemany(
                "INSERT OR REPLACE INTO due_reports (terminal_id, merchant_id, reported_us) "
                "VALUES (?, ?, ?)",
                due,
            )

    @classmethod
    def frozen(cls, path: Path) -> StateStore:
        """The file opened read-only as immutable (no locks, no write-ahead log): a seed
        nobody writes any more, read by members on any host (``seal`` it first)."""
        store = cls.__new__(cls)
        store.path = path
        store._base = None
        store.migrated_from = None
        store._db = sqlite3.connect(
            f"file:{path}?immutable=1", uri=True, timeout=30, check_same_thread=False
        )
        return store

    def seal(self) -> None:
        """Folds the write-ahead log into the file and leaves WAL mode, so that ``frozen``
        readers, which ignore a write-ahead log, see everything; then closes it."""
        self._db.execute("PRAGMA journal_mode=DELETE")
        self._db.close()

    def reset(self) -> None:
        """Empties every table (a new seed follows)."""
        with self._db:
            for table in _TABLES:
                self._db.execute(f"DELETE FROM {table}")

    def close(self) -> None:
        """Closes the file."""
        self._db.close()
