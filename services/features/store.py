"""The Feast feature store built from settings: apply, materialize, read online.

Run-time layout: the data folder is the Feast repo path. It holds the Parquet sources
(the definitions in ``feature_repo/`` name them by relative path) and a generated
``feature_store.yaml`` matching the settings, so the stock CLI works on the same state:
``feast -c <data dir> feature-views list``, ``feast -c <data dir> serve``. The registry
and the SQLite online store live under ``<var_dir>/feast/`` by default.

Historical retrieval goes through Feast (``FeatureStore.get_historical_features``) with
``AsofFileOfflineStore``, a file offline store whose point-in-time join is a sorted
as-of merge. Feast's own file (Dask) store joins every entity row with every feature row
of its entity before filtering, which is quadratic in rows per entity (minutes and
gigabytes for per-transaction merchant tables), and it silently drops entity rows that
have no feature row inside the TTL instead of returning nulls.

Feast's ``FeatureView.ttl`` bounds that join but does not filter online reads, so
``OnlineFeatureReader`` judges freshness itself, from each value's event timestamp, with
the same TTLs (or the limits set in the settings).
"""

from __future__ import annotations

import contextlib
import io
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast

import dask.dataframe as dd
import numpy as np
import pandas as pd
import yaml
from feast import FeatureService, FeatureStore, FeatureView, RepoConfig
from feast.errors import FeatureServiceNotFoundException, FeatureViewNotFoundException
from feast.infra.offline_stores.dask import (
    DaskOfflineStore,
    DaskOfflineStoreConfig,
    DaskRetrievalJob,
)
from feast.infra.offline_stores.file_source import FileSource
from feast.infra.offline_stores.offline_store import RetrievalJob, RetrievalMetadata
from feast.infra.offline_stores.offline_utils import DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
from feast.infra.online_stores.redis import RedisOnlineStore, _versioned_fv_name
from feast.infra.registry.base_registry import BaseRegistry
from feast.protos.feast.serving.ServingService_pb2 import FieldStatus
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from feast.utils import _get_requested_feature_views_to_features_dict
from google.protobuf.timestamp_pb2 import Timestamp
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from services.common import featurespec
from services.common.errors import FailedPrecondition, Unavailable
from services.features import simulate
from services.features.feature_repo import definitions
from services.features.settings import FeaturesSettings

PRESENT = 1
"""Status of a fresh value (fraud.v1.FEATURE_STATUS_PRESENT)."""
MISSING = 2
"""Status of an unknown entity or a null value (fraud.v1.FEATURE_STATUS_MISSING)."""
STALE = 3
"""Status of a value older than its view's freshness limit (fraud.v1.FEATURE_STATUS_STALE)."""

FeatureRead = tuple[float | None, int, float | None]
"""(value or None, status, event timestamp in epoch seconds or None) of one feature."""

OBJECTS = (
    definitions.card,
    definitions.merchant,
    definitions.card_source,
    definitions.merchant_source,
    definitions.card_features,
    definitions.merchant_features,
    definitions.fraud_scoring,
)
"""Every Feast object of the repo, as ``apply`` registers them."""

VIEW_NAMES = (definitions.card_features.name, definitions.merchant_features.name)
"""The feature views, in the order materialize() loads them."""

_OFFLINE_STORE_TYPE = f"{__name__}.AsofFileOfflineStore"


class AsofFileOfflineStoreConfig(DaskOfflineStoreConfig):
    """Configuration of ``AsofFileOfflineStore`` (Feast finds it by the ``Config`` suffix)."""

    type: Literal["services.features.store.AsofFileOfflineStore"] = (
        "services.features.store.AsofFileOfflineStore"  # type: ignore[assignment]
    )


class AsofFileOfflineStore(DaskOfflineStore):
    """Feast's file offline store with an O(n log n) point-in-time join.

    Same semantics as Feast's: for each entity row, the latest feature row of that entity
    with ``event_timestamp <= entity timestamp`` and not older than the view's TTL; null
    features when there is none. Every entity row comes back once, in input order.
    Materialization and everything else is Feast's file store unchanged.
    """

    @staticmethod
    def get_historical_features(
        config: RepoConfig,
        feature_views: list[FeatureView],
        feature_refs: list[str],
        entity_df: pd.DataFrame | str | None,
        registry: BaseRegistry,
        project: str,
        full_feature_names: bool = False,
        filter_by_created_timestamp: bool = False,
        **kwargs: Any,
    ) -> RetrievalJob:
        """Point-in-time join of ``entity_df`` (pandas, with ``event_timestamp``)."""
        ts = DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
        if not isinstance(entity_df, pd.DataFrame) or ts not in entity_df.columns:
            raise ValueError(f"entity_df must be a pandas DataFrame with an {ts!r} column")
        if filter_by_created_timestamp and any(
            getattr(view.batch_source, "created_timestamp_column", None) for view in feature_views
        ):
            raise ValueError("filter_by_created_timestamp is not supported by this offline store")
        # No on-demand views: a reference to one fails here as an unknown view.
        views, _ = _get_requested_feature_views_to_features_dict(feature_refs, feature_views, [])
        entity_times = pd.to_datetime(entity_df[ts], utc=True)

        def evaluate() -> dd.DataFrame:
            joined = _asof_join(config, entity_df, views, full_feature_names)
            return dd.from_pandas(joined, npartitions=1, sort=False)

        return DaskRetrievalJob(
            evaluation_function=evaluate,
            full_feature_names=full_feature_names,
            repo_path=str(config.repo_path),
            metadata=RetrievalMetadata(
                features=feature_refs,
                keys=[c for c in entity_df.columns if c != ts],
                min_event_timestamp=entity_times.min().to_pydatetime(),
                max_event_timestamp=entity_times.max().to_pydatetime(),
            ),
        )


