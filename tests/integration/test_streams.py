"""Persistent streams (services/gateway/streams.py) against a real gRPC server whose
StreamFeatures the test steers: correlation, per-message deadlines, late replies, a
dependency killed mid-stream, reconnection, stalls and batching."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from fraud.v1 import features_pb2 as pb
from fraud.v1 import features_pb2_grpc as pb_grpc
from services.common.channels import insecure_channel
from services.gateway.metrics import GatewayMetrics
from services.gateway.ports import DependencyError
from services.gateway.streams import (
    FeatureCodec,
    StreamFeatureClient,
    StreamPool,
    StreamSettings,
)

pytestmark = pytest.mark.integration


@dataclass
class Steering:
    """What the test server does with each request."""

    hold: bool = False
    """Keep requests unanswered until ``release`` is set."""
    reverse_after: int = 0
    """Collect this many requests, then answer them last first."""
    delay_s: Callable[[str], float] = lambda card: 0.0
    received: list[pb.StreamFeaturesRequest] = field(default_factory=list)
    opened: int = 0
    """Streams the server has seen opened."""
    release: asyncio.Event = field(default_factory=asyncio.Event)


def _answer(request: pb.StreamFeaturesRequest) -> pb.StreamFeaturesResponse:
    """Echoes each lookup's card number as the feature ``echo``."""
    reply = pb.StreamFeaturesResponse(id=request.id)
    for lookup in request.lookups:
        result = reply.results.add()
        result.features.add(
            name="echo",
            value=float(lookup.card_id.rsplit("-", 1)[1]),
            status=pb.FEATURE_STATUS_PRESENT,
        )
    return reply


class SteeredFeatures(pb_grpc.FeatureServiceServicer):
    """StreamFeatures as the test steers it."""

    def __init__(self, steering: Steering) -> None:
        self.steering = steering

    async def StreamFeatures(
        self, request_iterator: AsyncIterator[pb.StreamFeaturesRequest], context: Any
    ) -> None:
        s = self.steering
        s.opened += 1
        await context.send_initial_metadata(())
        lock = asyncio.Lock()
        held: list[pb.StreamFeaturesRequest] = []
        tasks: set[asyncio.Task[None]] = set()

        async def later(request: pb.StreamFeaturesRequest, delay: float) -> None:
            await asyncio.sleep(delay)
            async with lock:
                await context.write(_answer(request))

        async for request in request_iterator:
            s.received.append(request)
            if s.hold:
                continue
            delay = s.delay_s(request.lookups[0].card_id)
            if delay:
                task = asyncio.create_task(later(request, delay))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                continue
            if s.reverse_after:
                held.append(request)
                if len(held) == s.reverse_after:
                    for r in reversed(held):
                        async with lock:
                            await context.write(_answer(r))
                    held.clear()
                continue
            async with lock:
                await context.write(_answer(request))
        # The client is done sending: answer what is still being worked on, then end.
        if tasks:
            await asyncio.gather(*tasks)


