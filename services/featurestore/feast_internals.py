"""Every use of Feast's private API, in one place.

The request-path reader goes to the online store directly (no ``get_online_features``:
its request normalisation costs several times the read itself), and the offline store
reuses Feast's own resolution of feature references. Both need names Feast does not
promise to keep. They are wrapped here, each in one small function, and
``tests/unit/test_feast_internals.py`` fails with the name of what moved when a Feast
upgrade changes any of them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from feast import FeatureStore, FeatureView, RepoConfig
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import compute_table_id, extract_text_and_num
from feast.infra.online_stores.online_store import OnlineStore
from feast.infra.online_stores.redis import RedisOnlineStore, _versioned_fv_name
from feast.infra.online_stores.sqlite import SqliteOnlineStore
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.utils import _get_requested_feature_views_to_features_dict


def views_to_features(
    feature_refs: list[str], feature_views: list[FeatureView]
) -> dict[FeatureView, list[str]]:
    """The views ``feature_refs`` ("view:feature") name, each with its requested features."""
    views, _ = _get_requested_feature_views_to_features_dict(feature_refs, feature_views, [])
    return views


def online_store(store: FeatureStore) -> OnlineStore:
    """The online store object behind ``store`` (SQLite or Redis)."""
    return store._get_provider().online_store


def redis_client(online: RedisOnlineStore, config: RepoConfig) -> Any:
    """The synchronous redis-py client the Redis online store reads and writes with."""
    return online._get_client(config.online_store)


def redis_keys(
    online: RedisOnlineStore, config: RepoConfig, entity_keys: Sequence[EntityKey]
) -> list[bytes]:
    """The Redis key of each entity's hash, as Feast writes it."""
    return online._generate_redis_keys_for_entities(config, list(entity_keys))


def redis_hash_fields(
    online: RedisOnlineStore, config: RepoConfig, view: FeatureView, names: Sequence[str]
) -> list[str | bytes]:
    """The hash fields of ``names`` in ``view``'s rows, then the row's timestamp field."""
    name = _versioned_fv_name(view, config)
    _, fields = online._generate_hset_keys_for_features(view, list(names), fv_name_override=name)
    return fields


def sqlite_connection(online: SqliteOnlineStore, config: RepoConfig) -> sqlite3.Connection:
    """The SQLite connection the SQLite online store reads and writes with (opened if needed)."""
    connection: sqlite3.Connection = online._get_conn(config)
    return connection


def sqlite_path(config: RepoConfig) -> str:
    """The SQLite online store's file, resolved as the store resolves it."""
    path: str = SqliteOnlineStore._get_db_path(config)
    return path


def sqlite_table(config: RepoConfig, view: FeatureView) -> str:
    """The SQLite online store's table of ``view``, quoted, as Feast names it."""
    versioned = config.registry.enable_online_feature_view_versioning
    name = compute_table_id(config.project, view, versioned)
    return '"' + name.replace('"', '""') + '"'


def sqlite_plain_rows(config: RepoConfig) -> bool:
    """True when the SQLite online store writes a feature's row as (entity_key, feature_name,
    value, value_text, event_ts, created_ts) and nothing more (no numeric or vector column)."""
    online = config.online_store
    extra = ("enable_openai_compatible_store", "vector_enabled")
    return not any(getattr(online, name, False) for name in extra)


def sqlite_entity_key(config: RepoConfig, key: EntityKey) -> bytes:
    """An entity key as the SQLite online store stores it."""
    version = config.entity_key_serialization_version
    return serialize_entity_key(key, entity_key_serialization_version=version)


def sqlite_timestamp(when: datetime) -> object:
    """What the SQLite online store stores for a timestamp: the value of the adapter the
    store's module registers with ``sqlite3`` for ``datetime`` (epoch seconds of the naive
    time read in the local zone), which ``sqlite3`` would otherwise call for every row."""
    return sqlite3.adapters[(datetime, sqlite3.PrepareProtocol)](when)


def sqlite_value_text(value: Any) -> str | None:
    """The ``value_text`` column the SQLite online store writes beside a value."""
    text, _ = extract_text_and_num(value, False)
    return text


def close_sync_connections(online: OnlineStore) -> None:
    """Closes the synchronous SQLite connection or Redis client an online store opened.

    Feast only closes its asynchronous clients (``FeatureStore.close``); the synchronous
    ones live in private attributes of the store classes.
    """
    for attribute in ("_conn", "_client"):
        connection = getattr(online, attribute, None)
        if connection is not None:
            connection.close()
            setattr(online, attribute, None)
