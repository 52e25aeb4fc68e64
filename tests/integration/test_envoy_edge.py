"""The Envoy edge on its own: a real Envoy in front of a stub gateway (grpc.aio, port 0).

Checks what the edge adds: active gRPC health checking, routing of the API, health and
reflection, deadline handling, rich error details passing through, and the access log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common import envoy
from services.mesh import free_port

from .conftest import ANSWER_DEADLINE_S

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 15.0
"""Upper bound of every wait on a process or a health check."""


class StubScoring(pb_grpc.FraudScoringServicer):
    """Answers Score as the gateway would; merchant "slow" stalls, currency "XXX" is refused."""

    def __init__(self) -> None:
        self.time_remaining: list[float | None] = []

    async def Score(
        self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScoreResponse:
        self.time_remaining.append(context.time_remaining())
        if request.currency == "XXX":
            detail = any_pb2.Any()
            detail.Pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field="currency", description="'XXX' is not an ISO 4217 currency code"
                        )
                    ]
                )
            )
            status = status_pb2.Status(
                code=code_pb2.INVALID_ARGUMENT,
                message="currency: 'XXX' is not an ISO 4217 currency code",
                details=[detail],
            )
            await context.abort_with_status(rpc_status.to_status(status))
        if request.merchant_id == "slow":
            await asyncio.sleep(1.0)
        return pb.ScoreResponse(
            transaction_id=request.transaction_id,
            decision=pb.DECISION_APPROVE,
            score=0.01,
            reasons=["stub"],
            model_version="stub",
            scored_by=pb.SCORED_BY_RULES,
            feature_source=pb.FEATURE_SOURCE_DEFAULT,
            elapsed_ms=0.1,
        )


@dataclass
class Gateway:
    """The stub gateway: its port, health servicer and scoring servicer."""

    port: int
    health: health.aio.HealthServicer
    scoring: StubScoring


@dataclass(frozen=True)
class Edge:
    """A running Envoy: where to call it, its admin address and its access log."""

    target: str
    admin: str
    access_log: Path
    process: asyncio.subprocess.Process


@dataclass(frozen=True)
class Client:
    """A channel to the edge whose calls carry their own user agent, to find them in the log."""

    edge: Edge
    channel: grpc.aio.Channel
    agent: str

    async def log_entries(self, count: int = 1) -> list[dict[str, Any]]:
        """This client's access-log entries, once there are ``count`` (Envoy flushes late)."""
        entries: list[dict[str, Any]] = []

        async def written() -> bool:
            nonlocal entries
            if not self.edge.access_log.exists():
                return False
            lines = self.edge.access_log.read_bytes().splitlines()
            parsed = [json.loads(line) for line in lines if line.endswith(b"}")]
            entries = [e for e in parsed if self.agent in (e["user_agent"] or "")]
            return len(entries) >= count

        await wait_for(written, f"{count} access-log entries of {self.agent}")
        return entries


async def wait_for(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S
) -> None:
    """Polls the async ``check`` until it returns true; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def admin_get(edge: Edge, path: str) -> str:
    """GET on Envoy's admin interface, off the event loop."""

    def get() -> str:
        with urllib.request.urlopen(f"http://{edge.admin}{path}", timeout=2) as reply:
            return str(reply.read().decode())

    return await asyncio.to_thread(get)


