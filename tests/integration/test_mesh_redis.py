"""The same flow on the Redis online store, against a real redis-server."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh

from .conftest import Known, start_mesh

pytestmark = [pytest.mark.integration, pytest.mark.redis]


@pytest.fixture(scope="module")
def redis_mesh(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh whose feature service reads Redis, filled by materialization at start."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    m = start_mesh(prepared_env, tmp_path_factory.mktemp("redis-logs"), store="redis")
    yield m
    m.stop()


def _score(mesh: Mesh, known: Known, card_id: str | None = None) -> pb.ScoreResponse:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    request = pb.ScoreRequest(
        transaction_id=f"r-{time.time_ns()}",
        card_id=card_id or known.card_id,
        merchant_id=known.merchant_id,
        amount_minor=known.amount_minor,
        currency="EUR",
        timestamp=ts,
    )
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        return pb_grpc.FraudScoringStub(channel).Score(request, timeout=1.0)


def test_known_card_reads_online_features_from_redis(redis_mesh: Mesh, known: Known) -> None:
    response = _score(redis_mesh, known)
    assert response.feature_source == pb.FEATURE_SOURCE_ONLINE
    assert response.scored_by == pb.SCORED_BY_MODEL
    assert response.elapsed_ms < 42.0


def test_unknown_card_on_redis_is_partial(redis_mesh: Mesh, known: Known) -> None:
    response = _score(redis_mesh, known, card_id="card-not-in-redis")
    assert response.feature_source == pb.FEATURE_SOURCE_PARTIAL
    assert response.scored_by == pb.SCORED_BY_MODEL


def test_redis_down_means_defaults_then_recovers(
    redis_mesh: Mesh, known: Known, prepared_env: Any
) -> None:
    redis_mesh.processes["redis"].stop()
    response = _score(redis_mesh, known)
    assert response.feature_source == pb.FEATURE_SOURCE_DEFAULT
    assert response.scored_by == pb.SCORED_BY_MODEL
    assert response.elapsed_ms < 42.0
    redis_mesh.restart("redis")
    c = redis_mesh.config
    store_admin.materialize(
        FeatureStoreSettings(
            var_dir=prepared_env.var_dir,
            store="redis",
            redis_connection=f"{c.host}:{c.redis_port}",
        )
    )
    deadline = time.monotonic() + 10
    while _score(redis_mesh, known).feature_source != pb.FEATURE_SOURCE_ONLINE:
        assert time.monotonic() < deadline, "features did not come back after Redis returned"
        time.sleep(0.2)