class Server:
    """A grpc.aio server on a fixed loopback port that can be killed and started again."""

    def __init__(self, steering: Steering) -> None:
        self.steering = steering
        self.port = 0
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_FeatureServiceServicer_to_server(SteeredFeatures(self.steering), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self.server = server

    async def kill(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None


def _pool(
    target: str, metrics: GatewayMetrics, **settings: Any
) -> StreamPool[tuple[str, str, float, str], Any]:
    pool: StreamPool[tuple[str, str, float, str], Any] = StreamPool(
        insecure_channel(target), FeatureCodec(), metrics, StreamSettings(**settings)
    )
    pool.start()
    return pool


def _metric(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def _until(predicate: Callable[[], Any], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry())


async def test_replies_reach_their_callers_in_any_order(metrics: GatewayMetrics) -> None:
    steering = Steering(reverse_after=6)
    server = Server(steering)
    await server.start()
    pool = _pool(f"127.0.0.1:{server.port}", metrics, streams=1, max_batch=1)
    client = StreamFeatureClient(pool)
    try:
        assert await pool.wait_open(20)
        values = await asyncio.gather(
            *(client.get(f"card-{n}", "merch-1", time.time(), 20.0) for n in range(6))
        )
        assert [v["echo"] for v in values] == [float(n) for n in range(6)]
        # All six went on the one stream, each as its own message with its own id.
        ids = [r.id for r in steering.received]
        assert len(set(ids)) == 6
    finally:
        await pool.close()
        await server.kill()


async def test_each_request_carries_its_own_deadline_and_late_replies_are_dropped(
    metrics: GatewayMetrics,
) -> None:
    steering = Steering(delay_s=lambda card: 10.0 if card == "card-999" else 0.0)
    server = Server(steering)
    await server.start()
    pool = _pool(f"127.0.0.1:{server.port}", metrics, streams=1)
    client = StreamFeatureClient(pool)
    try:
        assert await pool.wait_open(20)
        started = time.monotonic()
        with pytest.raises(DependencyError) as raised:
            await client.get("card-999", "merch-1", time.time(), 0.05)
        assert raised.value.reason == "timeout"
        # The caller was answered by its deadline, not by the reply 10 s later.
        assert time.monotonic() - started < 8.0
        # The deadline travelled with the message, in microseconds.
        assert 0 < steering.received[-1].timeout_us <= 50_000
        # Other requests on the same stream are answered meanwhile.
        assert (await client.get("card-7", "merch-1", time.time(), 20.0))["echo"] == 7.0
        await _until(
            lambda: (
                _metric(metrics, "fraudmesh_stream_late_replies_total", dependency="features")
                == 1.0
            )
        )
        assert pool.open_streams == 1
        assert (
            _metric(
                metrics, "fraudmesh_stream_reconnects_total", dependency="features", reason="ended"
            )
            == 0.0
        )
    finally:
        await pool.close()
        await server.kill()


async def test_a_dependency_killed_mid_stream_fails_pending_requests_at_once_then_reconnects(
    metrics: GatewayMetrics,
) -> None:
    steering = Steering(hold=True)
    server = Server(steering)
    await server.start()
    pool = _pool(f"127.0.0.1:{server.port}", metrics, streams=2, backoff_max_s=0.2)
    client = StreamFeatureClient(pool)
    try:
        assert await pool.wait_open(20)
        await _until(lambda: pool.open_streams == 2)
        pending = [
            asyncio.create_task(client.get(f"card-{n}", "merch-1", time.time(), 30.0))
            for n in range(8)
        ]
        await _until(lambda: sum(len(r.lookups) for r in steering.received) == 8)
        started = time.monotonic()
        await server.kill()
        results = await asyncio.gather(*pending, return_exceptions=True)
        # Every waiting caller hears at once, long before its 30 s deadline, so the
        # gateway's fallbacks can still answer inside the budget.
        assert time.monotonic() - started < 10.0
        assert all(isinstance(r, DependencyError) and r.reason == "unavailable" for r in results)
        assert pool.open_streams == 0
        # With no stream open, a request fails at once instead of waiting.
        with pytest.raises(DependencyError) as raised:
            await client.get("card-1", "merch-1", time.time(), 30.0)
        assert raised.value.reason == "unavailable"

        steering.hold = False
        await server.start()  # same port
        assert await pool.wait_open(30)
        assert (await client.get("card-5", "merch-1", time.time(), 20.0))["echo"] == 5.0
        await _until(lambda: pool.open_streams == 2)
        reconnects = sum(
            s.value
            for family in metrics.registry.collect()
            if family.name == "fraudmesh_stream_reconnects"
            for s in family.samples
            if s.name.endswith("_total")
        )
        assert reconnects >= 2
    finally:
        await pool.close()
        await server.kill()


async def test_a_stream_that_stops_answering_is_reset(metrics: GatewayMetrics) -> None:
    steering = Steering(hold=True)
    server = Server(steering)
    await server.start()
    pool = _pool(f"127.0.0.1:{server.port}", metrics, streams=1, stall_s=0.2, backoff_max_s=0.2)
    client = StreamFeatureClient(pool)
    try:
        assert await pool.wait_open(20)

        async def stalled() -> float:
            with contextlib.suppress(DependencyError):
                await client.get("card-1", "merch-1", time.time(), 0.05)
            return _metric(
                metrics, "fraudmesh_stream_resets_total", dependency="features", reason="stalled"
            )

        deadline = time.monotonic() + 20
        while await stalled() < 1:
            assert time.monotonic() < deadline, "the stalled stream was never reset"
            await asyncio.sleep(0.05)
        steering.hold = False
        await _until(lambda: pool.open_streams == 1)
        assert (await client.get("card-3", "merch-1", time.time(), 20.0))["echo"] == 3.0
    finally:
        await pool.close()
        await server.kill()


async def test_waiting_requests_are_coalesced_when_batching_is_on(
    metrics: GatewayMetrics,
) -> None:
    steering = Steering()
    server = Server(steering)
    await server.start()
    pool = _pool(f"127.0.0.1:{server.port}", metrics, streams=1, max_batch=8)
    client = StreamFeatureClient(pool)
    try:
        assert await pool.wait_open(20)
        values = await asyncio.gather(
            *(client.get(f"card-{n}", "merch-1", time.time(), 20.0) for n in range(20))
        )
        assert [v["echo"] for v in values] == [float(n) for n in range(20)]
        sizes = [len(r.lookups) for r in steering.received]
        assert sum(sizes) == 20
        assert max(sizes) > 1
        assert max(sizes) <= 8
    finally:
        await pool.close()
        await server.kill()


async def test_a_max_queue_delay_gathers_requests_only_while_they_come_often(
    metrics: GatewayMetrics,
) -> None:
    steering = Steering()
    server = Server(steering)
    await server.start()
    pool = _pool(
        f"127.0.0.1:{server.port}", metrics, streams=1, max_batch=8, max_queue_delay_s=0.05
    )
    client = StreamFeatureClient(pool)

    def holds() -> float:
        return _metric(metrics, "fraudmesh_stream_holds_total", dependency="features")

    try:
        assert await pool.wait_open(20)
        # Low load: each request waits for its answer and the next comes 150 ms later, far
        # apart compared with the 50 ms delay, so none is held.
        for n in range(6):
            assert (await client.get(f"card-{n}", "merch-1", time.time(), 20.0))["echo"] == n
            await asyncio.sleep(0.15)
        assert holds() == 0
        assert [len(r.lookups) for r in steering.received] == [1] * 6
        steering.received.clear()

        # Busy: a request every millisecond or so. Once the lane has seen them coming, the
        # first of a message waits up to 50 ms and leaves with those that joined it.
        async def one(n: int) -> float:
            return (await client.get(f"card-{n}", "merch-1", time.time(), 20.0))["echo"]

        calls = []
        for n in range(40):
            calls.append(asyncio.create_task(one(n)))
            await asyncio.sleep(0.001)
        assert await asyncio.gather(*calls) == [float(n) for n in range(40)]
        sizes = [len(r.lookups) for r in steering.received]
        assert sum(sizes) == 40
        assert max(sizes) <= 8
        assert holds() > 0
        assert len(sizes) < 20, sizes
    finally:
        await pool.close()
        await server.kill()


async def test_no_reachable_dependency_never_opens_and_fails_fast(
    metrics: GatewayMetrics,
) -> None:
    # A port nothing listens on: taken from a server that is then stopped.
    server = Server(Steering())
    await server.start()
    port = server.port
    await server.kill()
    pool = _pool(f"127.0.0.1:{port}", metrics, streams=1)
    client = StreamFeatureClient(pool)
    try:
        assert not await pool.wait_open(0.5)
        with pytest.raises(DependencyError) as raised:
            await client.get("card-1", "merch-1", time.time(), 5.0)
        assert raised.value.reason == "unavailable"
    finally:
        await pool.close()


async def test_old_streams_are_replaced_without_failing_a_request(
    metrics: GatewayMetrics,
) -> None:
    steering = Steering(delay_s=lambda card: 0.02)
    server = Server(steering)
    await server.start()
    pool = _pool(f"127.0.0.1:{server.port}", metrics, streams=2, max_age_s=0.3)
    client = StreamFeatureClient(pool)
    try:
        assert await pool.wait_open(20)
        await _until(lambda: pool.open_streams == 2)
        answered = 0
        deadline = time.monotonic() + 30
        # Requests in flight all the time (each takes 20 ms at the server) while streams age.
        while steering.opened < 6:
            assert time.monotonic() < deadline, "streams were not replaced"
            values = await asyncio.gather(
                *(client.get(f"card-{n}", "merch-1", time.time(), 10.0) for n in range(4))
            )
            assert [v["echo"] for v in values] == [0.0, 1.0, 2.0, 3.0]
            answered += 4
        rotated = _metric(
            metrics, "fraudmesh_stream_reconnects_total", dependency="features", reason="max_age"
        )
        assert rotated >= 4
        assert answered > 0
    finally:
        await pool.close()
        await server.kill()