async def host_health(edge: Edge, gateway: Gateway) -> str:
    """The gateway host's health_flags as /clusters reports them ("" before it is known)."""
    key = f"gateway::127.0.0.1:{gateway.port}::health_flags::"
    for line in (await admin_get(edge, "/clusters")).splitlines():
        if line.startswith(key):
            return line.removeprefix(key)
    return ""


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    """A grpc.aio server with health (SERVING), reflection and a stub FraudScoring."""
    server = grpc.aio.server()
    health_servicer = health.aio.HealthServicer()
    scoring = StubScoring()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    pb_grpc.add_FraudScoringServicer_to_server(scoring, server)
    reflection.enable_server_reflection(
        [
            pb.DESCRIPTOR.services_by_name["FraudScoring"].full_name,
            health.SERVICE_NAME,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    yield Gateway(port, health_servicer, scoring)
    await server.stop(0)


@pytest.fixture(scope="module")
async def proxy(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    """Envoy on free ports in front of the stub gateway; stopped by PID afterwards."""
    workdir = tmp_path_factory.mktemp("envoy")
    listen_port, admin_port = free_port(), free_port()
    config = workdir / "envoy.yaml"
    config.write_text(
        envoy.render_config(
            listen_port=listen_port,
            admin_port=admin_port,
            gateway_port=gateway.port,
            access_log_path=str(workdir / "access.log"),
        )
    )
    with (workdir / "envoy.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *envoy.envoy_command(config), stdout=log, stderr=log
        )
    running = Edge(
        f"127.0.0.1:{listen_port}", f"127.0.0.1:{admin_port}", workdir / "access.log", process
    )
    try:

        async def live() -> bool:
            if process.returncode is not None:
                log_text = (workdir / "envoy.log").read_text(errors="replace")
                pytest.fail(f"envoy exited with {process.returncode}:\n{log_text}")
            try:
                return (await admin_get(running, "/ready")).strip() == "LIVE"
            except OSError:
                return False

        await wait_for(live, "Envoy's admin /ready")
        yield running
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest.fixture
async def healthy(proxy: Edge, gateway: Gateway) -> Edge:
    """The edge once its health check has found the gateway healthy."""

    async def check() -> bool:
        return await host_health(proxy, gateway) == "healthy"

    await wait_for(check, "the gateway to pass Envoy's health check")
    return proxy


@pytest.fixture
async def client(healthy: Edge) -> AsyncIterator[Client]:
    """A fresh channel through the healthy edge, tagged with a user agent of its own."""
    agent = f"edge-test-{uuid.uuid4().hex}"
    options = [("grpc.primary_user_agent", agent)]
    async with grpc.aio.insecure_channel(healthy.target, options=options) as channel:
        yield Client(healthy, channel, agent)


def _request(**overrides: Any) -> pb.ScoreRequest:
    fields: dict[str, Any] = {
        "transaction_id": f"edge-{time.time_ns()}",
        "card_id": "card-1",
        "merchant_id": "merchant-1",
        "amount_minor": 1299,
        "currency": "EUR",
    }
    fields.update(overrides)
    request = pb.ScoreRequest(**fields)
    request.timestamp.GetCurrentTime()
    return request


def test_rendered_config_validates(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(envoy.render_config(listen_port=8080, admin_port=9901, gateway_port=50051))
    checked = subprocess.run(
        [str(envoy.envoy_binary()), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert '"/dev/stdout"' in config.read_text()


def test_render_config_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must differ"):
        envoy.render_config(listen_port=8080, admin_port=8080, gateway_port=50051)
    with pytest.raises(ValueError, match="must be a TCP port"):
        envoy.render_config(listen_port=0, admin_port=9901, gateway_port=50051)
    with pytest.raises(FileNotFoundError, match="template not found"):
        envoy.render_config(
            listen_port=8080, admin_port=9901, gateway_port=50051, template=tmp_path / "none"
        )


def test_envoy_command_lets_envoys_run_side_by_side(tmp_path: Path) -> None:
    command = envoy.envoy_command(tmp_path / "envoy.yaml")
    assert Path(command[0]) == envoy.envoy_binary()
    assert "--disable-hot-restart" in command
    assert command[command.index("--concurrency") + 1] == "1"
    with_id = envoy.envoy_command(tmp_path / "envoy.yaml", base_id=7)
    assert with_id[with_id.index("--base-id") + 1] == "7"
    assert "--disable-hot-restart" not in with_id


async def test_health_check_marks_the_gateway_healthy(healthy: Edge, gateway: Gateway) -> None:
    assert await host_health(healthy, gateway) == "healthy"
    stats = await admin_get(healthy, "/stats?filter=cluster.gateway.health_check.success")
    assert int(stats.split(":")[1]) >= 1


async def test_reflection_lists_services_through_envoy(client: Client) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    call = stub.ServerReflectionInfo(timeout=5.0)
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    reply = await call.read()
    await call.done_writing()
    names = {service.name for service in reply.list_services_response.service}
    assert {"fraud.v1.FraudScoring", health.SERVICE_NAME, reflection.SERVICE_NAME} <= names


async def test_reflection_v1_is_routed_to_the_gateway(client: Client, gateway: Gateway) -> None:
    # grpcio-reflection serves only v1alpha; newer clients try v1 first and fall back when
    # the gateway (not Envoy, which would say NR: no route) answers UNIMPLEMENTED.
    path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
    call = client.channel.stream_stream(
        path,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )(timeout=5.0)
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await call.done_writing()
        async for _ in call:
            pass
    assert await call.code() in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED)
    (entry,) = await client.log_entries()
    assert entry["path"] == path
    assert entry["upstream_host"] == f"127.0.0.1:{gateway.port}"
    assert entry["response_flags"] == "-"


async def test_calls_are_logged_with_their_grpc_status(client: Client, gateway: Gateway) -> None:
    request = _request()
    reply = await pb_grpc.FraudScoringStub(client.channel).Score(request, timeout=ANSWER_DEADLINE_S)
    assert reply.transaction_id == request.transaction_id
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await health_pb2_grpc.HealthStub(client.channel).Check(
            health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=ANSWER_DEADLINE_S
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND

    by_path = {e["path"]: e for e in await client.log_entries(count=2)}
    scored = by_path["/fraud.v1.FraudScoring/Score"]
    assert scored["grpc_status"] == "OK"
    assert scored["grpc_status_code"] == 0
    assert scored["upstream_host"] == f"127.0.0.1:{gateway.port}"
    assert scored["response_flags"] == "-"
    assert isinstance(scored["duration_us"], int) and scored["duration_us"] > 0
    checked = by_path["/grpc.health.v1.Health/Check"]
    assert checked["grpc_status"] == "NOT_FOUND"
    assert checked["grpc_status_code"] == grpc.StatusCode.NOT_FOUND.value[0]


async def test_field_violations_pass_through_envoy(client: Client) -> None:
    call = pb_grpc.FraudScoringStub(client.channel).Score(
        _request(currency="XXX"), timeout=ANSWER_DEADLINE_S
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = await rpc_status.aio.from_call(call)
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [v.field for v in bad_request.field_violations] == ["currency"]


ROUNDING_S = 0.005
"""Slack for the grpc-timeout header's rounding up, well below the 20 ms between the caps."""


@pytest.mark.parametrize(
    ("client_timeout_s", "cap_s"),
    [(None, 0.050), (5.0, 0.050), (0.030, 0.030)],
    ids=["no-deadline", "long-deadline", "short-deadline"],
)
async def test_gateway_gets_the_callers_deadline_capped_at_the_route_limit(
    client: Client, gateway: Gateway, client_timeout_s: float | None, cap_s: float
) -> None:
    gateway.scoring.time_remaining.clear()
    await pb_grpc.FraudScoringStub(client.channel).Score(_request(), timeout=client_timeout_s)
    (remaining,) = gateway.scoring.time_remaining
    assert remaining is not None
    # The grpc-timeout header is rounded up to its unit on every hop, so the remaining time
    # may exceed the cap by a little; the two caps (30 and 50 ms) stay far apart.
    assert 0 < remaining <= cap_s + ROUNDING_S


async def test_a_call_past_the_limit_ends_with_deadline_exceeded(client: Client) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await pb_grpc.FraudScoringStub(client.channel).Score(_request(merchant_id="slow"))
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    (entry,) = await client.log_entries()
    assert entry["path"] == "/fraud.v1.FraudScoring/Score"
    assert entry["grpc_status"] == "DEADLINE_EXCEEDED"
    # Envoy's stream timer and the gateway's own timer (from the grpc-timeout Envoy sent)
    # expire together; either may end the call.
    assert entry["details"] in ("max_duration_timeout", "via_upstream")


@pytest.fixture(scope="module")
def score_binary(go_score_client: Path) -> Path:
    """The Go client (built once per run)."""
    return go_score_client


async def test_go_client_through_envoy(healthy: Edge, score_binary: Path) -> None:
    async def score(*flags: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            str(score_binary),
            "-addr",
            healthy.target,
            "-card-id",
            "card-1",
            "-merchant-id",
            "merchant-1",
            "-amount-minor",
            "1299",
            *flags,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), WAIT_S)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    code, out, err = await score("-json", "-transaction-id", "go-1")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["transactionId"] == "go-1"
    assert answer["decision"] == "DECISION_APPROVE"

    code, out, err = await score("-currency", "XXX")
    assert code == 1
    assert "INVALID_ARGUMENT" in err
    assert "field currency: 'XXX' is not an ISO 4217 currency code" in err

    code, out, err = await score("-currency", "euro")
    assert code == 2
    assert "-currency" in err


async def test_an_unhealthy_gateway_is_not_called(client: Client, gateway: Gateway) -> None:
    # healthy_panic_threshold 0: with its only host failing checks, Envoy answers
    # UNAVAILABLE at once instead of calling a gateway that is warming up or draining.
    await gateway.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    try:

        async def failed() -> bool:
            return "failed_active_hc" in await host_health(client.edge, gateway)

        await wait_for(failed, "Envoy to mark the gateway unhealthy")
        calls_before = len(gateway.scoring.time_remaining)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.FraudScoringStub(client.channel).Score(_request(), timeout=1.0)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert len(gateway.scoring.time_remaining) == calls_before
        (entry,) = await client.log_entries()
        assert entry["path"] == "/fraud.v1.FraudScoring/Score"
        assert entry["response_flags"] == "UH"
    finally:
        await gateway.health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def recovered() -> bool:
        return await host_health(client.edge, gateway) == "healthy"

    await wait_for(recovered, "the gateway to pass Envoy's health check again")
