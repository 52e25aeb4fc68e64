"""gRPC clients of the gateway's dependencies; they turn RPC failures into DependencyError."""

from __future__ import annotations

import struct
from collections.abc import Mapping

import grpc

from fraud.v1 import features_pb2, features_pb2_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from services.common.registry import ModelMetadata
from services.gateway.pipeline import DependencyError

_PRESENT = features_pb2.FEATURE_STATUS_PRESENT


def _reason(error: grpc.aio.AioRpcError) -> str:
    code = error.code()
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    return code.name.lower()


class GrpcFeatureClient:
    """Calls fraud.v1.FeatureService/GetFeatures."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = features_pb2_grpc.FeatureServiceStub(channel)

    async def get(
        self, card_id: str, merchant_id: str, as_of_s: float, timeout_s: float
    ) -> Mapping[str, float | None]:
        """Store features by name; None for missing or stale ones."""
        request = features_pb2.GetFeaturesRequest(card_id=card_id, merchant_id=merchant_id)
        request.as_of.seconds, request.as_of.nanos = divmod(round(as_of_s * 1e9), 1_000_000_000)
        try:
            response = await self._stub.GetFeatures(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise DependencyError("features", _reason(error), error.details() or "") from error
        return {f.name: (f.value if f.status == _PRESENT else None) for f in response.features}


class GrpcModelClient:
    """Calls inference.GRPCInferenceService/ModelInfer with one FP32 row as raw bytes."""

    def __init__(self, channel: grpc.aio.Channel, metadata: ModelMetadata) -> None:
        self._stub = v2_grpc.GRPCInferenceServiceStub(channel)
        self._n = len(metadata.feature_order)
        self._pack = struct.Struct(f"<{self._n}f").pack
        # Everything but the row is the same on every call: built once, copied per call
        # (a third of the cost of building the nested messages each time).
        self._template = v2.ModelInferRequest(
            model_name=metadata.name,
            model_version=metadata.version,
            inputs=[
                v2.ModelInferRequest.InferInputTensor(
                    name=metadata.input_name, datatype="FP32", shape=(1, self._n)
                )
            ],
            outputs=[v2.ModelInferRequest.InferRequestedOutputTensor(name=metadata.output_name)],
        )

    def request(self, vector: list[float]) -> v2.ModelInferRequest:
        """The ModelInfer request for one feature vector."""
        request = v2.ModelInferRequest()
        request.CopyFrom(self._template)
        request.raw_input_contents.append(self._pack(*vector))
        return request

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability of one row."""
        try:
            response = await self._stub.ModelInfer(self.request(vector), timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise DependencyError("scorer", _reason(error), error.details() or "") from error
        try:
            # probabilities is FP32 [1, 2]: (legitimate, fraud).
            return float(struct.unpack("<2f", response.raw_output_contents[0])[1])
        except (IndexError, struct.error) as error:
            raise DependencyError("scorer", "bad_response", str(error)) from error
