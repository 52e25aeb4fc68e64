"""The fraud team's lists, kept in the online store the features come from.

SQLite: two tables of their own in the online store's file (Feast touches only its views'
tables). Redis: one hash of entries and a generation counter beside Feast's keys. Every
change bumps the generation in the same transaction, so a gateway polls one small value
and reads the entries only when it moved; matching a payment is then done in memory, with
no read on the request path (docs/controls.md).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, cast

import redis

from services.domain.lists import ListEntry, ListKind, ListName, check_entry
from services.featurestore.settings import FeatureStoreSettings

_ENTRIES = "team_list_entries"
_GENERATION = "team_list_generation"
REDIS_ENTRIES = "fraudmesh:lists:entries"
"""The Redis hash of entries, field ``list|kind|value``, value the entry as JSON."""
REDIS_GENERATION = "fraudmesh:lists:generation"


def _as_json(entry: ListEntry) -> str:
    return json.dumps(
        {
            "kind": entry.kind.value,
            "value": entry.value,
            "list": entry.list.value,
            "reason": entry.reason,
            "expires_at_s": entry.expires_at_s,
            "added_at_s": entry.added_at_s,
            "actor": entry.actor,
        }
    )


def _from_json(text: str | bytes) -> ListEntry:
    d = json.loads(text)
    return ListEntry(
        ListKind(d["kind"]),
        d["value"],
        ListName(d["list"]),
        d["reason"],
        d["expires_at_s"],
        d["added_at_s"],
        d["actor"],
    )


class ListStore(Protocol):
    """Where the lists live: add (idempotent), remove, every entry, the generation."""

    def add(self, entry: ListEntry) -> bool:
        """Adds or replaces ``entry``; False when the same entry was already there."""
        ...

    def add_many(self, entries: Sequence[ListEntry]) -> int:
        """Adds or replaces every entry in one change; returns how many changed."""
        ...

    def remove(self, name: ListName, kind: ListKind, value: str) -> bool:
        """Removes an entry; False when there was none."""
        ...

    def remove_entry(self, entry: ListEntry) -> bool:
        """Removes ``entry`` only if it is still the one on its list (not replaced or removed
        since it was read); False otherwise."""
        ...

    def entries(self) -> tuple[int, list[ListEntry]]:
        """The generation and every entry, read together."""
        ...

    def generation(self) -> int:
        """A number that changes with every change of the lists."""
        ...

    def close(self) -> None:
        """Releases the connection."""
        ...


class SqliteListStore:
    """The lists in the SQLite online store's file."""

    def __init__(self, path: str, create: bool = True) -> None:
        # A gateway polls from its executor's threads, one call at a time.
        self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        if create:
            self._create()

    def _create(self) -> None:
        with self._write():
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {_ENTRIES} (list TEXT, kind TEXT, value TEXT, "
                "entry TEXT NOT NULL, PRIMARY KEY (list, kind, value))"
            )
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {_GENERATION} (id INTEGER PRIMARY KEY, n INTEGER)"
            )
            self._db.execute(f"INSERT OR IGNORE INTO {_GENERATION} VALUES (1, 0)")

    @contextmanager
    def _write(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _stored(self, key: tuple[str, str, str]) -> ListEntry | None:
        """The entry on (list, kind, value), or None (inside the caller's transaction)."""
        row = self._db.execute(
            f"SELECT entry FROM {_ENTRIES} WHERE list = ? AND kind = ? AND value = ?", key
        ).fetchone()
        return None if row is None else _from_json(row[0])

    def _bump(self) -> None:
        self._db.execute(f"UPDATE {_GENERATION} SET n = n + 1 WHERE id = 1")

    def add(self, entry: ListEntry) -> bool:
        """Adds or replaces ``entry``; False when the same entry was already there."""
        key = (entry.list.value, entry.kind.value, entry.value)
        with self._write():
            old = self._stored(key)
            if old is not None and _same(old, entry):
                return False
            self._db.execute(
                f"INSERT OR REPLACE INTO {_ENTRIES} VALUES (?, ?, ?, ?)", (*key, _as_json(entry))
            )
            self._bump()
        return True

    def add_many(self, entries: Sequence[ListEntry]) -> int:
        """Adds or replaces every entry in one transaction (one sync of the file, where one
        ``add`` each would sync once per entry); returns how many changed."""
        changed = 0
        with self._write():
            for entry in entries:
                key = (entry.list.value, entry.kind.value, entry.value)
                old = self._stored(key)
                if old is not None and _same(old, entry):
                    continue
                self._db.execute(
                    f"INSERT OR REPLACE INTO {_ENTRIES} VALUES (?, ?, ?, ?)",
                    (*key, _as_json(entry)),
                )
                changed += 1
            if changed:
                self._bump()
        return changed

    def remove(self, name: ListName, kind: ListKind, value: str) -> bool:
        """Removes an entry; False when there was none."""
        with self._write():
            gone = self._db.execute(
                f"DELETE FROM {_ENTRIES} WHERE list = ? AND kind = ? AND value = ?",
                (name.value, kind.value, value),
            ).rowcount
            if gone:
                self._bump()
        return bool(gone)

    def remove_entry(self, entry: ListEntry) -> bool:
        """Removes ``entry`` if it is still the one on its list; False otherwise."""
        key = (entry.list.value, entry.kind.value, entry.value)
        with self._write():
            if self._stored(key) != entry:
                return False
            self._db.execute(
                f"DELETE FROM {_ENTRIES} WHERE list = ? AND kind = ? AND value = ?", key
            )
            self._bump()
        return True

    def entries(self) -> tuple[int, list[ListEntry]]:
        """The generation and every entry, read in one transaction (none before the first
        change made the tables)."""
        self._db.execute("BEGIN")
        try:
            generation = self._generation()
            rows = (
                self._db.execute(f"SELECT entry FROM {_ENTRIES}").fetchall() if generation else []
            )
        finally:
            self._db.execute("COMMIT")
        return generation, [_from_json(row[0]) for row in rows]

    def _generation(self) -> int:
        try:
            row = self._db.execute(f"SELECT n FROM {_GENERATION} WHERE id = 1").fetchone()
        except sqlite3.OperationalError as error:
            # A reader does not create the tables: none yet means no change was ever made.
            if "no such table" in str(error):
                return 0
            raise
        return int(row[0]) if row else 0

    def generation(self) -> int:
        """The change counter."""
        return self._generation()

    def close(self) -> None:
        """Closes the connection."""
        self._db.close()


class RedisListStore:
    """The lists in the Redis online store, beside Feast's keys."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def add(self, entry: ListEntry) -> bool:
        """Adds or replaces ``entry``; False when the same entry was already there."""
        field = f"{entry.list.value}|{entry.kind.value}|{entry.value}"
        with self._client.pipeline() as pipe:
            pipe.watch(REDIS_ENTRIES)
            old = cast("bytes | None", pipe.hget(REDIS_ENTRIES, field))
            if old is not None and _same(_from_json(old), entry):
                return False
            pipe.multi()
            pipe.hset(REDIS_ENTRIES, field, _as_json(entry))
            pipe.incr(REDIS_GENERATION)
            pipe.execute()
        return True

    def add_many(self, entries: Sequence[ListEntry]) -> int:
        """Adds or replaces every entry in one transaction; returns how many changed."""
        fields = {f"{e.list.value}|{e.kind.value}|{e.value}": e for e in entries}
        if not fields:
            return 0
        with self._client.pipeline() as pipe:
            pipe.watch(REDIS_ENTRIES)
            olds = cast("list[bytes | None]", pipe.hmget(REDIS_ENTRIES, list(fields)))
            changed = {
                field: _as_json(entry)
                for (field, entry), old in zip(fields.items(), olds, strict=True)
                if old is None or not _same(_from_json(old), entry)
            }
            if not changed:
                return 0
            pipe.multi()
            pipe.hset(REDIS_ENTRIES, mapping=changed)
            pipe.incr(REDIS_GENERATION)
            pipe.execute()
        return len(changed)

    def remove(self, name: ListName, kind: ListKind, value: str) -> bool:
        """Removes an entry; False when there was none."""
        gone = self._client.hdel(REDIS_ENTRIES, f"{name.value}|{kind.value}|{value}")
        if gone:
            # After the removal: a reader that saw the old generation reads again.
            self._client.incr(REDIS_GENERATION)
        return bool(gone)

    def remove_entry(self, entry: ListEntry) -> bool:
        """Removes ``entry`` if it is still the one on its list; False otherwise (also when
        it changed while this ran: the transaction is then refused)."""
        field = f"{entry.list.value}|{entry.kind.value}|{entry.value}"
        with self._client.pipeline() as pipe:
            pipe.watch(REDIS_ENTRIES)
            old = cast("bytes | None", pipe.hget(REDIS_ENTRIES, field))
            if old is None or _from_json(old) != entry:
                return False
            pipe.multi()
            pipe.hdel(REDIS_ENTRIES, field)
            pipe.incr(REDIS_GENERATION)
            try:
                pipe.execute()
            except redis.WatchError:
                return False
        return True

    def entries(self) -> tuple[int, list[ListEntry]]:
        """The generation and every entry, read in one transaction."""
        with self._client.pipeline() as pipe:
            pipe.get(REDIS_GENERATION)
            pipe.hvals(REDIS_ENTRIES)
            generation, values = pipe.execute()
        return int(generation or 0), [_from_json(v) for v in values]

    def generation(self) -> int:
        """The change counter."""
        return int(cast("bytes | None", self._client.get(REDIS_GENERATION)) or 0)

    def close(self) -> None:
        """Closes the connection."""
        self._client.close()


def add_entry(
    store: ListStore,
    kind: ListKind,
    value: str,
    name: ListName,
    reason: str,
    expires_at_s: float | None,
    actor: str,
    now_s: float,
) -> bool:
    """Checks an entry (InvalidArgument naming the field, nothing written) and puts it on
    its list; False when the same entry was already there (adding is idempotent). The one
    way in for ``fraudmesh lists add`` and the console."""
    check_entry(kind, value, reason, expires_at_s, now_s)
    return store.add(ListEntry(kind, value, name, reason, expires_at_s, now_s, actor))


def _same(old: ListEntry, new: ListEntry) -> bool:
    """The same entry, whoever added it when: adding it again changes nothing."""
    return (old.reason, old.expires_at_s) == (new.reason, new.expires_at_s)


def open_lists(
    settings: FeatureStoreSettings, timeout_s: float = 5.0, reader: bool = False
) -> ListStore | None:
    """The lists of the configured online store; for a ``reader``, None when the SQLite
    file does not exist (a reader creates nothing: its root may be read-only)."""
    if settings.store == "redis":
        host, _, port = settings.redis_connection.split(",", 1)[0].rpartition(":")
        client = redis.Redis(
            host=host or "127.0.0.1",
            port=int(port or 6379),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        return RedisListStore(client)
    path = settings.online_file
    if reader:
        return SqliteListStore(str(path), create=False) if path.is_file() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteListStore(str(path))
