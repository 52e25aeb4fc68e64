"""The gateway with the store read and the model in process (FRAUD_GATEWAY_IN_PROCESS).

Scores must equal what the feature service and the scorer, called over gRPC, give for the
same transaction; the fallbacks must still work when Redis goes away.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import features_pb2, features_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from services.domain import featurespec
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh
from services.models import repository

from .conftest import ANSWER_DEADLINE_S, Known, Recorder, full_quality, register_logs, start_mesh

pytestmark = [pytest.mark.integration, pytest.mark.redis]


@pytest.fixture(scope="module")
def local_mesh(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    m = start_mesh(
        prepared_env,
        register_logs(request, tmp_path_factory.mktemp("in-process-logs")),
        store="redis",
        known=known,
        FRAUD_GATEWAY_IN_PROCESS="true",
        # Each test scores a request twice (in process, then through the services): the live
        # loop would change the card's features between the two.
        FRAUD_GATEWAY_EMIT_EVENTS="false",
    )
    yield m
    m.stop()


def _request(known: Known, card_id: str | None = None) -> pb.ScoreRequest:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return pb.ScoreRequest(
        transaction_id=f"ip-{time.time_ns()}",
        card_id=card_id or known.card_id,
        merchant_id=known.merchant_id,
        amount_minor=known.amount_minor,
        currency="EUR",
        timestamp=ts,
        channel=pb.CHANNEL_CARD_NOT_PRESENT,
    )


def _score(mesh: Mesh, request: pb.ScoreRequest) -> pb.ScoreResponse:
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        return pb_grpc.FraudScoringStub(channel).Score(request, timeout=ANSWER_DEADLINE_S)


def _score_through_services(mesh: Mesh, request: pb.ScoreRequest, prepared_env: Any) -> float:
    """The same transaction scored by the feature service and the scorer over gRPC."""
    c = mesh.config
    metadata, _ = repository.load(prepared_env.var_dir / "models", "fraud-lgbm")
    with grpc.insecure_channel(f"{c.host}:{c.features_port}") as channel:
        found = features_pb2_grpc.FeatureServiceStub(channel).GetFeatures(
            features_pb2.GetFeaturesRequest(
                card_id=request.card_id, merchant_id=request.merchant_id, as_of=request.timestamp
            ),
            timeout=ANSWER_DEADLINE_S,
        )
    store = {
        f.name: (f.value if f.status == features_pb2.FEATURE_STATUS_PRESENT else None)
        for f in found.features
    }
    vector = featurespec.model_vector(
        store,
        amount_minor=request.amount_minor,
        currency=request.currency,
        timestamp_s=request.timestamp.ToNanoseconds() / 1e9,
        card_not_present=True,
        defaults=metadata.default_features,
    )
    infer = v2.ModelInferRequest(
        model_name=metadata.name,
        model_version=metadata.version,
        inputs=[
            v2.ModelInferRequest.InferInputTensor(
                name=metadata.input_name, datatype="FP32", shape=[1, len(vector)]
            )
        ],
        outputs=[v2.ModelInferRequest.InferRequestedOutputTensor(name=metadata.output_name)],
        raw_input_contents=[struct.pack(f"<{len(vector)}f", *vector)],
    )
    with grpc.insecure_channel(f"{c.host}:{c.scorer_port}") as channel:
        answer = v2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            infer, timeout=ANSWER_DEADLINE_S
        )
    return float(struct.unpack("<2f", answer.raw_output_contents[0])[1])


@pytest.mark.parametrize("unknown_card", [False, True], ids=["known-card", "unknown-card"])
def test_in_process_scores_equal_the_services(
    local_mesh: Mesh, known: Known, prepared_env: Any, unknown_card: bool
) -> None:
    request = _request(known, card_id="card-not-in-redis" if unknown_card else None)
    expected_source = pb.FEATURE_SOURCE_PARTIAL if unknown_card else pb.FEATURE_SOURCE_ONLINE
    response = full_quality(lambda: _score(local_mesh, request), source=expected_source)
    expected = _score_through_services(local_mesh, request, prepared_env)
    assert response.score == pytest.approx(expected, abs=1e-6)


def test_in_process_falls_back_to_defaults_without_redis(
    local_mesh: Mesh, known: Known, prepared_env: Any
) -> None:
    local_mesh.processes["redis"].stop()
    try:
        # The model answers on default features, and no answer without Redis claims others.
        calls = Recorder(lambda: _score(local_mesh, _request(known)))
        for _ in range(5):
            full_quality(calls, source=pb.FEATURE_SOURCE_DEFAULT)
        sources = {a.feature_source for a in calls.answers()}
        assert sources == {pb.FEATURE_SOURCE_DEFAULT}, calls.seen
        assert calls.elapsed_is_consistent(), calls.seen
    finally:
        local_mesh.restart("redis")
        store_admin.materialize(
            FeatureStoreSettings(
                var_dir=prepared_env.var_dir,
                store="redis",
                redis_connection=f"{local_mesh.config.host}:{local_mesh.config.redis_port}",
            )
        )
    deadline = time.monotonic() + 30
    while True:
        response = _score(local_mesh, _request(known))
        if response.feature_source == pb.FEATURE_SOURCE_ONLINE:
            break
        assert time.monotonic() < deadline, "online features did not come back"
        time.sleep(0.2)
