"""Feast's private names the project relies on (services.featurestore.feast_internals).

A Feast upgrade that renames or reshapes one of them fails here, with its name, instead of
on the request path of a running feature service.
"""

from __future__ import annotations

import inspect

import feast
import pytest
from feast import FeatureStore
from feast.infra import key_encoding_utils
from feast.infra.online_stores import helpers as feast_helpers
from feast.infra.online_stores import redis as feast_redis
from feast.infra.online_stores.redis import RedisOnlineStore
from feast.infra.online_stores.sqlite import SqliteOnlineStore

from services.featurestore import feast_internals


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("owner", "name", "parameters"),
    [
        (FeatureStore, "_get_provider", ["self"]),
        (RedisOnlineStore, "_get_client", ["self", "online_store_config"]),
        (RedisOnlineStore, "_generate_redis_keys_for_entities", ["self", "config", "entity_keys"]),
        (
            RedisOnlineStore,
            "_generate_hset_keys_for_features",
            ["self", "feature_view", "requested_features", "fv_name_override"],
        ),
        (feast_redis, "_versioned_fv_name", ["table", "config"]),
        (SqliteOnlineStore, "_get_conn", ["self", "config"]),
        (SqliteOnlineStore, "_get_db_path", ["config"]),
        # The writer's SQLite rows: the table's name, the key's bytes, the value's text.
        (feast_helpers, "compute_table_id", ["project", "table", "enable_versioning"]),
        (feast_helpers, "extract_text_and_num", ["val", "compute_num"]),
        (
            key_encoding_utils,
            "serialize_entity_key",
            ["entity_key", "entity_key_serialization_version"],
        ),
    ],
)
def test_private_name_exists_with_its_parameters(
    owner: object, name: str, parameters: list[str]
) -> None:
    function = getattr(owner, name, None)
    assert function is not None, f"Feast {feast.__version__} no longer has {name}"
    assert _parameters(function) == parameters, (
        f"Feast {feast.__version__} changed the parameters of {name}: {_parameters(function)}"
    )


def test_feature_reference_resolution_still_takes_three_arguments() -> None:
    from feast import utils

    function = getattr(utils, "_get_requested_feature_views_to_features_dict", None)
    assert function is not None, f"Feast {feast.__version__} no longer resolves references there"
    assert len(_parameters(function)) == 3


def test_sync_connections_live_in_the_attributes_closed() -> None:
    # The SQLite and Redis stores keep their synchronous connections in these attributes;
    # close_sync_connections resets them so a closed reader holds nothing open.
    from feast.infra.online_stores.sqlite import SqliteOnlineStore

    assert "_conn" in vars(SqliteOnlineStore) or hasattr(SqliteOnlineStore(), "_conn")
    assert hasattr(RedisOnlineStore(), "_client")
    feast_internals.close_sync_connections(RedisOnlineStore())
