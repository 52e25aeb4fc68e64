"""The shared server runtime against hostile calls: a real ``Runtime`` (grpc.aio, port 0) in
this process with a small FraudScoring servicer. Whatever the bytes, the answer is a clear
status, and the rule holds for every method on the server, health and reflection included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common.errors import InvalidArgument
from services.common.server import Runtime
from services.common.settings import ServerSettings

pytestmark = pytest.mark.integration

MAX_REQUEST = 4096


class Scoring(pb_grpc.FraudScoringServicer):
    """Answers like the gateway for valid input; merchant ids pick a failure to raise."""

    async def Score(
        self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScoreResponse:
        if request.merchant_id == "bug":
            raise RuntimeError("a bug with a secret inside: hunter2")
        if request.merchant_id == "slow":
            await asyncio.sleep(0.5)
        if request.merchant_id == "long":
            raise InvalidArgument("merchant_id", "x" * 100_000)
        # Conversions that raise on out-of-range timestamps: the runtime must have refused.
        request.timestamp.ToDatetime()
        return pb.ScoreResponse(transaction_id=request.transaction_id)


@dataclass
class ScoringApp:
    """The Service contract for the runtime."""

    name: str = "test"

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the scoring servicer."""
        pb_grpc.add_FraudScoringServicer_to_server(Scoring(), server)
        return ["fraud.v1.FraudScoring"]

    async def start(self) -> None:
        """Nothing to load."""

    async def close(self) -> None:
        """Nothing to release."""


