"""The live writer of the online store: what it writes (card, merchant and terminal rows), Feast's
own read path reads back the same, on SQLite and on a real redis-server."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.brokers import RedisServer
from services.domain import featurespec
from services.domain.featurespec import FeatureStatus
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
