"""One feature row as Open Inference Protocol v2 tensors, and the fraud probability back.

The gateway sends every row the same way: one FP32 [1, n] input carried as little-endian
``raw_input_contents`` (no per-value protobuf encoding), and it reads the probability
output [1, 2] (legitimate, fraud) from ``raw_output_contents``. Load tests build their
request files with the same code.
"""

from __future__ import annotations

import struct

from inference import grpc_predict_v2_pb2 as v2
from services.models.repository import ModelMetadata

_PROBABILITIES = struct.Struct("<2f")

TRACEPARENTS = "traceparent"
"""The request parameter that carries each row's W3C trace context on a stream, comma-joined
in row order (empty for untraced rows), so the scorer's spans join their callers' traces."""


class BadResponse(ValueError):
    """A ModelInfer response without the expected FP32 [1, 2] probability output."""


class RowRequests:
    """Builds ModelInfer requests for single rows of one model version."""

    def __init__(
        self,
        model_name: str,
        model_version: str,
        input_name: str,
        n_features: int,
        output_name: str | None = None,
    ) -> None:
        self.n_features = n_features
        self._pack = struct.Struct(f"<{n_features}f").pack
        # Everything but the row is the same on every call: built once, copied per call
        # (a third of the cost of building the nested messages each time).
        self._template = v2.ModelInferRequest(
            model_name=model_name,
            model_version=model_version,
            inputs=[
                v2.ModelInferRequest.InferInputTensor(
                    name=input_name, datatype="FP32", shape=(1, n_features)
                )
            ],
        )
        if output_name:
            self._template.outputs.add(name=output_name)

    @classmethod
    def for_model(cls, metadata: ModelMetadata) -> RowRequests:
        """Requests for the version ``metadata`` describes, asking for its probability output."""
        return cls(
            metadata.name,
            metadata.version,
            metadata.input_name,
            len(metadata.feature_order),
            metadata.output_name,
        )

    def request(self, vector: list[float]) -> v2.ModelInferRequest:
        """The ModelInfer request for one feature vector."""
        request = v2.ModelInferRequest()
        request.CopyFrom(self._template)
        request.raw_input_contents.append(self._pack(*vector))
        return request

    def batch(self, vectors: list[list[float]]) -> v2.ModelInferRequest:
        """One ModelInfer request for several feature vectors: FP32 [k, n]."""
        request = v2.ModelInferRequest()
        request.CopyFrom(self._template)
        request.inputs[0].shape[0] = len(vectors)
        request.raw_input_contents.append(b"".join(self._pack(*v) for v in vectors))
        return request


def fraud_probability(response: v2.ModelInferResponse) -> float:
    """The fraud probability of a one-row response; raises BadResponse when it has none."""
    try:
        return float(_PROBABILITIES.unpack(response.raw_output_contents[0])[1])
    except (IndexError, struct.error) as error:
        raise BadResponse(f"no FP32 [1, 2] probabilities in the response: {error}") from error


def fraud_probabilities(response: v2.ModelInferResponse, rows: int) -> list[float]:
    """The fraud probability of each row of a ``rows``-row response; raises BadResponse."""
    try:
        values = struct.unpack(f"<{2 * rows}f", response.raw_output_contents[0])
    except (IndexError, struct.error) as error:
        raise BadResponse(f"no FP32 [{rows}, 2] probabilities in the response: {error}") from error
    return [float(v) for v in values[1::2]]
