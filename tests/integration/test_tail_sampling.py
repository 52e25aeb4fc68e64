"""The shipped tail-sampling policy, run by the real collector: with a keep share of 0 % for
ordinary traces, an error, a trace over the latency objective and a REVIEW are kept, and two
ordinary approvals are not; what is kept is forwarded over OTLP/HTTP (``http/protobuf``) to a
second collector, as ``fraudmesh up`` forwards to an endpoint of that protocol."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from services.mesh import Process, free_port, http_ok
from services.observability import collector

pytestmark = pytest.mark.integration

KEPT = ("error", "slow", "review")
DROPPED = ("approve-1", "approve-2")


def _start(config: collector.CollectorConfig, folder: Path, name: str) -> Process:
    binary = collector.binary()
    if binary is None:
        pytest.fail("otelcol-fraudmesh is not installed: run `make tools`")
    (folder / f"{name}.yaml").write_text(config.render())
    process = Process(
        name,
        collector.command(binary, folder / f"{name}.yaml"),
        ready=lambda: http_ok(f"http://127.0.0.1:{config.metrics_port}/metrics"),
        log_path=folder / f"{name}.log",
    )
    process.start()
    process.wait_ready(30)
    return process


@pytest.fixture(scope="module")
def collectors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, Path]]:
    """The mesh's collector at a keep share of 0 %, forwarding over OTLP/HTTP to a second one
    that keeps everything; (the first's OTLP/gRPC port, each one's traces file)."""
    folder = tmp_path_factory.mktemp("tail-sampling")
    back = collector.CollectorConfig(
        otlp_port=free_port(),
        metrics_port=free_port(),
        traces_path=folder / "downstream.jsonl",
        keep_percent=100,
        http_port=free_port(),
    )
    front = collector.CollectorConfig(
        otlp_port=free_port(),
        metrics_port=free_port(),
        traces_path=folder / "kept.jsonl",
        keep_percent=0,
        downstream=f"http://127.0.0.1:{back.http_port}/v1/traces",
        downstream_protocol="http/protobuf",
    )
    started = [_start(back, folder, "downstream")]
    try:
        started.append(_start(front, folder, "collector"))
        yield front.otlp_port, front.traces_path, back.traces_path
    finally:
        for process in reversed(started):
            process.stop()


def _send(port: int) -> dict[str, str]:
    """One root span per case, as the gateway ends them; the case's name → its trace id."""
    provider = TracerProvider(resource=Resource.create({"service.name": "fraudmesh-gateway"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True))
    )
    tracer = provider.get_tracer("tail-sampling-test")
    ids = {}
    for case in (*KEPT, *DROPPED):
        start = time.time_ns()
        took_ms = 60 if case == "slow" else 2
        span = tracer.start_span("fraud.v1.FraudScoring/Score", start_time=start)
        span.set_attribute("fraudmesh.decision", "review" if case == "review" else "approve")
        if case == "error":
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=start + took_ms * 1_000_000)
        ids[case] = format(span.get_span_context().trace_id, "032x")
    provider.force_flush()
    provider.shutdown()
    return ids


def _trace_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {
        span["traceId"]
        for line in path.read_text().splitlines()
        for resource in json.loads(line).get("resourceSpans", [])
        for scope in resource.get("scopeSpans", [])
        for span in scope.get("spans", [])
    }


def test_errors_slow_calls_and_reviews_are_kept_and_forwarded_over_http(
    collectors: tuple[int, Path, Path],
) -> None:
    port, kept_path, downstream_path = collectors
    ids = _send(port)
    wanted = {ids[c] for c in KEPT}
    deadline = time.monotonic() + collector.DECISION_WAIT_S + 30
    while time.monotonic() < deadline:
        if wanted <= _trace_ids(kept_path) and wanted <= _trace_ids(downstream_path):
            break
        time.sleep(0.5)
    # Every trace was decided at once (sent together): past the batch's second, whatever
    # was to be kept has been written.
    time.sleep(3)
    kept, forwarded = _trace_ids(kept_path), _trace_ids(downstream_path)
    names = {v: k for k, v in ids.items()}
    assert wanted <= kept, sorted(names.get(t, t) for t in kept)
    assert wanted <= forwarded, sorted(names.get(t, t) for t in forwarded)
    assert not kept & {ids[c] for c in DROPPED}, sorted(names.get(t, t) for t in kept)
    assert not forwarded & {ids[c] for c in DROPPED}
