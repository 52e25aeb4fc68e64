"""One status, one reason: a dependency failing with a gRPC status gives the gateway the same
``DependencyError.reason`` (the ``reason`` label of ``fraudmesh_dependency_errors_total``)
over unary calls and over persistent streams, for the feature service and the scorer.

A real gRPC server on loopback answers every call with the status the test names: unary
calls end with it, stream replies carry it as the real services do (``error_code`` on
StreamFeatures, ``"NAME: message"`` on ModelStreamInfer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2
from prometheus_client import CollectorRegistry

from fraud.v1 import features_pb2, features_pb2_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from services.common.channels import insecure_channel
from services.gateway.dependencies import GrpcFeatureClient, GrpcModelClient
from services.gateway.metrics import GatewayMetrics
from services.gateway.ports import DependencyError, status_reason
from services.gateway.streams import (
    StreamFeatureClient,
    StreamModelClient,
    StreamSettings,
    stream_pools,
)
from tests.unit.tiny_models import metadata

pytestmark = pytest.mark.integration

ERRORS = [code for code in grpc.StatusCode if code is not grpc.StatusCode.OK]


class Failing:
    """Which status the servers answer with next."""

    code = grpc.StatusCode.UNKNOWN


class FailingFeatures(features_pb2_grpc.FeatureServiceServicer):
    """GetFeatures ends with the status; StreamFeatures replies with it."""

    def __init__(self, failing: Failing) -> None:
        self.failing = failing

    async def GetFeatures(
        self, request: features_pb2.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> features_pb2.GetFeaturesResponse:
        await context.abort(self.failing.code, "failing on purpose")

    async def StreamFeatures(
        self, request_iterator: AsyncIterator[features_pb2.StreamFeaturesRequest], context: Any
    ) -> AsyncIterator[features_pb2.StreamFeaturesResponse]:
        await context.send_initial_metadata(())
        async for request in request_iterator:
            yield features_pb2.StreamFeaturesResponse(
                id=request.id,
                error_code=self.failing.code.value[0],
                error_message="failing on purpose",
            )


class FailingScorer(v2_grpc.GRPCInferenceServiceServicer):
    """ModelInfer ends with the status; ModelStreamInfer replies with it, as the scorer does."""

    def __init__(self, failing: Failing) -> None:
        self.failing = failing

    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        await context.abort(self.failing.code, "failing on purpose")

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[v2.ModelInferRequest], context: Any
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        await context.send_initial_metadata(())
        async for request in request_iterator:
            reply = v2.ModelStreamInferResponse(
                error_message=f"{code_pb2.Code.Name(self.failing.code.value[0])}: failing"
            )
            reply.infer_response.id = request.id
            yield reply


async def _reason(call: Any) -> str:
    with pytest.raises(DependencyError) as raised:
        await call
    return raised.value.reason


async def test_unary_and_stream_transports_give_the_same_reason_for_each_status() -> None:
    failing = Failing()
    server = grpc.aio.server()
    features_pb2_grpc.add_FeatureServiceServicer_to_server(FailingFeatures(failing), server)
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(FailingScorer(failing), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    unary_channel = insecure_channel(target)
    stream_channel = insecure_channel(target, traced=False)
    metrics = GatewayMetrics(CollectorRegistry())
    features_pool, scorer_pool = stream_pools(
        stream_channel, stream_channel, metrics, StreamSettings(streams=1)
    )
    try:
        assert await features_pool.wait_open(5.0) and await scorer_pool.wait_open(5.0)
        model = metadata(version="1")
        unary_features = GrpcFeatureClient(unary_channel)
        stream_features = StreamFeatureClient(features_pool)
        unary_model = GrpcModelClient(unary_channel, model)
        stream_model = StreamModelClient(scorer_pool, model)
        vector = [0.0] * len(model.feature_order)
        seen: dict[str, dict[str, str]] = {}
        for code in ERRORS:
            failing.code = code
            seen[code.name] = {
                "features unary": await _reason(unary_features.get("c", "m", 0.0, 2.0)),
                "features stream": await _reason(stream_features.get("c", "m", 0.0, 2.0)),
                "scorer unary": await _reason(unary_model.score(vector, 2.0)),
                "scorer stream": await _reason(stream_model.score(vector, 2.0)),
            }
    finally:
        await features_pool.close()
        await scorer_pool.close()
        await unary_channel.close()
        await stream_channel.close()
        await server.stop(None)
    expected = {name: dict.fromkeys(by, status_reason(name)) for name, by in seen.items()}
    assert seen == expected
    assert seen["DEADLINE_EXCEEDED"]["scorer stream"] == "timeout"
    assert seen["INTERNAL"]["features stream"] == "internal"
    assert len({status_reason(code.name) for code in ERRORS}) == len(ERRORS)
