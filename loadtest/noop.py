"""The mesh's no-work floor: the same topology with services that do nothing but answer.

Envoy (the same bootstrap) → a gateway that calls a feature service and then a scorer,
each a grpc.aio server on the shared runtime (``services.common.server``: same server
options, interceptor, health, reflection, ``gc.freeze``) and the same client channel
options. Every answer is a message built once at start with the size and shape of the real
one (17 features with timestamps; a [1, 2] FP32 probability and a label; a full
ScoreResponse with reasons), so what remains is the cost of the hops, the serialization
and the Python gRPC runtime: the floor the real mesh is compared with.

``--bare`` runs the same roles with nothing of the project's runtime: a plain ``grpc.aio``
server with generic handlers that take and return raw bytes (no protobuf parsing or
building, no interceptor, reflection, metrics or tuned options; only the health service
Envoy and the readiness probe need). It measures what Python gRPC and Envoy cost on this
machine in this topology, below which no code of the project's can go.

Run one role with ``python -m loadtest.noop [--bare] {gateway,features,scorer}`` (ports and
targets from ``FRAUD_NOOP_*``); ``FloorMesh`` starts all four processes on free ports.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from fraud.v1 import features_pb2, features_pb2_grpc, scoring_pb2, scoring_pb2_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from loadtest.priority import normal_priority
from services.common import envoy
from services.common.channels import insecure_channel
from services.common.server import serve
from services.common.settings import ServerSettings
from services.domain import featurespec
from services.mesh import Process, free_port, grpc_serving
from services.models import repository

N_FEATURES = len(featurespec.MODEL_FEATURES)


class NoopSettings(ServerSettings):
    """Port and downstream targets of one no-work server (env prefix ``FRAUD_NOOP_``)."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_NOOP_", extra="ignore", frozen=True)

    features_target: str = Field("127.0.0.1:50052", description="Feature service host:port.")
    scorer_target: str = Field("127.0.0.1:50053", description="Scorer host:port.")
    budget_s: float = Field(0.042, gt=0, description="Default budget, as the real gateway's.")
    features_cap_s: float = Field(0.012, gt=0, description="Longest the feature call may take.")
    reserve_s: float = Field(0.004, ge=0, description="Budget kept back for the answer.")
    drain_seconds: float = Field(0.0, ge=0, description="No drain: nothing routes here twice.")


def _now() -> Timestamp:
    ts = Timestamp()
    ts.GetCurrentTime()
    return ts


