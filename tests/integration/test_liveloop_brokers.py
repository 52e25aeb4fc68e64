"""The live loop on the production backends: Redis store with Redis Streams, and Redis store
with a real Kafka 4.x broker (KRaft) as the event log; card and terminal rows written live."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.brokers import KafkaBroker, kafka_available
from services.common import metric_catalogue as catalogue

from .conftest import Known
from .live import (
    assert_flow,
    assert_terminal_flow,
    card_testing_flow,
    copy_state,
    metric,
    metrics_url,
    start_live_mesh,
    terminal_flow,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.redis]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A Kafka broker for this module (started once, about 10 s)."""
    if not kafka_available():
        pytest.fail("Java or the Kafka broker jars are missing: run `make test-brokers`")
    broker = KafkaBroker(tmp_path_factory.mktemp("live-kafka"), quick_jit=True)
    broker.start()
    yield broker
    broker.stop()


def _run_flow(var_dir: Path, known: Known, **config: Any) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    mesh = start_live_mesh(var_dir, var_dir / "logs", store="redis", **config)
    try:
        assert_flow(card_testing_flow(mesh, known.merchant_id))
        assert_terminal_flow(terminal_flow(mesh, known.merchant_id))
        updaters = [metrics_url(mesh, name) for name in mesh.config.replica_ports("updater")]
        wait_for(
            lambda: (
                sum(metric(u, catalogue.UPDATER_RECORDS, kind="outcome") for u in updaters) >= 1
            ),
            "the outcome at the updater",
        )
    finally:
        mesh.stop()


def test_the_loop_on_redis_streams(prepared_env: Any, known: Known, tmp_path: Path) -> None:
    var_dir = copy_state(prepared_env.var_dir, tmp_path / "var")
    _run_flow(var_dir, known)  # the Redis store implies the Redis Streams log
    assert (var_dir / "redis" / "appendonlydir").is_dir()  # the log survives a restart


@pytest.mark.kafka
def test_the_loop_on_kafka(
    prepared_env: Any, known: Known, kafka: KafkaBroker, tmp_path: Path
) -> None:
    var_dir = copy_state(prepared_env.var_dir, tmp_path / "var")
    _run_flow(var_dir, known, eventlog="kafka", kafka_bootstrap=kafka.bootstrap)


@pytest.mark.kafka
def test_the_loop_on_kafka_with_two_updaters(
    prepared_env: Any, known: Known, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """``fraudmesh up --updater-replicas 2``: a partitioned group of two, each owning a share
    of both topics' partitions, gives the same live rows."""
    var_dir = copy_state(prepared_env.var_dir, tmp_path / "var")
    _run_flow(
        var_dir,
        known,
        eventlog="kafka",
        kafka_bootstrap=kafka.bootstrap,
        updater_replicas=2,
        metrics=("updater", "updater-2", "gateway"),
    )
    assert sorted(p.name for p in (var_dir / "updater" / "feature-updater").glob("*.db")) == [
        "base.db",
        *sorted(
            f"{kind}-{n}.db" for kind in ("cards", "merchants", "transactions") for n in range(6)
        ),
    ]
