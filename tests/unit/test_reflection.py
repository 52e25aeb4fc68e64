"""Reflection resolves methods, fields and enum values, and only the served files."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from google.rpc import status_pb2
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection_pb2

from fraud.v1 import scoring_pb2
from inference import grpc_predict_v2_pb2
from services.common.reflection import ReflectionServicer

SERVICER = ReflectionServicer(["fraud.v1.FraudScoring", health.SERVICE_NAME])


def _files(symbol: str) -> list[str]:
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
    response = SERVICER._file_containing_symbol(request, symbol)
    if response.HasField("error_response"):
        return []
    names = []
    for raw in response.file_descriptor_response.file_descriptor_proto:
        proto = descriptor_pb2.FileDescriptorProto()
        proto.ParseFromString(raw)
        names.append(proto.name)
    return names


@pytest.mark.parametrize(
    "symbol",
    [
        "fraud.v1.FraudScoring",
        "fraud.v1.FraudScoring.Score",
        "fraud.v1.ScoreRequest",
        "fraud.v1.ScoreRequest.card_id",
        "fraud.v1.Decision",
        "fraud.v1.Decision.DECISION_APPROVE",
        "fraud.v1.DECISION_APPROVE",
    ],
)
def test_symbols_of_the_public_api_resolve_to_its_file(symbol: str) -> None:
    files = _files(symbol)
    assert files[0] == scoring_pb2.DESCRIPTOR.name
    assert "google/protobuf/timestamp.proto" in files


def test_health_methods_resolve() -> None:
    assert _files("grpc.health.v1.Health.Check")


@pytest.mark.parametrize(
    "symbol",
    [
        "fraud.v1.FraudScoring.Nope",
        "fraud.v1.Decision.NOPE",
        "nothing",
        "",
        # In this process's descriptor pool, but not served by this server.
        status_pb2.Status.DESCRIPTOR.full_name,
        grpc_predict_v2_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
        + ".ModelInfer",
    ],
)
def test_unknown_or_unserved_symbols_are_not_found(symbol: str) -> None:
    assert _files(symbol) == []


def test_files_outside_the_served_closure_are_not_found() -> None:
    request = reflection_pb2.ServerReflectionRequest(file_by_filename="google/rpc/status.proto")
    response = SERVICER._file_by_filename(request, "google/rpc/status.proto")
    assert response.HasField("error_response")
    request = reflection_pb2.ServerReflectionRequest(file_by_filename=scoring_pb2.DESCRIPTOR.name)
    response = SERVICER._file_by_filename(request, scoring_pb2.DESCRIPTOR.name)
    assert response.HasField("file_descriptor_response")