def _asof_join(
    config: RepoConfig,
    entity_df: pd.DataFrame,
    views: Mapping[FeatureView, list[str]],
    full_feature_names: bool,
) -> pd.DataFrame:
    ts = DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
    row = "__entity_row"
    feature_ts = "__feature_ts"
    left = entity_df.copy()
    left[ts] = pd.to_datetime(left[ts], utc=True).astype("datetime64[ns, UTC]")
    left[row] = np.arange(len(left))
    left = left.sort_values(ts, kind="stable")
    for view, features in views.items():
        source = view.batch_source
        assert isinstance(source, FileSource)
        path = FileSource.get_uri_for_file_path(config.repo_path, source.path)
        right = pd.read_parquet(path).rename(columns=dict(source.field_mapping))
        keys = {
            column.name: view.projection.join_key_map.get(column.name, column.name)
            for column in view.entity_columns
        }
        prefix = f"{view.projection.name_to_use()}__" if full_feature_names else ""
        order = [source.timestamp_field]
        if source.created_timestamp_column:
            # Equal event times: the latest created row wins, as in Feast's stores.
            order.append(source.created_timestamp_column)
        right = right.sort_values(order, kind="stable")
        right = pd.DataFrame(
            {
                **{alias: right[name].to_numpy() for name, alias in keys.items()},
                feature_ts: pd.to_datetime(right[source.timestamp_field], utc=True)
                .astype("datetime64[ns, UTC]")
                .to_numpy(),
                **{prefix + f: right[f].to_numpy() for f in features},
            }
        )
        ttl = view.ttl if view.ttl and view.ttl > timedelta(0) else None
        left = pd.merge_asof(
            left,
            right,
            left_on=ts,
            right_on=feature_ts,
            by=list(keys.values()),
            direction="backward",
            allow_exact_matches=True,
            tolerance=pd.Timedelta(ttl) if ttl else None,
        ).drop(columns=feature_ts)
    return left.sort_values(row).drop(columns=row).reset_index(drop=True)


def repo_config(settings: FeaturesSettings) -> RepoConfig:
    """The Feast configuration the settings describe (absolute paths)."""
    if settings.store == "redis":
        online: dict[str, Any] = {
            "type": "redis",
            "connection_string": settings.redis_connection,
        }
    else:
        online = {"type": "sqlite", "path": str(settings.online_file.resolve())}
    return RepoConfig(
        project=settings.project,
        provider="local",
        registry={
            "registry_type": "file",
            "path": str(settings.registry_file.resolve()),
            # Never expire: an expired cache is reloaded synchronously inside a read. With
            # this, a reader keeps the definitions it first resolved (materializing needs
            # no reload); restart the feature service after an apply that changes them.
            "cache_ttl_seconds": 0,
        },
        online_store=online,
        offline_store={"type": _OFFLINE_STORE_TYPE},
        entity_key_serialization_version=3,
        repo_path=settings.data_path.resolve(),
    )


def write_feature_store_yaml(settings: FeaturesSettings) -> Path:
    """Writes ``feature_store.yaml`` for the stock ``feast`` CLI into the data folder."""
    config = repo_config(settings)
    data_dir = settings.data_path
    data_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "project": config.project,
        "provider": config.provider,
        "registry": config.registry_config,
        "online_store": config.online_config,
        "offline_store": config.offline_config,
        "entity_key_serialization_version": config.entity_key_serialization_version,
    }
    path = data_dir / "feature_store.yaml"
    path.write_text(
        "# Generated from the fraudmesh feature settings; rewritten on every apply.\n"
        + yaml.safe_dump(document, sort_keys=False)
    )
    return path


