"""The live writer of the online store: card, merchant and terminal rows as the feature updater
computes them.

Rows are written in the layout materialization writes and ``OnlineFeatureReader`` reads:
the same entity keys, value types (Int64 or Float64 per the view's schema; a NaN code
becomes a null value, as materialization leaves it) and event timestamp (the entity's
newest transaction).

- SQLite: the rows Feast's ``online_write_batch`` writes (one per feature of an entity, its
  serialized value, text and timestamps), upserted with one ``executemany`` per view and one
  commit for all three; Feast's own call runs one statement per feature and commits per
  view, which was most of the updater's CPU (docs/liveloop.md). Where the store writes more
  columns (numeric or vector values) the writer calls Feast.
  ``tests/integration/test_feature_writer.py`` holds the rows equal to Feast's.
- Redis: one pipelined ``HSET`` per entity in a single round trip, with the keys and hashed
  field names Feast's Redis store computes (``feast_internals``, as the reader uses them),
  resolved once instead of hashing every field name of every row again. The write is
  unconditional, like Feast's ``skip_dedup`` mode: Feast's default skips a row whose event
  time is not newer than the stored one, yet a late event or a second transaction of the
  same instant changes the row without moving its time. One writer (the updater) owns the
  live rows; a ``features materialize`` run after live updates overwrites them with the
  batch rows, on either store, until the updater rewrites them (it does at start).
- The SQLite file is switched to write-ahead logging, so that the feature service's reads
  never wait for the updater's commits (in the default rollback-journal mode a reader
  that meets a commit sleeps in SQLite's busy handler), and the writer's commits do not
  wait for the disk (``synchronous=NORMAL``: a commit survives a killed process, and the
  rows are derived data the updater writes again from its states after a power loss, so
  the fsync per commit buys nothing; figures in docs/performance.md).
"""

from __future__ import annotations

import math
import sqlite3
import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from feast import FeatureView, RepoConfig
from feast.infra.online_stores.redis import RedisOnlineStore
from feast.infra.online_stores.sqlite import SqliteOnlineStore
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from feast.types import Int64
from google.protobuf.timestamp_pb2 import Timestamp
from redis.exceptions import RedisError

from services.common.errors import Unavailable
from services.domain import featurespec
from services.featurestore import feast_internals
from services.featurestore.admin import feature_store, not_applied
from services.featurestore.settings import FeatureStoreSettings


class Row(NamedTuple):
    """One entity's features as of its newest transaction."""

    entity_id: str
    """The card_id, merchant_id or terminal_id."""
    event_s: float
    """Epoch seconds of the entity's newest transaction (the row's event timestamp)."""
    values: dict[str, float]
    """Feature name → value (``aggregation.card_row`` / ``merchant_row`` / ``terminal_row``)."""


_FeastRow = tuple[EntityKey, dict[str, Value], datetime, datetime | None]
_SqliteRow = tuple[bytes, str, bytes, str | None, object, None]

_UPSERT = (
    "INSERT INTO {table} (entity_key, feature_name, value, value_text, event_ts, created_ts) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(entity_key, feature_name) DO UPDATE SET "
    "value = excluded.value, value_text = excluded.value_text, event_ts = excluded.event_ts, "
    "created_ts = excluded.created_ts"
)
"""Feast's SQLite upsert of one feature's row (``SqliteOnlineStore.online_write_batch``)."""

_VIEWS = (
    (featurespec.CARD_VIEW, "card_id", featurespec.CARD_FEATURES),
    (featurespec.MERCHANT_VIEW, "merchant_id", featurespec.MERCHANT_FEATURES),
    (featurespec.TERMINAL_VIEW, "terminal_id", featurespec.TERMINAL_FEATURES),
)
"""Each view the updater writes: its name, join key and features."""


