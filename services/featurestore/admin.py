"""Feast configuration from settings, and the admin jobs: apply and materialize.

Run-time layout: the data folder is the Feast repo path. It holds the Parquet sources
(the definitions in ``repo/`` name them by relative path) and a generated
``feature_store.yaml`` matching the settings, so the stock CLI works on the same state:
``feast -c <data dir> feature-views list``, ``feast -c <data dir> serve``. The registry
and the SQLite online store live under ``<var_dir>/feast/`` by default.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from feast import FeatureService, FeatureStore, RepoConfig
from feast.errors import FeatureServiceNotFoundException, FeatureViewNotFoundException

from services.common.errors import FailedPrecondition
from services.featurestore import layout
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings

OBJECTS = (
    definitions.card,
    definitions.merchant,
    definitions.terminal,
    definitions.card_source,
    definitions.merchant_source,
    definitions.terminal_source,
    definitions.card_features,
    definitions.merchant_features,
    definitions.terminal_features,
    definitions.fraud_scoring,
)
"""Every Feast object of the repo, as ``apply`` registers them."""

OFFLINE_STORE_TYPE = "services.featurestore.offline.AsofFileOfflineStore"
"""``offline.STORE_TYPE``, named without importing the store (it imports Dask)."""

VIEW_NAMES = (
    definitions.card_features.name,
    definitions.merchant_features.name,
    definitions.terminal_features.name,
)
"""The feature views, in the order materialize() loads them."""


def repo_config(settings: FeatureStoreSettings, skip_dedup: bool = False) -> RepoConfig:
    """The Feast configuration the settings describe (absolute paths).

    ``skip_dedup`` (Redis only) makes writes unconditional: Feast's Redis store otherwise
    skips a row whose event time is not newer than the stored one, which would drop the
    live updater's rows for a late event or two events of the same instant."""
    if settings.store == "redis":
        online: dict[str, Any] = {
            "type": "redis",
            "connection_string": settings.redis_connection,
        }
        if skip_dedup:
            online["skip_dedup"] = True
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
        # By name, not as a dict: Feast validates a dict at once, importing the store (Dask
        # and pandas' groupby), which the online readers and writers never use; a name is
        # resolved when the offline store is first used.
        offline_store=OFFLINE_STORE_TYPE,
        entity_key_serialization_version=3,
        repo_path=settings.data_path.resolve(),
    )


def write_feature_store_yaml(settings: FeatureStoreSettings) -> Path:
    """Writes ``feature_store.yaml`` for the stock ``feast`` CLI into the data folder."""
    config = repo_config(settings)
    data_dir = settings.data_path
    data_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "project": config.project,
        "provider": config.provider,
        "registry": config.registry_config,
        "online_store": config.online_config,
        "offline_store": {"type": OFFLINE_STORE_TYPE},
        "entity_key_serialization_version": config.entity_key_serialization_version,
    }
    path = data_dir / "feature_store.yaml"
    path.write_text(
        "# Generated from the fraudmesh feature settings; rewritten on every apply.\n"
        + yaml.safe_dump(document, sort_keys=False)
    )
    return path


def feature_store(
    settings: FeatureStoreSettings,
    read_timeout_ms: float | None = None,
    skip_dedup: bool = False,
) -> FeatureStore:
    """A FeatureStore on the configured registry, online and offline stores.

    ``read_timeout_ms`` bounds every Redis socket operation (connect, send, receive) of
    the store, unless the connection string sets its own; for request-path readers, not
    for materialization, whose large pipelined writes take longer. ``skip_dedup``: see
    ``repo_config``.
    """
    settings.registry_file.parent.mkdir(parents=True, exist_ok=True)
    if settings.store == "sqlite":
        settings.online_file.parent.mkdir(parents=True, exist_ok=True)
    config = repo_config(settings, skip_dedup)
    if settings.store == "redis" and read_timeout_ms is not None:
        connection = settings.redis_connection
        timeout_s = read_timeout_ms / 1000
        for option in ("socket_timeout", "socket_connect_timeout"):
            if f"{option}=" not in connection:
                connection += f",{option}={timeout_s}"
        config = repo_config(
            settings.model_copy(update={"redis_connection": connection}), skip_dedup
        )
    return FeatureStore(config=config)


def feature_service(fs: FeatureStore, name: str) -> FeatureService | None:
    """The registered feature service ``name``; None when it is not registered."""
    try:
        return fs.get_feature_service(name)
    except FeatureServiceNotFoundException:
        return None


def apply(settings: FeatureStoreSettings) -> None:
    """Registers the repo's entities, sources, views and service; writes feature_store.yaml."""
    write_feature_store_yaml(settings)
    store = feature_store(settings)
    with _quiet():
        store.apply(list(OBJECTS))


def not_applied(settings: FeatureStoreSettings) -> FailedPrecondition:
    """The error for a registry that lacks the fraud features, saying what to run."""
    return FailedPrecondition(
        f"the Feast registry {settings.registry_file} lacks the fraud features: "
        "run `fraudmesh features apply`"
    )


MaterializeProgress = Callable[[str, int, int], None]
"""Called with (view name, views done, views total) before each view and once at the end."""


def materialize(
    settings: FeatureStoreSettings, progress: MaterializeProgress | None = None
) -> None:
    """Loads each entity's newest row in the data window into the online store."""
    if not layout.data_present(settings.data_path):
        raise FailedPrecondition(
            f"no dataset in {settings.data_path}: run `fraudmesh features simulate`"
        )
    store = feature_store(settings)
    for view in VIEW_NAMES:
        try:
            store.get_feature_view(view)
        except FeatureViewNotFoundException as error:
            raise not_applied(settings) from error
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
            for name in layout.FEATURE_FILES
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
