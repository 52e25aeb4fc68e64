"""gRPC clients of the gateway's dependencies (feature service, scorer); they turn RPC
failures into DependencyError (``streams.py`` has the persistent-stream clients). ``GrpcModelProvider`` makes a model version ready in the
scorer (the v2 repository extension's ``RepositoryModelLoad``) for the lifecycle follower."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from fraud.v1 import features_pb2, features_pb2_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from services.gateway.ports import DependencyError, status_reason
from services.gateway.streams import (
    ModelRow,
    StreamModelClient,
    StreamPool,
    feature_values,
)
from services.models.repository import ModelMetadata
from services.models.v2 import BadResponse, RowRequests, fraud_probabilities, fraud_probability


def _reason(error: grpc.aio.AioRpcError) -> str:
    return status_reason(error.code().name)


class GrpcFeatureClient:
    """Calls fraud.v1.FeatureService/GetFeatures."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = features_pb2_grpc.FeatureServiceStub(channel)

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        """Store features by name; None for missing or stale ones."""
        request = features_pb2.GetFeaturesRequest(
            card_id=card_id, merchant_id=merchant_id, terminal_id=terminal_id
        )
        request.as_of.seconds, request.as_of.nanos = divmod(round(as_of_s * 1e9), 1_000_000_000)
        try:
            response = await self._stub.GetFeatures(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise DependencyError("features", _reason(error), error.details() or "") from error
        return feature_values(response)


class GrpcModelClient:
    """Calls inference.GRPCInferenceService/ModelInfer with one FP32 row as raw bytes."""

    def __init__(self, channel: grpc.aio.Channel, metadata: ModelMetadata) -> None:
        self._stub = v2_grpc.GRPCInferenceServiceStub(channel)
        self._requests = RowRequests.for_model(metadata)

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability of one row."""
        try:
            response = await self._stub.ModelInfer(
                self._requests.request(vector), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise DependencyError("scorer", _reason(error), error.details() or "") from error
        try:
            return fraud_probability(response)
        except BadResponse as error:
            raise DependencyError("scorer", "bad_response", str(error)) from error

    async def score_batch(self, vectors: list[list[float]], timeout_s: float) -> list[float]:
        """Fraud probabilities of several rows, in one call."""
        try:
            response = await self._stub.ModelInfer(self._requests.batch(vectors), timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise DependencyError("scorer", _reason(error), error.details() or "") from error
        try:
            return fraud_probabilities(response, len(vectors))
        except BadResponse as error:
            raise DependencyError("scorer", "bad_response", str(error)) from error


class GrpcModelProvider:
    """Makes versions ready in the scorer and builds clients that score with them."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        load_timeout_s: float,
        stream: StreamPool[ModelRow, float] | None = None,
    ) -> None:
        self._channel = channel
        self._stub = v2_grpc.GRPCInferenceServiceStub(channel)
        self._load_timeout_s = load_timeout_s
        self._stream = stream

    async def prepare(
        self, metadata: ModelMetadata, load: bool = True
    ) -> GrpcModelClient | StreamModelClient:
        """A client for ``metadata``'s version; with ``load``, once the scorer has it
        loaded and warmed (it also loads it by itself from the lifecycle file)."""
        if load:
            request = v2.RepositoryModelLoadRequest(model_name=metadata.name)
            request.parameters["version"].string_param = metadata.version
            try:
                await self._stub.RepositoryModelLoad(request, timeout=self._load_timeout_s)
            except grpc.aio.AioRpcError as error:
                raise DependencyError(
                    "scorer", _reason(error), f"loading v{metadata.version}: {error.details()}"
                ) from error
        if self._stream is None:
            return GrpcModelClient(self._channel, metadata)
        return StreamModelClient(self._stream, metadata)