def feature_store(settings: FeaturesSettings, read_timeout_ms: float | None = None) -> FeatureStore:
    """A FeatureStore on the configured registry, online and offline stores.

    ``read_timeout_ms`` bounds every Redis socket operation (connect, send, receive) of
    the store, unless the connection string sets its own; for request-path readers, not
    for materialization, whose large pipelined writes take longer.
    """
    settings.registry_file.parent.mkdir(parents=True, exist_ok=True)
    if settings.store == "sqlite":
        settings.online_file.parent.mkdir(parents=True, exist_ok=True)
    config = repo_config(settings)
    if settings.store == "redis" and read_timeout_ms is not None:
        connection = settings.redis_connection
        timeout_s = read_timeout_ms / 1000
        for option in ("socket_timeout", "socket_connect_timeout"):
            if f"{option}=" not in connection:
                connection += f",{option}={timeout_s}"
        config = repo_config(settings.model_copy(update={"redis_connection": connection}))
    return FeatureStore(config=config)


def apply(settings: FeaturesSettings) -> None:
    """Registers the repo's entities, sources, views and service; writes feature_store.yaml."""
    write_feature_store_yaml(settings)
    store = feature_store(settings)
    with _quiet():
        store.apply(list(OBJECTS))


def _not_applied(settings: FeaturesSettings) -> FailedPrecondition:
    return FailedPrecondition(
        f"the Feast registry {settings.registry_file} lacks the fraud features: "
        "run `fraudmesh features apply`"
    )


MaterializeProgress = Callable[[str, int, int], None]
"""Called with (view name, views done, views total) before each view and once at the end."""


def materialize(settings: FeaturesSettings, progress: MaterializeProgress | None = None) -> None:
    """Loads each entity's newest row in the data window into the online store."""
    if not simulate.data_present(settings.data_path):
        raise FailedPrecondition(
            f"no simulated data in {settings.data_path}: run `fraudmesh features simulate`"
        )
    store = feature_store(settings)
    for view in VIEW_NAMES:
        try:
            store.get_feature_view(view)
        except FeatureViewNotFoundException as error:
            raise _not_applied(settings) from error
    start, end = _data_window(settings.data_path)
    for done, view in enumerate(VIEW_NAMES):
        if progress is not None:
            progress(view, done, len(VIEW_NAMES))
        with _quiet():
            store.materialize(start_date=start, end_date=end, feature_views=[view])
    if progress is not None:
        progress("", len(VIEW_NAMES), len(VIEW_NAMES))


def _data_window(data_dir: Path) -> tuple[datetime, datetime]:
    """First and last event time in the feature tables; the end is one second past the last
    event so that Feast's end bound, which is exclusive, keeps the newest row."""
    times = pd.concat(
        [
            pd.read_parquet(data_dir / name, columns=["event_timestamp"])["event_timestamp"]
            for name in (simulate.CARD_FEATURES_FILE, simulate.MERCHANT_FEATURES_FILE)
        ]
    )
    start = times.min().to_pydatetime().astimezone(UTC)
    end = times.max().to_pydatetime().astimezone(UTC) + timedelta(seconds=1)
    return start, end


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Swallows Feast's progress prints so the CLI's own output stays readable."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


_STATUS_PRESENT = FieldStatus.PRESENT
_STATUS_OUTSIDE_MAX_AGE = FieldStatus.OUTSIDE_MAX_AGE

_MISSING_READ: FeatureRead = (None, MISSING, None)


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
        status = PRESENT if as_of_s - event_s <= self.max_age_s else STALE
        for offset, name in enumerate(self.names):
            value = values.get(name)
            # ListFields is the cheapest way to the one set field of the Value oneof; an
            # unset Value is a null the materialization wrote.
            fields = value.ListFields() if value is not None else ()
            if fields:
                out[self.first + offset] = (float(fields[0][1]), status, event_s)


