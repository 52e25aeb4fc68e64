"""The same flow on the Redis online store, against a real redis-server."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh

from .conftest import (
    ANSWER_DEADLINE_S,
    Known,
    Recorder,
    full_quality,
    register_logs,
    score_request,
    start_mesh,
)

pytestmark = [pytest.mark.integration, pytest.mark.redis]


@pytest.fixture(scope="module")
def redis_mesh(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    """A mesh whose feature service reads Redis, filled by materialization at start."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    logs = register_logs(request, tmp_path_factory.mktemp("redis-logs"))
    m = start_mesh(prepared_env, logs, store="redis", known=known)
    yield m
    m.stop()


def _score(mesh: Mesh, known: Known, card_id: str | None = None) -> pb.ScoreResponse:
    request = score_request(known, card_id=card_id or known.card_id)
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        return pb_grpc.FraudScoringStub(channel).Score(request, timeout=ANSWER_DEADLINE_S)


def test_known_card_reads_online_features_from_redis(redis_mesh: Mesh, known: Known) -> None:
    calls = Recorder(lambda: _score(redis_mesh, known))
    full_quality(calls)
    assert calls.elapsed_is_consistent(), calls.seen


def test_unknown_card_on_redis_is_partial(redis_mesh: Mesh, known: Known) -> None:
    full_quality(
        lambda: _score(redis_mesh, known, card_id="card-not-in-redis"),
        source=pb.FEATURE_SOURCE_PARTIAL,
    )


def test_redis_down_means_defaults_then_recovers(
    redis_mesh: Mesh, known: Known, prepared_env: Any
) -> None:
    redis_mesh.processes["redis"].stop()
    # The model answers on default features, and no answer without Redis claims others.
    calls = Recorder(lambda: _score(redis_mesh, known))
    full_quality(calls, source=pb.FEATURE_SOURCE_DEFAULT)
    assert {a.feature_source for a in calls.answers()} == {pb.FEATURE_SOURCE_DEFAULT}, calls.seen
    assert calls.elapsed_is_consistent(), calls.seen
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