class _ViewWriter:
    """One feature view: its join key and how each feature is typed in the store."""

    def __init__(self, view: FeatureView, join_key: str, names: tuple[str, ...]) -> None:
        self.view = view
        self.join_key = join_key
        types = {field.name: field.dtype for field in view.features}
        self.fields = tuple((name, types[name] == Int64) for name in names)
        self._sqlite_keys: dict[str, bytes] = {}
        """Entity id → its serialized key, for the entities written lately (``_KEYS_KEPT``)."""

    def entity_key(self, entity_id: str) -> EntityKey:
        """The Feast entity key of one entity of this view."""
        return EntityKey(join_keys=[self.join_key], entity_values=[Value(string_val=entity_id)])

    def values(self, row: Row) -> list[Value]:
        """The row's values in the view's order, typed as the schema says."""
        out = []
        for name, integer in self.fields:
            value = row.values[name]
            if math.isnan(value):
                out.append(Value())  # unknown: null, as materialization writes NaN
            elif integer:
                out.append(Value(int64_val=int(value)))
            else:
                out.append(Value(double_val=float(value)))
        return out

    def sqlite_rows(self, config: RepoConfig, rows: Sequence[Row]) -> list[_SqliteRow]:
        """The rows in the SQLite online store's table: one per feature of each entity. The
        event time is adapted for SQLite once per entity instead of once per feature."""
        out: list[_SqliteRow] = []
        keys = self._sqlite_keys
        for row in rows:
            key = keys.get(row.entity_id)
            if key is None:
                if len(keys) >= _KEYS_KEPT:
                    keys.clear()
                key = feast_internals.sqlite_entity_key(config, self.entity_key(row.entity_id))
                keys[row.entity_id] = key
            when = datetime.fromtimestamp(row.event_s, UTC).replace(tzinfo=None)
            stamp = feast_internals.sqlite_timestamp(when)
            values = row.values
            for name, integer in self.fields:
                value, text = stored_value(values[name], integer)
                out.append((key, name, value, text, stamp, None))
        return out

    def data(self, rows: Sequence[Row]) -> list[_FeastRow]:
        """The rows in the form ``online_write_batch`` takes."""
        names = [name for name, _ in self.fields]
        return [
            (
                self.entity_key(row.entity_id),
                dict(zip(names, self.values(row), strict=True)),
                datetime.fromtimestamp(row.event_s, UTC),
                None,
            )
            for row in rows
        ]


_KEYS_KEPT = 100_000
"""Serialized entity keys a view's writer keeps (a few MB); past this it starts over."""

_DOUBLE_VAL = b"\x29"
"""The tag of ``Value.double_val`` (field 5, 64-bit): a serialized double value starts so."""
_INT64_VAL = b"\x20"
"""The tag of ``Value.int64_val`` (field 4, varint)."""
_PACK_DOUBLE = struct.Struct("<d").pack
_SMALL_INT64 = tuple(_INT64_VAL + bytes((n,)) for n in range(128))
"""A serialized ``Value(int64_val=n)`` for each n whose varint is one byte (most counts)."""


def stored_value(value: float, integer: bool) -> tuple[bytes, str | None]:
    """The ``value`` and ``value_text`` columns the SQLite online store writes for one feature:
    the serialized ``Value`` message (``int64_val`` when ``integer``, else ``double_val``; an
    empty message for a NaN, which materialization leaves null) and Feast's text of it.

    Equal, byte for byte, to ``Value(...).SerializeToString()`` and Feast's
    ``extract_text_and_num`` (``tests/unit/test_feature_writer_values.py``), without building
    the message: a field of a ``oneof`` is written even when zero, so a value is its tag and
    then its 8 little-endian bytes or its varint."""
    if math.isnan(value):
        return b"", None
    if integer:
        number = int(value)
        if 0 <= number < 128:
            return _SMALL_INT64[number], str(number)
        if number < 0:  # ten-byte two's-complement varint: left to protobuf
            return Value(int64_val=number).SerializeToString(), str(number)
        varint = bytearray()
        rest = number
        while rest > 0x7F:
            varint.append((rest & 0x7F) | 0x80)
            rest >>= 7
        varint.append(rest)
        return _INT64_VAL + bytes(varint), str(number)
    real = float(value)
    return _DOUBLE_VAL + _PACK_DOUBLE(real), str(real)


