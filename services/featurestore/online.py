"""The request-path reader of the online store: one card's, merchant's and terminal's features.

Feast's ``FeatureView.ttl`` bounds the offline point-in-time join but does not filter
online reads, so ``OnlineFeatureReader`` judges freshness itself, from each value's event
timestamp, with the same TTLs (or the limits set in the settings).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from feast import FeatureService, FeatureView
from feast.errors import FeatureServiceNotFoundException, FeatureViewNotFoundException
from feast.infra.online_stores.redis import RedisOnlineStore
from feast.protos.feast.serving.ServingService_pb2 import FieldStatus
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from google.protobuf.timestamp_pb2 import Timestamp
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from services.common.errors import Unavailable
from services.domain import featurespec
from services.domain.featurespec import MISSING_READ, FeatureRead, FeatureStatus
from services.featurestore import feast_internals
from services.featurestore.admin import feature_store, not_applied
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings

_STATUS_PRESENT = FieldStatus.PRESENT
_STATUS_OUTSIDE_MAX_AGE = FieldStatus.OUTSIDE_MAX_AGE


class _View:
    """One feature view as the reader needs it: resolved once, used on every read."""

    def __init__(
        self, view: FeatureView, join_key: str, names: tuple[str, ...], first: int, max_age_s: float
    ) -> None:
        self.view = view
        self.join_key = join_key
        self.names = names
        self.first = first
        self.max_age_s = max_age_s

    def entity_key(self, value: str) -> EntityKey:
        return EntityKey(join_keys=[self.join_key], entity_values=[Value(string_val=value)])

    def fill(
        self,
        out: list[FeatureRead],
        event_s: float | None,
        values: Mapping[str, Value] | None,
        as_of_s: float,
    ) -> None:
        """Writes this view's slots of ``out`` from one entity's stored row."""
        if event_s is None or values is None:
            return  # an unknown entity: every slot stays MISSING
        status = (
            FeatureStatus.PRESENT if as_of_s - event_s <= self.max_age_s else FeatureStatus.STALE
        )
        for offset, name in enumerate(self.names):
            value = values.get(name)
            # ListFields is the cheapest way to the one set field of the Value oneof; an
            # unset Value is a null the materialization wrote.
            fields = value.ListFields() if value is not None else ()
            if fields:
                out[self.first + offset] = FeatureRead(float(fields[0][1]), status, event_s)


def _store_seconds(raw: object) -> float:
    """Epoch seconds of an ``event_ts`` cell of the SQLite store, read as its own converter
    reads it: the store writes a naive UTC time through ``datetime.timestamp`` (the local
    zone's reading of it) and reads it back through ``datetime.fromtimestamp`` as UTC."""
    local = datetime.fromtimestamp(int(raw))  # type: ignore[call-overload]
    return local.replace(tzinfo=UTC).timestamp()


class _SqliteRows:
    """The SQLite store's rows of one card, merchant and terminal in one statement.

    Feast's ``online_read`` runs one query per view and, through the type converters of its
    connection, parses a timestamp for every feature's row; this reads the three views'
    tables in one ``UNION ALL`` over a connection of its own without converters, and parses
    each distinct timestamp once. The tables, keys and values are the store's own
    (``feast_internals``); ``read_generic`` is the reference the tests hold it equal to.
    The connection opens on the first read, as Feast's does, so that a store file or folder
    that is not there yet fails that read (UNAVAILABLE) rather than the reader's start.
    """

    def __init__(self, path: str, tables: Sequence[str]) -> None:
        self._path = path
        self._connection: sqlite3.Connection | None = None
        selects = [
            f"SELECT {index}, feature_name, value, event_ts FROM {table} WHERE entity_key = ?"
            for index, table in enumerate(tables)
        ]
        self._statements = {
            count: " UNION ALL ".join(selects[:count]) for count in range(1, len(selects) + 1)
        }

    def rows(self, keys: Sequence[bytes]) -> list[tuple[int, str, bytes, object]]:
        """(view index, feature name, serialized value, event_ts) of each stored feature of
        the entities ``keys`` name, one per view in order."""
        if self._connection is None:
            connection = sqlite3.connect(self._path, check_same_thread=False)
            connection.execute("PRAGMA query_only=ON")
            self._connection = connection
        return self._connection.execute(self._statements[len(keys)], keys).fetchall()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class OnlineFeatureReader:
    """Reads the store features of one card, one merchant and, when the payment names one, one
    terminal from Feast's online store.

    Feast owns the definitions, the keys and the stored layout; on the request path the
    reader skips ``FeatureStore.get_online_features`` (request normalisation, registry
    lookups, response building and type conversions: most of a read's CPU, figures in
    docs/performance.md) and goes to the online store with everything resolved once at start:

    - SQLite: one statement for the three views' rows (``_SqliteRows``), each value decoded
      once, each feature with its own row's timestamp;
    - Redis: one pipelined ``HMGET`` of the entities' hashes in a single round trip, with
      the keys and hashed field names computed by Feast's Redis store, over a connection
      whose socket timeout (``redis_timeout_ms``, no retries) bounds a hung server.

    ``read_generic`` is the same read through ``get_online_features``; tests hold the two
    equal. Freshness is judged here, from each view's event timestamp against ``as_of_s``
    (Feast does not filter online reads by TTL).

    Thread-safe: reads are serialized by a lock, because Feast's online stores open their
    connections lazily without locking and the SQLite store shares one connection.
    """

    def __init__(self, settings: FeatureStoreSettings) -> None:
        self._store = feature_store(settings, read_timeout_ms=settings.redis_timeout_ms)
        try:
            self._service: FeatureService = self._store.get_feature_service(
                definitions.FEATURE_SERVICE
            )
            card_view = self._store.get_feature_view(featurespec.CARD_VIEW)
            merchant_view = self._store.get_feature_view(featurespec.MERCHANT_VIEW)
            terminal_view = self._store.get_feature_view(featurespec.TERMINAL_VIEW)
        except (FeatureServiceNotFoundException, FeatureViewNotFoundException) as error:
            raise not_applied(settings) from error
        card_age = settings.card_max_age_s or definitions.CARD_TTL.total_seconds()
        merchant_age = settings.merchant_max_age_s or definitions.MERCHANT_TTL.total_seconds()
        terminal_age = settings.terminal_max_age_s or definitions.TERMINAL_TTL.total_seconds()
        n_card, n_merchant = len(featurespec.CARD_FEATURES), len(featurespec.MERCHANT_FEATURES)
        self._card = _View(card_view, "card_id", featurespec.CARD_FEATURES, 0, card_age)
        self._merchant = _View(
            merchant_view, "merchant_id", featurespec.MERCHANT_FEATURES, n_card, merchant_age
        )
        self._terminal = _View(
            terminal_view,
            "terminal_id",
            featurespec.TERMINAL_FEATURES,
            n_card + n_merchant,
            terminal_age,
        )
        self._views = (self._card, self._merchant, self._terminal)
        self._config = self._store.config
        self._online = feast_internals.online_store(self._store)
        self._read: Callable[[tuple[str, str, str], float], list[FeatureRead]]
        if isinstance(self._online, RedisOnlineStore):
            self._hash_fields = tuple(self._redis_fields(v) for v in self._views)
            # No retries: redis-py's default (three, with backoff up to seconds) turns a
            # hung server into a multi-second stall; a failed read is answered with
            # defaults by the gateway and the next read reconnects.
            feast_internals.redis_client(self._online, self._config).set_retry(
                Retry(NoBackoff(), 0)
            )
            self._read = self._read_redis
        else:
            self._sqlite = _SqliteRows(
                feast_internals.sqlite_path(self._config),
                [feast_internals.sqlite_table(self._config, v.view) for v in self._views],
            )
            self._slots = tuple(
                {name: v.first + offset for offset, name in enumerate(v.names)} for v in self._views
            )
            self._read = self._read_sqlite
        self._lock = threading.Lock()

    def read(
        self, card_id: str, merchant_id: str, as_of_s: float, terminal_id: str = ""
    ) -> list[FeatureRead]:
        """Each STORE_FEATURES value with its status, judged fresh against ``as_of_s``; the
        terminal's features are MISSING when ``terminal_id`` is empty (none is looked up)."""
        try:
            with self._lock:
                return self._read((card_id, merchant_id, terminal_id), as_of_s)
        except (RedisError, sqlite3.Error) as error:
            # UNAVAILABLE, not INTERNAL: the caller falls back and the next read retries.
            raise Unavailable(
                f"online store read failed: {type(error).__name__}: {error}"
            ) from error

    def read_many(self, lookups: Sequence[tuple[str, str, float, str]]) -> list[list[FeatureRead]]:
        """``read`` for several (card_id, merchant_id, as_of_s, terminal_id) lookups at once:
        on Redis one pipelined round trip for all their hashes, otherwise one read each."""
        try:
            with self._lock:
                if self._read == self._read_redis and len(lookups) > 1:
                    return self._read_redis_many(lookups)
                return [self._read((c, m, t), as_of) for c, m, as_of, t in lookups]
        except (RedisError, sqlite3.Error) as error:
            raise Unavailable(
                f"online store read failed: {type(error).__name__}: {error}"
            ) from error

    def _read_sqlite(self, ids: tuple[str, str, str], as_of_s: float) -> list[FeatureRead]:
        # A payment without a terminal reads two views, not three.
        views = self._views if ids[2] else self._views[:2]
        keys = [
            feast_internals.sqlite_entity_key(self._config, view.entity_key(value))
            for view, value in zip(views, ids, strict=False)
        ]
        out = [MISSING_READ] * len(featurespec.STORE_FEATURES)
        seconds: dict[object, float] = {}
        for index, name, raw, stamp in self._sqlite.rows(keys):
            slot = self._slots[index].get(name)
            if slot is None or raw is None or stamp is None:
                continue  # a feature this reader does not serve, or a row without a time
            value = Value.FromString(raw)
            which = value.WhichOneof("val")
            if which is None:
                continue  # a null the materialization wrote
            event_s = seconds.get(stamp)
            if event_s is None:
                event_s = seconds[stamp] = _store_seconds(stamp)
            fresh = as_of_s - event_s <= self._views[index].max_age_s
            out[slot] = FeatureRead(
                float(getattr(value, which)),
                FeatureStatus.PRESENT if fresh else FeatureStatus.STALE,
                event_s,
            )
        return out

    def _redis_fields(self, view: _View) -> list[str | bytes]:
        online = self._online
        assert isinstance(online, RedisOnlineStore)
        return feast_internals.redis_hash_fields(online, self._config, view.view, view.names)

    def _read_redis(self, ids: tuple[str, str, str], as_of_s: float) -> list[FeatureRead]:
        online = self._online
        assert isinstance(online, RedisOnlineStore)
        # A payment without a terminal reads two hashes, not three.
        views = self._views if ids[2] else self._views[:2]
        keys = feast_internals.redis_keys(
            online,
            self._config,
            [view.entity_key(value) for view, value in zip(views, ids, strict=False)],
        )
        # One round trip: the entities' hashes in a single non-transactional pipeline.
        with feast_internals.redis_client(online, self._config).pipeline(transaction=False) as pipe:
            for key, fields in zip(keys, self._hash_fields, strict=False):
                pipe.hmget(key, fields)
            replies = pipe.execute()
        return self._redis_rows(views, replies, as_of_s)

    def _read_redis_many(
        self, lookups: Sequence[tuple[str, str, float, str]]
    ) -> list[list[FeatureRead]]:
        online = self._online
        assert isinstance(online, RedisOnlineStore)
        plans = []
        entity_keys: list[EntityKey] = []
        for card_id, merchant_id, _, terminal_id in lookups:
            ids = (card_id, merchant_id, terminal_id)
            views = self._views if terminal_id else self._views[:2]
            plans.append(views)
            entity_keys.extend(view.entity_key(v) for view, v in zip(views, ids, strict=False))
        keys = feast_internals.redis_keys(online, self._config, entity_keys)
        # One round trip for every lookup's hashes.
        with feast_internals.redis_client(online, self._config).pipeline(transaction=False) as pipe:
            at = 0
            for views in plans:
                for key, fields in zip(keys[at : at + len(views)], self._hash_fields, strict=False):
                    pipe.hmget(key, fields)
                at += len(views)
            replies = pipe.execute()
        rows = []
        at = 0
        for views, (_, _, as_of_s, _) in zip(plans, lookups, strict=True):
            rows.append(self._redis_rows(views, replies[at : at + len(views)], as_of_s))
            at += len(views)
        return rows

    def _redis_rows(
        self, views: Sequence[_View], replies: Sequence[Any], as_of_s: float
    ) -> list[FeatureRead]:
        out = [MISSING_READ] * len(featurespec.STORE_FEATURES)
        for view, reply in zip(views, replies, strict=True):
            raw_stamp = reply[-1]
            if not raw_stamp:
                continue  # no timestamp field: the entity was never materialized
            stamp = Timestamp.FromString(cast(bytes, raw_stamp))
            values = {
                name: Value.FromString(cast(bytes, raw))
                for name, raw in zip(view.names, reply, strict=False)
                if raw
            }
            view.fill(out, stamp.seconds + stamp.nanos * 1e-9, values, as_of_s)
        return out

    def read_generic(
        self, card_id: str, merchant_id: str, as_of_s: float, terminal_id: str = ""
    ) -> list[FeatureRead]:
        """The same read through ``FeatureStore.get_online_features`` (slower; the reference)."""
        row = {"card_id": card_id, "merchant_id": merchant_id, "terminal_id": terminal_id}
        with self._lock:
            response = self._store.get_online_features(self._service, [row]).proto
        out = [MISSING_READ] * len(featurespec.STORE_FEATURES)
        views = self._views if terminal_id else self._views[:2]
        slots = {
            name: (view.first + offset, view.max_age_s)
            for view in views
            for offset, name in enumerate(view.names)
        }
        # The response lists features in an order of Feast's choosing; match them by name.
        for name, vector in zip(response.metadata.feature_names.val, response.results, strict=True):
            slot = slots.get(name)
            if slot is None:  # a join key echoed back
                continue
            status = vector.statuses[0]
            if status != _STATUS_PRESENT and status != _STATUS_OUTSIDE_MAX_AGE:
                continue
            fields = vector.values[0].ListFields()
            if not fields:
                continue
            stamp = vector.event_timestamps[0]
            event_s = stamp.seconds + stamp.nanos * 1e-9
            index, max_age = slot
            fresh = as_of_s - event_s <= max_age
            out[index] = FeatureRead(
                float(fields[0][1]),
                FeatureStatus.PRESENT if fresh else FeatureStatus.STALE,
                event_s,
            )
        return out

    def close(self) -> None:
        """Closes the online store's connections (SQLite file or Redis client)."""
        if self._read == self._read_sqlite:
            self._sqlite.close()
        feast_internals.close_sync_connections(self._online)
