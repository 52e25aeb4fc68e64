"""An offline store for Feast: its file store with an O(n log n) point-in-time join.

Historical retrieval goes through Feast (``FeatureStore.get_historical_features``) with
``AsofFileOfflineStore``, a file offline store whose point-in-time join is a sorted
as-of merge. Feast's own file (Dask) store joins every entity row with every feature row
of its entity before filtering, which is quadratic in rows per entity (minutes and
gigabytes for per-transaction merchant tables), and it silently drops entity rows that
have no feature row inside the TTL instead of returning nulls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
from feast import FeatureView, RepoConfig
from feast.infra.offline_stores.dask import (
    DaskOfflineStore,
    DaskOfflineStoreConfig,
    DaskRetrievalJob,
)
from feast.infra.offline_stores.file_source import FileSource
from feast.infra.offline_stores.offline_store import RetrievalJob, RetrievalMetadata
from feast.infra.offline_stores.offline_utils import DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
from feast.infra.registry.base_registry import BaseRegistry

from services.featurestore import feast_internals

STORE_TYPE = f"{__name__}.AsofFileOfflineStore"
"""The ``offline_store.type`` that selects this store in a Feast configuration."""


class AsofFileOfflineStoreConfig(DaskOfflineStoreConfig):
    """Configuration of ``AsofFileOfflineStore`` (Feast finds it by the ``Config`` suffix)."""

    type: Literal["services.featurestore.offline.AsofFileOfflineStore"] = (
        "services.featurestore.offline.AsofFileOfflineStore"  # type: ignore[assignment]
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
        views = feast_internals.views_to_features(feature_refs, feature_views)
        entity_times = pd.to_datetime(entity_df[ts], utc=True)

        def join() -> pd.DataFrame:
            return _asof_join(config, entity_df, views, full_feature_names)

        def evaluate() -> dd.DataFrame:
            return dd.from_pandas(join(), npartitions=1, sort=False)

        return AsofRetrievalJob(
            join,
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


class AsofRetrievalJob(DaskRetrievalJob):
    """Feast's file retrieval job, handing the joined pandas frame over as it is.

    ``RetrievalJob.to_df`` converts through Arrow and back (for on-demand views and
    validation, which this store does not serve): two more copies of a frame that holds
    every training row. Everything else is the Dask job's.
    """

    def __init__(self, join: Callable[[], pd.DataFrame], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._join = join

    def to_df(self, validation_reference: Any = None, timeout: int | None = None) -> pd.DataFrame:
        """The joined frame (input order, a fresh index)."""
        if validation_reference is not None:
            return super().to_df(validation_reference=validation_reference, timeout=timeout)
        return self._join()

    def _to_df_internal(self, timeout: int | None = None) -> pd.DataFrame:
        return self._join()

    def _to_arrow_internal(self, timeout: int | None = None) -> pa.Table:
        return pa.Table.from_pandas(self._join(), preserve_index=False)


def _asof_join(
    config: RepoConfig,
    entity_df: pd.DataFrame,
    views: Mapping[FeatureView, list[str]],
    full_feature_names: bool,
) -> pd.DataFrame:
    """``entity_df`` with each view's features as of each row's timestamp, in input order.

    The as-of merge runs on small frames (keys, times, row positions) and finds, for every
    entity row, the position of its feature row; the features are then gathered by
    position. Wide frames are never merged or copied: training joins millions of rows.
    """
    ts = DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
    row, position, feature_ts = "__entity_row", "__feature_row", "__feature_ts"
    columns: dict[str, object] = {name: entity_df[name].array for name in entity_df.columns}
    times = pd.to_datetime(entity_df[ts], utc=True).astype("datetime64[ns, UTC]")
    columns[ts] = times.array
    order = np.argsort(times.to_numpy(), kind="stable")
    for view, features in views.items():
        source = view.batch_source
        assert isinstance(source, FileSource)
        path = FileSource.get_uri_for_file_path(config.repo_path, source.path)
        keys = {
            column.name: view.projection.join_key_map.get(column.name, column.name)
            for column in view.entity_columns
        }
        sort_by = [source.timestamp_field]
        if source.created_timestamp_column:
            # Equal event times: the latest created row wins, as in Feast's stores.
            sort_by.append(source.created_timestamp_column)
        to_source = {name: column for column, name in source.field_mapping.items()}
        wanted = [*keys, *sort_by, *features]
        right = pd.read_parquet(path, columns=[to_source.get(c, c) for c in dict.fromkeys(wanted)])
        right = right.rename(columns=dict(source.field_mapping)).reset_index(drop=True)
        left = pd.DataFrame(
            {
                **{alias: entity_df[alias].to_numpy()[order] for alias in keys.values()},
                ts: times.array[order],
                row: order,
            }
        )
        # Only this narrow frame is sorted; features are gathered from ``right`` by position.
        index = pd.DataFrame(
            {
                **{alias: right[name].to_numpy() for name, alias in keys.items()},
                # .array keeps the dtype for an empty table (to_numpy gives objects).
                feature_ts: pd.to_datetime(right[source.timestamp_field], utc=True)
                .astype("datetime64[ns, UTC]")
                .array,
                **{f"__{c}": right[c].to_numpy() for c in sort_by[1:]},
                position: np.arange(len(right)),
            }
        )
        index = index.sort_values(
            [feature_ts, *[f"__{c}" for c in sort_by[1:]]], kind="stable"
        ).reset_index(drop=True)
        ttl = view.ttl if view.ttl and view.ttl > timedelta(0) else None
        matched = pd.merge_asof(
            left,
            index,
            left_on=ts,
            right_on=feature_ts,
            by=list(keys.values()),
            direction="backward",
            allow_exact_matches=True,
            tolerance=pd.Timedelta(ttl) if ttl else None,
        )
        found = np.full(len(entity_df), -1, dtype=np.int64)
        found[matched[row].to_numpy()] = matched[position].fillna(-1).to_numpy(dtype=np.int64)
        prefix = f"{view.projection.name_to_use()}__" if full_feature_names else ""
        for name in features:
            columns[prefix + name] = _gather(right[name], found)
    # One frame from the arrays, without copying them or consolidating them into blocks.
    return pd.DataFrame(columns, copy=False)


def _gather(values: pd.Series, found: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``values`` at the positions ``found``; missing (NaN, or NA for nullable columns)
    where it is -1, as a join without a matching row gives."""
    if not (found < 0).any():
        return values.array.take(found)
    if values.dtype.kind in "iub":
        values = values.astype(np.float64)
    return values.array.take(found, allow_fill=True)