class OnlineFeatureWriter:
    """Writes card, merchant and terminal rows to the configured online store (see the module
    doc).

    Not thread-safe: one thread (the updater's loop) writes.
    """

    def __init__(self, settings: FeatureStoreSettings, timeout_ms: float = 1000.0) -> None:
        if settings.store == "sqlite":
            _use_wal(settings)
        self._store = feature_store(settings, read_timeout_ms=timeout_ms, skip_dedup=True)
        try:
            views = tuple(
                (self._store.get_feature_view(view), key, names) for view, key, names in _VIEWS
            )
        except Exception as error:
            raise not_applied(settings) from error
        self._views = tuple(_ViewWriter(view, key, names) for view, key, names in views)
        """Card, merchant and terminal, the order ``write`` takes their rows in."""
        self._config = self._store.config
        self._online = feast_internals.online_store(self._store)
        self._redis_fields: tuple[list[str | bytes], ...] | None = None
        self._sqlite_upserts: tuple[str, ...] | None = None
        if isinstance(self._online, SqliteOnlineStore):
            connection = feast_internals.sqlite_connection(self._online, self._config)
            connection.execute("PRAGMA synchronous=NORMAL")
            if feast_internals.sqlite_plain_rows(self._config):
                self._sqlite_upserts = tuple(
                    _UPSERT.format(table=feast_internals.sqlite_table(self._config, w.view))
                    for w in self._views
                )
        elif isinstance(self._online, RedisOnlineStore):
            self._redis_fields = tuple(
                feast_internals.redis_hash_fields(self._online, self._config, view, names)
                for view, _, names in views
            )

    def write(
        self, cards: Sequence[Row], merchants: Sequence[Row], terminals: Sequence[Row] = ()
    ) -> None:
        """Writes the rows (one batch, or one per view); raises ``Unavailable`` when the store
        cannot take them (nothing is assumed written then: write them again)."""
        per_view = (cards, merchants, terminals)
        try:
            if self._redis_fields is not None:
                self._write_redis(per_view)
                return
            if self._sqlite_upserts is not None:
                self._write_sqlite(per_view)
                return
            for writer, rows in zip(self._views, per_view, strict=True):
                if rows:
                    self._online.online_write_batch(
                        self._config, writer.view, writer.data(rows), None
                    )
        except (RedisError, sqlite3.Error, OSError) as error:
            raise Unavailable(
                f"online store write failed: {type(error).__name__}: {error}"
            ) from error

    def _write_sqlite(self, per_view: tuple[Sequence[Row], ...]) -> None:
        online = self._online
        assert isinstance(online, SqliteOnlineStore) and self._sqlite_upserts is not None
        connection = feast_internals.sqlite_connection(online, self._config)
        with connection:
            for writer, upsert, rows in zip(
                self._views, self._sqlite_upserts, per_view, strict=True
            ):
                if rows:
                    connection.executemany(upsert, writer.sqlite_rows(self._config, rows))

    def _write_redis(self, per_view: tuple[Sequence[Row], ...]) -> None:
        online = self._online
        assert isinstance(online, RedisOnlineStore) and self._redis_fields is not None
        client = feast_internals.redis_client(online, self._config)
        with client.pipeline(transaction=False) as pipe:
            for writer, fields, rows in zip(self._views, self._redis_fields, per_view, strict=True):
                if not rows:
                    continue
                keys = feast_internals.redis_keys(
                    online, self._config, [writer.entity_key(r.entity_id) for r in rows]
                )
                for key, row in zip(keys, rows, strict=True):
                    stamp = Timestamp()
                    stamp.seconds, stamp.nanos = divmod(round(row.event_s * 1e9), 1_000_000_000)
                    mapping = {
                        field: value.SerializeToString()
                        for field, value in zip(fields, writer.values(row), strict=False)
                    }
                    mapping[fields[-1]] = stamp.SerializeToString()
                    pipe.hset(key, mapping=mapping)
            pipe.execute()

    def close(self) -> None:
        """Closes the store's connection."""
        feast_internals.close_sync_connections(self._online)


def _use_wal(settings: FeatureStoreSettings) -> None:
    """Switches the SQLite online store to write-ahead logging (a property of the file, kept
    across connections and restarts; the readers' connections use it from then on)."""
    path = settings.online_file
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=30)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()