@pytest.fixture(scope="module")
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a started runtime with a small request limit."""
    runtime = Runtime(
        ServerSettings(port=0, max_request_bytes=MAX_REQUEST, drain_seconds=0), ScoringApp()
    )
    await runtime.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as ch:
        yield ch
    await runtime.server.stop(0)


def _valid(**overrides: object) -> pb.ScoreRequest:
    fields: dict[str, object] = {
        "transaction_id": "t-1",
        "card_id": "c",
        "merchant_id": "m",
        "timestamp": Timestamp(seconds=int(time.time())),
    }
    fields.update(overrides)
    return pb.ScoreRequest(**fields)  # type: ignore[arg-type]


async def _raw(channel: grpc.aio.Channel, method: str, data: bytes) -> grpc.aio.AioRpcError | None:
    call = channel.unary_unary(method)
    try:
        await call(data, timeout=5)
    except grpc.aio.AioRpcError as error:
        return error
    return None


def _violation(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)
    assert status is not None
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail)
    return detail.field_violations[0].field


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b"\xff\xff\xff\xff\x0f\x01", "request"),
        (_valid().SerializeToString()[:-2], "timestamp"),
        (b"\x12\x02\xc3\x28", "card_id"),
        (_valid(timestamp=Timestamp(seconds=-(2**40))).SerializeToString(), "timestamp"),
        (_valid(timestamp=Timestamp(seconds=0, nanos=-1)).SerializeToString(), "timestamp"),
        (_valid(channel=9).SerializeToString(), "channel"),
    ],
    # Named by what is wrong: the bytes carry the time of collection, and every process
    # that collects (pytest-xdist's workers) must name the same tests.
    ids=[
        "not-a-message",
        "truncated",
        "invalid-utf8-card_id",
        "timestamp-before-year-1",
        "negative-nanos",
        "unknown-channel",
    ],
)
async def test_undecodable_or_unusable_requests_are_invalid_argument(
    channel: grpc.aio.Channel, data: bytes, field: str
) -> None:
    error = await _raw(channel, "/fraud.v1.FraudScoring/Score", data)
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert _violation(error) == field
    assert (error.details() or "").startswith(field)


async def test_valid_request_is_served(channel: grpc.aio.Channel) -> None:
    error = await _raw(channel, "/fraud.v1.FraudScoring/Score", _valid().SerializeToString())
    assert error is None


async def test_oversized_request_is_resource_exhausted(channel: grpc.aio.Channel) -> None:
    data = _valid(card_id="c" * MAX_REQUEST).SerializeToString()
    error = await _raw(channel, "/fraud.v1.FraudScoring/Score", data)
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_bug_is_internal_without_detail(channel: grpc.aio.Channel) -> None:
    error = await _raw(
        channel, "/fraud.v1.FraudScoring/Score", _valid(merchant_id="bug").SerializeToString()
    )
    assert error is not None and error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == "internal error"


async def test_long_messages_are_capped(channel: grpc.aio.Channel) -> None:
    error = await _raw(
        channel, "/fraud.v1.FraudScoring/Score", _valid(merchant_id="long").SerializeToString()
    )
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(error.details() or "") <= 512
    status = rpc_status.from_call(error)
    assert status is not None and len(status.SerializeToString()) < 1200


async def test_an_expired_deadline_is_deadline_exceeded(channel: grpc.aio.Channel) -> None:
    # grpcio rounds a zero timeout up to a few microseconds on the wire, so whether such a
    # call is over when it arrives varies; either way the answer is OK or DEADLINE_EXCEEDED.
    call = channel.unary_unary("/fraud.v1.FraudScoring/Score")
    codes = set()
    for _ in range(50):
        try:
            await call(_valid().SerializeToString(), timeout=0)
            codes.add(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as error:
            codes.add(error.code())
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED}
    # A handler still working when the deadline passes.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(_valid(merchant_id="slow").SerializeToString(), timeout=0.05)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_health_refuses_garbage_clearly(channel: grpc.aio.Channel) -> None:
    error = await _raw(channel, "/grpc.health.v1.Health/Check", b"\x0a\x02\xff\xff")
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violation(error) == "service"
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in watch(b"\x0a\x02\xff\xff", timeout=5):
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_reflection_stream_refuses_garbage_clearly(channel: grpc.aio.Channel) -> None:
    call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    stream = call(timeout=5)
    await stream.write(b"\xff\xff\xff")
    await stream.done_writing()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in stream:
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_streamed_message_that_breaks_names_the_field(channel: grpc.aio.Channel) -> None:
    # Field 3 of ServerReflectionRequest is file_by_filename, a string: invalid UTF-8 in it.
    valid = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    stream = call(timeout=5)
    await stream.write(valid)
    await stream.write(b"\x1a\x02\xc3\x28")
    await stream.done_writing()
    replies = 0
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in stream:
            replies += 1
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("file_by_filename: ")
    assert _violation(caught.value) == "file_by_filename"
    assert replies == 1


async def test_reflection_resolves_the_method_symbol(channel: grpc.aio.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    stream = stub.ServerReflectionInfo(timeout=5)
    await stream.write(
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="fraud.v1.FraudScoring.Score")
    )
    reply = await stream.read()
    await stream.done_writing()
    assert reply.HasField("file_descriptor_response"), reply


async def test_a_method_the_servicer_does_not_implement(channel: grpc.aio.Channel) -> None:
    error = await _raw(channel, "/fraud.v1.FraudScoring/Explain", b"")
    assert error is not None and error.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_health_list_answers_every_status_and_refuses_bad_bytes(
    channel: grpc.aio.Channel,
) -> None:
    # grpcio's stock List is synchronous: called once, it kept the server from stopping.
    reply = await health_pb2_grpc.HealthStub(channel).List(
        health_pb2.HealthListRequest(), timeout=5
    )
    assert reply.statuses["fraud.v1.FraudScoring"].status == health_pb2.HealthCheckResponse.SERVING
    error = await _raw(channel, "/grpc.health.v1.Health/List", b"\x00")
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_metadata_is_bounded_at_one_clear_limit(channel: grpc.aio.Channel) -> None:
    call = channel.unary_unary("/fraud.v1.FraudScoring/Score")
    data = _valid().SerializeToString()
    # Below the limit (and above grpcio's default soft limit of 8 KiB): always served.
    for _ in range(5):
        await call(data, timeout=5, metadata=[("x-note", "n" * 20_000)])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(data, timeout=5, metadata=[("x-note", "n" * 70_000)])
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
