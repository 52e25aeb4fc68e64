"""A stopping server ends the streams its clients keep open instead of waiting out its grace
period for them, while a unary call in flight still gets that grace; a stream its client
cancelled before is not among those it ends. A real gRPC server on loopback, in process."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.common import streaming
from services.common.server import Runtime
from services.common.settings import ServerSettings

GRACE_S = 30.0
"""Far longer than any stop here may take: a stop that waited for it fails at once."""
_Request: TypeAlias = health_pb2.HealthCheckRequest
_Reply: TypeAlias = health_pb2.HealthCheckResponse


class _Echo:
    """A stream that answers every request (as the scorer's and the feature service's do)
    and a unary call that takes ``slow_s``."""

    name = "echo"

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.streams_ended: list[str] = []

    async def _stream(
        self, requests: AsyncIterator[_Request], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[_Reply]:
        await context.send_initial_metadata(())
        with streaming.held_open():
            async for _ in requests:
                yield _Reply(status=_Reply.SERVING)
        self.streams_ended.append("returned")

    async def _slow(self, request: _Request, context: grpc.aio.ServicerContext) -> _Reply:
        await asyncio.sleep(self.slow_s)
        return _Reply(status=_Reply.SERVING)

    def register(self, server: grpc.aio.Server) -> list[str]:
        handlers = {
            "Stream": grpc.stream_stream_rpc_method_handler(
                self._stream, _Request.FromString, _Reply.SerializeToString
            ),
            "Slow": grpc.unary_unary_rpc_method_handler(
                self._slow, _Request.FromString, _Reply.SerializeToString
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", handlers),))
        return []  # no descriptor for reflection to list: not a named service

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def _open_stream(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    call = channel.stream_stream("/t.Echo/Stream", _Request.SerializeToString, _Reply.FromString)()
    await call.write(_Request())
    assert (await call.read()).status == _Reply.SERVING
    return call


async def test_stop_ends_open_streams_with_ok_and_gives_unary_calls_their_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="services.common.server")
    service = _Echo(slow_s=0.5)
    runtime = Runtime(ServerSettings(grace_seconds=GRACE_S, drain_seconds=0.0), service)
    await runtime.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
        streams = [await _open_stream(channel) for _ in range(3)]
        cancelled = streams.pop()
        cancelled.cancel()  # its client went away: its handler ends on its own
        for _ in range(500):  # up to 10 s
            if len(streaming._OPEN) <= 2:
                break
            await asyncio.sleep(0.02)
        assert len(streaming._OPEN) == 2, "the cancelled stream's handler did not end"
        slow = channel.unary_unary("/t.Echo/Slow", _Request.SerializeToString, _Reply.FromString)
        in_flight = asyncio.ensure_future(slow(_Request(), timeout=GRACE_S))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await runtime.stop()
        took = time.monotonic() - started
        assert took < GRACE_S / 3, f"the stop waited {took:.1f} s for the open streams"
        assert (await in_flight).status == _Reply.SERVING  # the grace let it finish
        for call in streams:
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
    # The two streams held open returned (the cancelled one's handler returns or is cancelled,
    # as gRPC's timing has it).
    assert service.streams_ended.count("returned") >= 2
    (ended,) = [r for r in caplog.records if r.getMessage() == "open streams ended"]
    assert ended.streams == 2  # type: ignore[attr-defined]
    assert not streaming._OPEN and not streaming._ENDING
