"""The Feast store end to end: apply, materialize into SQLite and a real Redis, read back.

Also checks historical retrieval (the point-in-time join training uses) and that the
generated feature_store.yaml works with the stock ``feast`` CLI.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loadtest.brokers import RedisServer
from services.common.errors import Unavailable
from services.domain import featurespec
from services.domain.featurespec import FeatureStatus
from services.features.app import FeaturesApp
from services.features.settings import FeaturesSettings
from services.featurestore import admin
from services.featurestore.online import OnlineFeatureReader
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import free_port
from services.pipelines import simulate
from services.pipelines.dataset import Dataset
from services.pipelines.dataset import write as write_dataset

pytestmark = pytest.mark.integration

END = date(2026, 1, 15)
END_S = pd.Timestamp(END, tz="UTC").timestamp()
N_CARD = len(featurespec.CARD_FEATURES)
N_STORE = len(featurespec.STORE_FEATURES)
N_TERMINAL = len(featurespec.TERMINAL_FEATURES)
MERCHANT_SLOTS = slice(N_CARD, N_STORE - N_TERMINAL)
TERMINAL_SLOTS = slice(N_STORE - N_TERMINAL, N_STORE)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Dataset]:
    """The small preset simulated into a fresh state folder and applied to its registry."""
    var_dir = tmp_path_factory.mktemp("feature-store")
    sim = Dataset.from_transactions(
        simulate.simulate(simulate.preset("small", end=END)).transactions
    )
    settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
    write_dataset(sim, settings.data_path)
    admin.apply(settings)
    return var_dir, sim


@pytest.fixture(scope="module")
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port; its connection string."""
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail("redis-server is not on PATH (Debian package redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [
            executable,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def online(request: pytest.FixtureRequest, dataset: tuple[Path, Dataset]) -> FeatureStoreSettings:
    """Settings of a materialized online store, once per store kind."""
    var_dir, _ = dataset
    if request.param == "redis":
        connection = request.getfixturevalue("redis_server")
        settings = FeatureStoreSettings(var_dir=var_dir, store="redis", redis_connection=connection)
    else:
        settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
    steps: list[tuple[str, int, int]] = []
    admin.materialize(settings, progress=lambda *step: steps.append(step))
    assert steps[-1] == ("", 3, 3)
    return settings


@pytest.fixture
def reader(online: FeatureStoreSettings) -> Iterator[OnlineFeatureReader]:
    r = OnlineFeatureReader(online)
    yield r
    r.close()


def _latest(frame: pd.DataFrame, key: str, entity: str) -> pd.Series:
    return frame[frame[key] == entity].iloc[-1]


def _busy(sim: Dataset, episode: bool = True) -> tuple[str, str, str]:
    """A card, a merchant and a terminal whose newest rows are in the data's last day; the
    terminal's newest row counts a known fraud, or with ``episode`` False counts none."""
    last_day = sim.transactions["timestamp"] >= pd.Timestamp(END, tz="UTC") - pd.Timedelta(days=1)
    newest = sim.terminal_features.groupby("terminal_id").tail(1).set_index("terminal_id")
    counted = newest["terminal_known_fraud_first_s"].gt(featurespec.NO_KNOWN_FRAUD)
    candidates = sim.transactions[last_day]
    candidates = candidates[candidates["terminal_id"].map(counted).eq(episode)]
    assert len(candidates), "the simulated data has no such terminal in its last day"
    last = candidates.iloc[-1]
    return str(last["card_id"]), str(last["merchant_id"]), str(last["terminal_id"])


def test_known_card_merchant_and_terminal_are_present_with_their_newest_row(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    _, sim = dataset
    card, merchant, terminal = _busy(sim)
    rows = reader.read(card, merchant, END_S, terminal)
    assert len(rows) == len(featurespec.STORE_FEATURES)
    expected_card = _latest(sim.card_features, "card_id", card)
    expected_merchant = _latest(sim.merchant_features, "merchant_id", merchant)
    expected_terminal = _latest(sim.terminal_features, "terminal_id", terminal)
    for name, (value, status, event_s) in zip(featurespec.STORE_FEATURES, rows, strict=True):
        if name in featurespec.CARD_FEATURES:
            expected = expected_card
        elif name in featurespec.MERCHANT_FEATURES:
            expected = expected_merchant
        else:
            expected = expected_terminal
        assert status == FeatureStatus.PRESENT, name
        assert value == pytest.approx(float(expected[name])), name
        assert event_s == expected["event_timestamp"].timestamp(), name


def test_a_terminal_without_a_known_fraud_reads_every_feature_present(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    card, merchant, terminal = _busy(dataset[1], episode=False)
    rows = reader.read(card, merchant, END_S, terminal)
    for name, (_, status, _) in zip(featurespec.STORE_FEATURES, rows, strict=True):
        assert status == FeatureStatus.PRESENT, name
    named = dict(zip(featurespec.STORE_FEATURES, rows, strict=True))
    assert named["terminal_fraud_rate_28d"][0] == 0.0
    # No counted fraud is a value: the times of none.
    assert named["terminal_known_fraud_first_s"][0] == featurespec.NO_KNOWN_FRAUD
    assert named["terminal_known_fraud_last_s"][0] == featurespec.NO_KNOWN_FRAUD
    card, merchant, terminal = _busy(dataset[1], episode=True)
    rows = reader.read(card, merchant, END_S, terminal)
    named = dict(zip(featurespec.STORE_FEATURES, rows, strict=True))
    first, last = (named[f"terminal_known_fraud_{end}_s"][0] for end in ("first", "last"))
    assert first is not None and last is not None
    assert 0 < first <= last <= END_S


def test_unknown_entities_are_missing_not_errors(reader: OnlineFeatureReader) -> None:
    rows = reader.read("card-unknown", "merch-unknown", END_S, "term-unknown")
    assert rows == [(None, FeatureStatus.MISSING, None)] * len(featurespec.STORE_FEATURES)


def test_unknown_merchant_leaves_the_card_present(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    card, _, terminal = _busy(dataset[1])
    rows = reader.read(card, "merch-unknown", END_S, terminal)
    assert {status for _, status, _ in rows[:N_CARD]} == {FeatureStatus.PRESENT}
    assert {status for _, status, _ in rows[MERCHANT_SLOTS]} == {FeatureStatus.MISSING}
    assert {status for _, status, _ in rows[TERMINAL_SLOTS]} == {FeatureStatus.PRESENT}


def test_no_terminal_leaves_its_features_missing(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    card, merchant, _ = _busy(dataset[1])
    rows = reader.read(card, merchant, END_S)
    assert {status for _, status, _ in rows[:-N_TERMINAL]} == {FeatureStatus.PRESENT}
    assert {status for _, status, _ in rows[TERMINAL_SLOTS]} == {FeatureStatus.MISSING}


def test_features_far_after_the_data_are_stale(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    card, merchant, terminal = _busy(dataset[1])
    rows = reader.read(card, merchant, END_S + 60 * 86_400, terminal)
    assert {status for _, status, _ in rows} == {FeatureStatus.STALE}
    assert all(value is not None and event_s is not None for value, _, event_s in rows)


def test_staleness_is_judged_per_view(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    card, merchant, terminal = _busy(dataset[1])
    # Past the merchant and terminal views' 14 days, within the card view's 30.
    rows = reader.read(card, merchant, END_S + 20 * 86_400, terminal)
    assert {status for _, status, _ in rows[:N_CARD]} == {FeatureStatus.PRESENT}
    assert {status for _, status, _ in rows[N_CARD:]} == {FeatureStatus.STALE}


def test_max_age_setting_overrides_the_ttl(
    online: FeatureStoreSettings, dataset: tuple[Path, Dataset]
) -> None:
    card, merchant, terminal = _busy(dataset[1])
    strict = OnlineFeatureReader(
        online.model_copy(
            update={"card_max_age_s": 1.0, "merchant_max_age_s": 1e9, "terminal_max_age_s": 1.0}
        )
    )
    try:
        rows = strict.read(card, merchant, END_S, terminal)
    finally:
        strict.close()
    assert {status for _, status, _ in rows[:N_CARD]} == {FeatureStatus.STALE}
    assert {status for _, status, _ in rows[MERCHANT_SLOTS]} == {FeatureStatus.PRESENT}
    assert {status for _, status, _ in rows[TERMINAL_SLOTS]} == {FeatureStatus.STALE}


def test_concurrent_reads_agree_with_serial_ones(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    tx = dataset[1].transactions.tail(200)
    cards, merchants = tx["card_id"].tolist(), tx["merchant_id"].tolist()
    serial = [reader.read(c, m, END_S) for c, m in zip(cards, merchants, strict=True)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(reader.read, cards, merchants, [END_S] * len(cards)))
    assert parallel == serial


def test_a_batch_of_lookups_reads_as_each_lookup_alone(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset]
) -> None:
    tx = dataset[1].transactions.tail(40)
    lookups = [
        (c, m, END_S + (i % 3) * 10 * 86_400, t if i % 4 else "")
        for i, (c, m, t) in enumerate(
            zip(tx["card_id"], tx["merchant_id"], tx["terminal_id"], strict=True)
        )
    ]
    lookups += [("card-unknown", "merch-unknown", END_S, "term-unknown")]
    alone = [reader.read(c, m, as_of, t) for c, m, as_of, t in lookups]
    assert reader.read_many(lookups) == alone
    assert reader.read_many(lookups[:1]) == alone[:1]


@pytest.mark.parametrize("as_of_s", [END_S, END_S + 20 * 86_400], ids=["fresh", "merchant-stale"])
def test_direct_read_equals_get_online_features(
    reader: OnlineFeatureReader, dataset: tuple[Path, Dataset], as_of_s: float
) -> None:
    tx = dataset[1].transactions.tail(300)
    keys = list(zip(tx["card_id"], tx["merchant_id"], tx["terminal_id"], strict=True))
    keys += [(card, merchant, "") for card, merchant, _ in keys[:20]]
    keys += [(card, "merch-unknown", "term-unknown") for card, _, _ in keys[:20]]
    keys += [("card-unknown", merchant, terminal) for _, merchant, terminal in keys[:20]]
    seen: set[int] = set()
    for card, merchant, terminal in keys:
        direct = reader.read(card, merchant, as_of_s, terminal)
        assert direct == reader.read_generic(card, merchant, as_of_s, terminal), (card, merchant)
        seen.update(status for _, status, _ in direct)
    expected = {FeatureStatus.PRESENT, FeatureStatus.MISSING} | (
        {FeatureStatus.STALE} if as_of_s > END_S else set()
    )
    assert expected <= seen


def test_a_hung_redis_fails_the_read_within_the_timeout(
    dataset: tuple[Path, Dataset],
) -> None:
    var_dir, _ = dataset
    # Accepts connections (the kernel completes the handshake) and never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host, port = silent.getsockname()
        settings = FeatureStoreSettings(
            var_dir=var_dir, store="redis", redis_connection=f"{host}:{port}", redis_timeout_ms=50
        )
        reader = OnlineFeatureReader(settings)
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="TimeoutError"):
                reader.read("card-1", "merch-1", END_S)
            assert time.monotonic() - started < 2.0
        finally:
            reader.close()


def test_historical_retrieval_is_point_in_time(dataset: tuple[Path, Dataset]) -> None:
    var_dir, sim = dataset
    fs = admin.feature_store(FeatureStoreSettings(var_dir=var_dir, store="sqlite"))
    tx = sim.transactions
    card = tx["card_id"].value_counts().index[0]
    mine = tx[tx["card_id"] == card]
    # Another card's rows in between check that rows stay in input order.
    sample = pd.concat([mine, tx.head(50)]).reset_index(drop=True)
    entity_df = pd.DataFrame(
        {
            "card_id": sample["card_id"],
            "merchant_id": sample["merchant_id"],
            "terminal_id": sample["terminal_id"],
            "event_timestamp": sample["timestamp"] - pd.Timedelta(microseconds=1),
        }
    )
    service = fs.get_feature_service(definitions.FEATURE_SERVICE)
    joined = fs.get_historical_features(entity_df=entity_df, features=service).to_df()
    assert len(joined) == len(entity_df)
    assert (joined["card_id"] == entity_df["card_id"]).all()
    history = sim.card_features[sim.card_features["card_id"] == card].reset_index(drop=True)
    got = joined.iloc[: len(mine)]
    # The first transaction has no earlier row; every other one sees its predecessor's.
    assert got.loc[0, list(featurespec.CARD_FEATURES)].isna().all()
    for i in range(1, len(mine)):
        previous = history.iloc[i - 1]
        gap = mine["timestamp"].iloc[i] - previous["event_timestamp"]
        row = got.iloc[i]
        if gap > definitions.CARD_TTL:
            assert np.isnan(row["card_txn_count_7d"])
            continue
        for name in featurespec.CARD_FEATURES:
            assert row[name] == pytest.approx(float(previous[name])), (i, name)


def test_stock_feast_cli_uses_the_generated_config(
    dataset: tuple[Path, Dataset],
) -> None:
    var_dir, _ = dataset
    settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
    feast = Path(sys.executable).with_name("feast")
    result = subprocess.run(
        [str(feast), "-c", str(settings.data_path), "feature-views", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert definitions.card_features.name in result.stdout
    assert definitions.merchant_features.name in result.stdout


async def test_the_feature_service_waits_for_a_store_that_is_not_up_yet(
    dataset: tuple[Path, Dataset], tmp_path: Path
) -> None:
    """Started before its Redis, the feature service does not exit: it retries its warm-up
    reads (not ready meanwhile) and is ready once the store answers."""
    var_dir, _ = dataset
    server = RedisServer(tmp_path / "late-redis")
    settings = FeatureStoreSettings(
        var_dir=var_dir, store="redis", redis_connection=f"{server.host}:{server.port}"
    )
    app = FeaturesApp(FeaturesSettings(var_dir=var_dir), settings)
    starting = asyncio.create_task(app.start())
    try:
        await asyncio.sleep(2.0)
        assert not starting.done() and app.reader is None
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(starting, timeout=30)
        assert app.reader is not None
        reads = await asyncio.to_thread(app.reader.read, "no-such-card", "no-such-merchant", END_S)
        assert {r.status for r in reads} == {FeatureStatus.MISSING}
    finally:
        starting.cancel()
        await app.close()
        server.stop()
