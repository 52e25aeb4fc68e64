"""The servers' outermost interceptor keeps every kind of handler working while it times them:
the health service's Watch (a coroutine that writes its own responses) included."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import CollectorRegistry

from services.common.rpc_observer import RpcObserver, ServerMetrics


async def test_watch_and_check_answer_through_the_observer() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    server = grpc.aio.server(interceptors=[RpcObserver(metrics)])
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            checked = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert checked.status == health_pb2.HealthCheckResponse.SERVING
            call = stub.Watch(health_pb2.HealthCheckRequest(), timeout=5)
            first = await call.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            call.cancel()
    finally:
        await server.stop(0)
    timed = registry.get_sample_value(
        f"{metrics.rpc_duration._name}_count",
        {"rpc_service": "grpc.health.v1.Health", "rpc_method": "Check", "grpc_code": "OK"},
    )
    # Timed too: at least this call's Check is counted.
    assert timed is not None and timed >= 1.0