class NoopFeatures(features_pb2_grpc.FeatureServiceServicer):
    """Answers every GetFeatures with the same 17-feature response."""

    def __init__(self) -> None:
        stamp = _now()
        self._response = features_pb2.GetFeaturesResponse(
            features=[
                features_pb2.Feature(
                    name=name,
                    value=float(i) + 0.5,
                    status=features_pb2.FEATURE_STATUS_PRESENT,
                    event_timestamp=stamp,
                )
                for i, name in enumerate(featurespec.STORE_FEATURES)
            ]
        )

    async def GetFeatures(
        self, request: features_pb2.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> features_pb2.GetFeaturesResponse:
        return self._response


class NoopScorer(v2_grpc.GRPCInferenceServiceServicer):
    """Answers every ModelInfer with the same label + probabilities response."""

    def __init__(self) -> None:
        tensor = v2.ModelInferResponse.InferOutputTensor
        self._response = v2.ModelInferResponse(
            model_name=repository.DEFAULT_MODEL_NAME,
            model_version="1",
            outputs=[
                tensor(name="label", datatype="INT64", shape=[1]),
                tensor(name="probabilities", datatype="FP32", shape=[1, 2]),
            ],
            raw_output_contents=[struct.pack("<q", 0), struct.pack("<2f", 0.99, 0.01)],
        )

    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        return self._response


class NoopGateway(scoring_pb2_grpc.FraudScoringServicer):
    """Calls the feature service, then the scorer, and answers a fixed decision."""

    def __init__(self, settings: NoopSettings) -> None:
        self._settings = settings
        self.channels: list[grpc.aio.Channel] = []
        self._features: features_pb2_grpc.FeatureServiceStub | None = None
        self._scorer: v2_grpc.GRPCInferenceServiceStub | None = None
        self._infer = v2.ModelInferRequest(
            model_name=repository.DEFAULT_MODEL_NAME,
            model_version="1",
            inputs=[
                v2.ModelInferRequest.InferInputTensor(
                    name="input", datatype="FP32", shape=[1, N_FEATURES]
                )
            ],
            outputs=[v2.ModelInferRequest.InferRequestedOutputTensor(name="probabilities")],
            raw_input_contents=[struct.pack(f"<{N_FEATURES}f", *([1.0] * N_FEATURES))],
        )
        self._reasons = ["model score 0.010 < review threshold 0.095"]

    async def open(self) -> None:
        """Opens and connects the two downstream channels."""
        features = insecure_channel(self._settings.features_target)
        scorer = insecure_channel(self._settings.scorer_target)
        self.channels = [features, scorer]
        for channel in self.channels:
            await channel.channel_ready()
        self._features = features_pb2_grpc.FeatureServiceStub(features)
        self._scorer = v2_grpc.GRPCInferenceServiceStub(scorer)

    async def Score(
        self, request: scoring_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> scoring_pb2.ScoreResponse:
        assert self._features is not None and self._scorer is not None
        start = time.perf_counter()
        # The real gateway's budget split: the feature call gets at most features_cap_s,
        # the scorer what is left less the reserve; a failed hop still gets an answer.
        remaining = context.time_remaining()
        budget = min(self._settings.budget_s, remaining if remaining is not None else 1e9)
        features_timeout = min(self._settings.features_cap_s, budget - self._settings.reserve_s)
        scored_by = scoring_pb2.SCORED_BY_MODEL
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._features.GetFeatures(
                features_pb2.GetFeaturesRequest(
                    card_id=request.card_id,
                    merchant_id=request.merchant_id,
                    as_of=request.timestamp,
                ),
                timeout=features_timeout,
            )
        scorer_timeout = budget - self._settings.reserve_s - (time.perf_counter() - start)
        try:
            await self._scorer.ModelInfer(self._infer, timeout=max(scorer_timeout, 0.001))
        except grpc.aio.AioRpcError:
            scored_by = scoring_pb2.SCORED_BY_RULES
        return scoring_pb2.ScoreResponse(
            transaction_id=request.transaction_id,
            decision=scoring_pb2.DECISION_APPROVE,
            score=0.01,
            reasons=self._reasons,
            model_version="1",
            scored_by=scored_by,
            feature_source=scoring_pb2.FEATURE_SOURCE_ONLINE,
            elapsed_ms=(time.perf_counter() - start) * 1000.0,
        )


class NoopService:
    """One no-work role as a ``services.common.server.Service``."""

    def __init__(self, role: str, settings: NoopSettings) -> None:
        if role not in ("gateway", "features", "scorer"):
            raise ValueError(f"unknown role {role!r}")
        self.name = f"noop-{role}"
        self.role = role
        self.settings = settings
        self.gateway: NoopGateway | None = None

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the role's servicer."""
        if self.role == "features":
            features_pb2_grpc.add_FeatureServiceServicer_to_server(NoopFeatures(), server)
            return ["fraud.v1.FeatureService"]
        if self.role == "scorer":
            v2_grpc.add_GRPCInferenceServiceServicer_to_server(NoopScorer(), server)
            return ["inference.GRPCInferenceService"]
        self.gateway = NoopGateway(self.settings)
        scoring_pb2_grpc.add_FraudScoringServicer_to_server(self.gateway, server)
        return ["fraud.v1.FraudScoring"]

    async def start(self) -> None:
        """The gateway connects its channels; the others have nothing to load."""
        if self.gateway is not None:
            await self.gateway.open()

    async def close(self) -> None:
        """Closes the gateway's channels."""
        if self.gateway is not None:
            for channel in self.gateway.channels:
                await channel.close()


_METHODS = {
    "gateway": ("fraud.v1.FraudScoring", "Score"),
    "features": ("fraud.v1.FeatureService", "GetFeatures"),
    "scorer": ("inference.GRPCInferenceService", "ModelInfer"),
}


def _bare_replies(settings: NoopSettings) -> dict[str, bytes]:
    """Each role's answer, serialized once (the same messages the full floor returns)."""
    gateway = NoopGateway(settings)
    score = scoring_pb2.ScoreResponse(
        transaction_id="t-0000000000000000",
        decision=scoring_pb2.DECISION_APPROVE,
        score=0.01,
        reasons=gateway._reasons,
        model_version="1",
        scored_by=scoring_pb2.SCORED_BY_MODEL,
        feature_source=scoring_pb2.FEATURE_SOURCE_ONLINE,
        elapsed_ms=3.0,
    )
    return {
        "gateway": score.SerializeToString(),
        "features": NoopFeatures()._response.SerializeToString(),
        "scorer": NoopScorer()._response.SerializeToString(),
        "infer_request": gateway._infer.SerializeToString(),
        "features_request": features_pb2.GetFeaturesRequest(
            card_id="card-000000", merchant_id="merch-00000", as_of=_now()
        ).SerializeToString(),
    }


async def serve_bare(role: str, settings: NoopSettings) -> None:
    """Serves ``role`` on a bare grpc.aio server until SIGTERM (see the module docstring)."""
    import asyncio
    import signal

    from grpc_health.v1 import health, health_pb2_grpc

    replies = _bare_replies(settings)
    reply = replies[role]
    channels: list[grpc.aio.Channel] = []
    handler: Callable[..., object]
    if role == "gateway":
        channels = [
            grpc.aio.insecure_channel(settings.features_target),
            grpc.aio.insecure_channel(settings.scorer_target),
        ]
        # No serializers: the calls send and receive bytes as they are.
        get_features = channels[0].unary_unary("/fraud.v1.FeatureService/GetFeatures")
        infer = channels[1].unary_unary("/inference.GRPCInferenceService/ModelInfer")
        features_request, infer_request = replies["features_request"], replies["infer_request"]
        features_timeout = settings.features_cap_s
        scorer_timeout = settings.budget_s - settings.reserve_s - features_timeout

        async def score(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await get_features(features_request, timeout=features_timeout)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await infer(infer_request, timeout=scorer_timeout)
            return reply

        handler = score
    else:

        async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return reply

        handler = answer
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    service, method = _METHODS[role]
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                service, {method: grpc.unary_unary_rpc_method_handler(handler)}
            )
        ]
    )
    server.add_insecure_port(f"{settings.host}:{settings.port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0.5)
    for channel in channels:
        await channel.close()


def _probe(target: str) -> Callable[[], bool]:
    return lambda: grpc_serving(target)


class FloorMesh:
    """Envoy and the three no-work servers on free ports, started and stopped together;
    ``bare`` runs them without the project's runtime (``python -m loadtest.noop --bare``)."""

    def __init__(
        self,
        log_dir: Path,
        host: str = "127.0.0.1",
        rate_limit_rps: int = 1000,
        bare: bool = False,
    ) -> None:
        self.host = host
        self.log_dir = log_dir
        self.envoy_port = free_port()
        self.admin_port = free_port()
        self.ports = {role: free_port() for role in ("features", "scorer", "gateway")}
        self.rate_limit_rps = rate_limit_rps
        env = {
            "FRAUD_NOOP_HOST": host,
            "FRAUD_NOOP_FEATURES_TARGET": f"{host}:{self.ports['features']}",
            "FRAUD_NOOP_SCORER_TARGET": f"{host}:{self.ports['scorer']}",
        }
        self.processes: dict[str, Process] = {}
        for role, port in self.ports.items():
            target = f"{host}:{port}"
            self.processes[role] = Process(
                role,
                [sys.executable, "-m", "loadtest.noop", *(["--bare"] if bare else []), role],
                ready=_probe(target),
                env={**env, "FRAUD_NOOP_PORT": str(port)},
                log_path=log_dir / f"noop-{role}.log",
            )
        self._envoy_config = log_dir / f"envoy-{self.envoy_port}.yaml"
        self.processes["envoy"] = Process(
            "envoy",
            envoy.envoy_command(self._envoy_config),
            ready=lambda: grpc_serving(self.envoy_target),
            log_path=log_dir / "envoy.log",
        )

    @property
    def envoy_target(self) -> str:
        """host:port clients call."""
        return f"{self.host}:{self.envoy_port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Starts the downstream servers, the gateway, then Envoy; stops all on failure."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._envoy_config.write_text(
            envoy.render_config(
                listen_port=self.envoy_port,
                admin_port=self.admin_port,
                gateway_port=self.ports["gateway"],
                rate_limit_rps=self.rate_limit_rps,
                access_log_path=str(self.log_dir / "envoy-access.log"),
            )
        )
        try:
            for group in (("features", "scorer"), ("gateway",), ("envoy",)):
                for name in group:
                    self.processes[name].start()
                for name in group:
                    self.processes[name].wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        normal_priority(list(self.pids().values()))

    def stop(self) -> None:
        """Stops Envoy first, then the gateway, then the downstream servers."""
        for name in ("envoy", "gateway", "features", "scorer"):
            self.processes[name].stop()

    def dead(self) -> list[str]:
        """Names of the processes that were started and have exited."""
        return [n for n, p in self.processes.items() if p.popen is not None and not p.alive()]

    def pids(self) -> dict[str, int]:
        """PIDs of the running processes by name."""
        return {n: p.pid for n, p in self.processes.items() if p.pid is not None}


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtest.noop ROLE``: serves one no-work role until SIGTERM."""
    args = list(sys.argv[1:] if argv is None else argv)
    bare = "--bare" in args
    args = [a for a in args if a != "--bare"]
    if len(args) != 1 or args[0] not in _METHODS:
        raise SystemExit("usage: python -m loadtest.noop [--bare] {gateway,features,scorer}")
    settings = NoopSettings()
    if bare:
        import asyncio

        asyncio.run(serve_bare(args[0], settings))
    else:
        serve(settings, NoopService(args[0], settings))


if __name__ == "__main__":
    main()
