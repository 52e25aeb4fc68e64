"""The live writer of the online store: what it writes (card, merchant and terminal rows), Feast's
own read path reads back the same, on SQLite and on a real redis-server."""

from __future__ import annotations

import math
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value

from loadtest.brokers import RedisServer
from services.domain import featurespec
from services.domain.featurespec import FeatureStatus
from services.featurestore import feast_internals
from services.featurestore.admin import feature_store
from services.featurestore.online import OnlineFeatureReader
from services.featurestore.settings import FeatureStoreSettings
from services.featurestore.writer import OnlineFeatureWriter, Row

from .live import copy_state

pytestmark = pytest.mark.integration

NOW = time.time()
CARD = Row(
    "card-written-1",
    NOW - 1.5,
    {
        **{name: float(i + 1) for i, name in enumerate(featurespec.CARD_FEATURES)},
        "card_txn_count_1h": 12.0,
        "card_amount_mean_7d": 12.34,
        "card_amount_std_30d": 0.125,
        "card_last_txn_s": float(int(NOW - 1.5)),
        "card_home_country": math.nan,  # unknown: a null value, read as missing
    },
)
MERCHANT = Row(
    "merch-written-1",
    NOW - 2.0,
    {
        **{name: float(i + 1) for i, name in enumerate(featurespec.MERCHANT_FEATURES)},
        "merchant_txn_count_7d": 480.0,
        "merchant_amount_mean_28d": 56.78,
        "merchant_category": 5999.0,
        "merchant_country": 276.0,
    },
)
TERMINAL = Row(
    "merch-written-1-t1",
    NOW - 2.5,
    {
        **{name: float(i + 1) for i, name in enumerate(featurespec.TERMINAL_FEATURES)},
        "terminal_txn_count_1d": 7.0,
        "terminal_fraud_rate_28d": 0.0625,
        "terminal_labelled_txn_count_28d": 16.0,
    },
)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store(
    request: pytest.FixtureRequest, prepared_env: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FeatureStoreSettings]:
    var_dir = copy_state(prepared_env.var_dir, tmp_path_factory.mktemp("writer-var"))
    if request.param == "sqlite":
        yield FeatureStoreSettings(var_dir=var_dir, store="sqlite")
        return
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("writer-redis"))
    server.start()
    try:
        yield FeatureStoreSettings(
            var_dir=var_dir, store="redis", redis_connection=f"{server.host}:{server.port}"
        )
    finally:
        server.stop()


def test_written_rows_read_back_through_both_read_paths(
    store: FeatureStoreSettings, tmp_path: Path
) -> None:
    writer = OnlineFeatureWriter(store)
    writer.write([CARD], [MERCHANT], [TERMINAL])
    # Written again at the same event time with other values: the write is unconditional.
    again = Row(CARD.entity_id, CARD.event_s, {**CARD.values, "card_txn_count_1h": 13.0})
    writer.write([again], [])
    writer.close()
    reader = OnlineFeatureReader(store)
    try:
        for reads in (
            reader.read(CARD.entity_id, MERCHANT.entity_id, NOW, TERMINAL.entity_id),
            reader.read_generic(CARD.entity_id, MERCHANT.entity_id, NOW, TERMINAL.entity_id),
        ):
            got = dict(zip(featurespec.STORE_FEATURES, reads, strict=True))
            for row in (again, MERCHANT, TERMINAL):
                for name, want in row.values.items():
                    value, status, event_s = got[name]
                    if math.isnan(want):
                        assert status == FeatureStatus.MISSING, name
                        continue
                    assert status == FeatureStatus.PRESENT, name
                    assert value == pytest.approx(want), name
                    # SQLite keeps whole seconds of the event time; Redis keeps it exactly.
                    assert event_s == pytest.approx(row.event_s, abs=1.0), name
    finally:
        reader.close()


def _rows(settings: FeatureStoreSettings, keys: dict[str, list[bytes]]) -> dict[str, list[Any]]:
    """Every stored row of the entities ``keys`` names, per view's table, in key order."""
    store = feature_store(settings)
    config = store.config
    connection = sqlite3.connect(settings.online_file)
    try:
        out = {}
        for view, entity_keys in keys.items():
            table = feast_internals.sqlite_table(config, store.get_feature_view(view))
            marks = ", ".join("?" * len(entity_keys))
            out[view] = connection.execute(
                f"SELECT * FROM {table} WHERE entity_key IN ({marks}) "
                "ORDER BY entity_key, feature_name",
                entity_keys,
            ).fetchall()
        return out
    finally:
        connection.close()


def test_sqlite_rows_are_the_rows_feast_writes(prepared_env: Any, tmp_path: Path) -> None:
    """The writer's own SQLite upserts store, byte for byte, what Feast's ``online_write_batch``
    stores for the same rows: an update of stored entities, a new one, a null value, integer
    and floating-point features."""
    new_card = Row("card-written-2", NOW - 0.25, {**CARD.values, "card_txn_count_1h": 1.0})
    written = ([CARD, new_card], [MERCHANT], [TERMINAL])
    stores = []
    for name, direct in (("ours", True), ("feast", False)):
        settings = FeatureStoreSettings(
            var_dir=copy_state(prepared_env.var_dir, tmp_path / name), store="sqlite"
        )
        writer = OnlineFeatureWriter(settings)
        assert writer._sqlite_upserts is not None  # the direct path is the default
        if not direct:
            writer._sqlite_upserts = None  # Feast's own online_write_batch
        writer.write(*written)
        writer.close()
        stores.append(settings)
    config = feature_store(stores[0]).config
    keys = {
        view: [
            feast_internals.sqlite_entity_key(
                config, EntityKey(join_keys=[key], entity_values=[Value(string_val=row.entity_id)])
            )
            for row in rows
        ]
        for (view, key), rows in zip(
            (
                (featurespec.CARD_VIEW, "card_id"),
                (featurespec.MERCHANT_VIEW, "merchant_id"),
                (featurespec.TERMINAL_VIEW, "terminal_id"),
            ),
            written,
            strict=True,
        )
    }
    ours, theirs = (_rows(settings, keys) for settings in stores)
    assert ours == theirs
    features = len(featurespec.CARD_FEATURES)
    assert len(ours[featurespec.CARD_VIEW]) == 2 * features
