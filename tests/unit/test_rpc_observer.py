"""The servers' outermost interceptor keeps every kind of handler working while it times them:
the health service's Watch (a coroutine that writes its own responses) included. Garbage
collections are timed without ever waiting on a metric's lock."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import CollectorRegistry

from services.common.rpc_observer import GcPauses, RpcObserver, ServerMetrics


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


def test_collections_are_noted_then_observed_on_flush() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    pauses = GcPauses(metrics)

    def full() -> float:
        # Deltas: in multiprocess mode a value starts from what the process wrote before.
        name = f"{metrics.gc_pause._name}_count"
        return registry.get_sample_value(name, {"generation": "2"}) or 0.0

    before = full()
    pauses.install()
    try:
        gc.collect()
        assert full() == before
        pauses.flush()
        assert full() >= before + 1
    finally:
        pauses.uninstall()
    assert pauses not in gc.callbacks


# Importing feast before prometheus_client puts it in multiprocess mode: one lock for every
# value, held while the value's file is written, which allocates. A collection starting there
# used to observe its pause from the callback and wait on that lock on the thread holding it.
_COLLECT_WHILE_WRITING = textwrap.dedent(
    """
    import gc, os, sys, tempfile
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
    from prometheus_client import CollectorRegistry, Counter, values
    from services.common.rpc_observer import GcPauses, ServerMetrics
    assert values.ValueClass.__name__ == "MmapedValue", values.ValueClass
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    pauses = GcPauses(metrics)
    pauses.install()
    gc.set_threshold(1, 1, 1)
    counter = Counter("written_total", "new keys write the file", ["k"], registry=registry)
    for i in range(500):
        counter.labels(str(i)).inc()
    gc.set_threshold(700, 10, 10)
    pauses.flush()
    total = sum(
        registry.get_sample_value(f"{metrics.gc_pause._name}_count", {"generation": str(g)}) or 0
        for g in range(3)
    )
    print(int(total))
    """
)


def test_a_collection_inside_a_multiprocess_write_does_not_deadlock() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _COLLECT_WHILE_WRITING],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Hundreds of collections ran inside writes, and each was observed after.
    assert int(done.stdout.strip()) >= 100, done.stdout
