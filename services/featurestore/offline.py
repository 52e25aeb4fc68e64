"""An offline store for Feast: its file store with an O(n log n) point-in-time join.

Historical retrieval goes through Feast (``FeatureStore.get_historical_features``) with
``AsofFileOfflineStore``, a file offline store whose point-in-time join is a sorted
as-of merge. Feast's own file (Dask) store joins every entity row with every feature row
of its entity before filtering, which is quadratic in rows per entity (minutes and
gigabytes for per-transaction merchant tables), and it silently drops entity rows that
have no feature row inside the TTL instead of returning nulls.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

import dask.dataframe as dd
import numpy as np
import pandas as pd
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
                # .array keeps the dtype for an empty table (to_numpy gives objects).
                feature_ts: pd.to_datetime(right[source.timestamp_field], utc=True)
                .astype("datetime64[ns, UTC]")
                .array,
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