class OnlineFeatureReader:
    """Reads the store features of one card and one merchant from Feast's online store.

    Feast owns the definitions, the keys and the stored layout; on the request path the
    reader skips ``FeatureStore.get_online_features`` (request normalisation, registry
    lookups, response building and type conversions, 0.5-0.7 ms of CPU a read here) and
    goes to the online store with everything resolved once at start:

    - SQLite: the store's own ``online_read`` for each view (about 0.11 ms a read);
    - Redis: one pipelined ``HMGET`` of both entities' hashes in a single round trip, with
      the keys and hashed field names computed by Feast's Redis store (about 0.15 ms),
      over a connection whose socket timeout (``redis_timeout_ms``, no retries) bounds a
      hung server.

    ``read_generic`` is the same read through ``get_online_features``; tests hold the two
    equal. Freshness is judged here, from each view's event timestamp against ``as_of_s``
    (Feast does not filter online reads by TTL).

    Thread-safe: reads are serialized by a lock, because Feast's online stores open their
    connections lazily without locking and the SQLite store shares one connection.
    """

    def __init__(self, settings: FeaturesSettings) -> None:
        self._store = feature_store(settings, read_timeout_ms=settings.redis_timeout_ms)
        try:
            self._service: FeatureService = self._store.get_feature_service(
                definitions.FEATURE_SERVICE
            )
            card_view = self._store.get_feature_view(featurespec.CARD_VIEW)
            merchant_view = self._store.get_feature_view(featurespec.MERCHANT_VIEW)
        except (FeatureServiceNotFoundException, FeatureViewNotFoundException) as error:
            raise _not_applied(settings) from error
        card_age = settings.card_max_age_s or definitions.CARD_TTL.total_seconds()
        merchant_age = settings.merchant_max_age_s or definitions.MERCHANT_TTL.total_seconds()
        self._card = _View(card_view, "card_id", featurespec.CARD_FEATURES, 0, card_age)
        self._merchant = _View(
            merchant_view,
            "merchant_id",
            featurespec.MERCHANT_FEATURES,
            len(featurespec.CARD_FEATURES),
            merchant_age,
        )
        self._config = self._store.config
        self._online = self._store._get_provider().online_store
        self._read: Callable[[str, str, float], list[FeatureRead]]
        if isinstance(self._online, RedisOnlineStore):
            self._hash_fields = tuple(self._redis_fields(v) for v in (self._card, self._merchant))
            # No retries: redis-py's default (three, with backoff up to seconds) turns a
            # hung server into a multi-second stall; a failed read is answered with
            # defaults by the gateway and the next read reconnects.
            self._online._get_client(self._config.online_store).set_retry(Retry(NoBackoff(), 0))
            self._read = self._read_redis
        else:
            self._read = self._read_views
        self._lock = threading.Lock()

    def read(self, card_id: str, merchant_id: str, as_of_s: float) -> list[FeatureRead]:
        """Each STORE_FEATURES value with its status, judged fresh against ``as_of_s``."""
        try:
            with self._lock:
                return self._read(card_id, merchant_id, as_of_s)
        except (RedisError, sqlite3.Error) as error:
            # UNAVAILABLE, not INTERNAL: the caller falls back and the next read retries.
            raise Unavailable(
                f"online store read failed: {type(error).__name__}: {error}"
            ) from error

    def _read_views(self, card_id: str, merchant_id: str, as_of_s: float) -> list[FeatureRead]:
        out = [_MISSING_READ] * len(featurespec.STORE_FEATURES)
        for view, value in ((self._card, card_id), (self._merchant, merchant_id)):
            ((stamp, values),) = self._online.online_read(
                self._config, view.view, [view.entity_key(value)], list(view.names)
            )
            view.fill(out, stamp.timestamp() if stamp is not None else None, values, as_of_s)
        return out

    def _redis_fields(self, view: _View) -> list[str | bytes]:
        online = self._online
        assert isinstance(online, RedisOnlineStore)
        name = _versioned_fv_name(view.view, self._config)
        # The hashed field of each feature, then the view's timestamp field, last.
        _, fields = online._generate_hset_keys_for_features(
            view.view, list(view.names), fv_name_override=name
        )
        return fields

    def _read_redis(self, card_id: str, merchant_id: str, as_of_s: float) -> list[FeatureRead]:
        online = self._online
        assert isinstance(online, RedisOnlineStore)
        card, merchant = self._card, self._merchant
        keys = online._generate_redis_keys_for_entities(
            self._config, [card.entity_key(card_id), merchant.entity_key(merchant_id)]
        )
        replies = online._read_hash_fields(
            self._config, list(zip(keys, self._hash_fields, strict=True))
        )
        out = [_MISSING_READ] * len(featurespec.STORE_FEATURES)
        for view, reply in zip((card, merchant), replies, strict=True):
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

    def read_generic(self, card_id: str, merchant_id: str, as_of_s: float) -> list[FeatureRead]:
        """The same read through ``FeatureStore.get_online_features`` (slower; the reference)."""
        with self._lock:
            response = self._store.get_online_features(
                self._service, [{"card_id": card_id, "merchant_id": merchant_id}]
            ).proto
        out = [_MISSING_READ] * len(featurespec.STORE_FEATURES)
        slots = {
            name: (view.first + offset, view.max_age_s)
            for view in (self._card, self._merchant)
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
            out[index] = (float(fields[0][1]), PRESENT if fresh else STALE, event_s)
        return out

    def close(self) -> None:
        """Closes the online store's connection (SQLite file or Redis client)."""
        online_store = self._online
        # Feast only closes its async clients (FeatureStore.close); the sync ones the reads
        # use are private attributes of the store classes.
        for attribute in ("_conn", "_client"):
            connection = getattr(online_store, attribute, None)
            if connection is not None:
                connection.close()
                setattr(online_store, attribute, None)
