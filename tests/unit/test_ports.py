"""The gateway's ports: the status names and the one status → reason map."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2

from services.gateway.ports import STATUS_NAMES, status_reason


def test_status_names_are_grpcs_by_number() -> None:
    assert {code.value[0]: code.name for code in grpc.StatusCode} == dict(enumerate(STATUS_NAMES))
    assert [code_pb2.Code.Name(n) for n in range(len(STATUS_NAMES))] == list(STATUS_NAMES)


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK])
def test_a_status_gives_the_same_reason_by_name_and_by_number(code: grpc.StatusCode) -> None:
    assert status_reason(code.name) == status_reason(code.value[0])


def test_reasons() -> None:
    assert status_reason("DEADLINE_EXCEEDED") == "timeout"
    assert status_reason("UNAVAILABLE") == "unavailable"
    assert status_reason("INTERNAL") == "internal"
    assert status_reason(code_pb2.RESOURCE_EXHAUSTED) == "resource_exhausted"
    # No error status at all: neither a status name nor a known number.
    for nothing in ("OK", "", "internal error", "Exception", 0, 99, -1):
        assert status_reason(nothing) == "unknown"
