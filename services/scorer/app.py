"""The scorer as a Service for the shared runtime: load the versions, warm them, serve v2."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from inference import grpc_predict_v2_pb2_grpc as pb_grpc
from services.scorer.registry import ModelRegistry
from services.scorer.servicer import InferenceServicer
from services.scorer.settings import ScorerSettings

log = logging.getLogger(__name__)


class ScorerApp:
    """Serves every version the model lifecycle needs over the v2 protocol, following it."""

    name = "scorer"

    def __init__(self, settings: ScorerSettings) -> None:
        self.settings = settings
        self.servicer = InferenceServicer(
            None,
            settings.fault_delay_ms / 1000.0,
            settings.fault_versions,
            observe=settings.observe_rpcs,
        )
        self._follower: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the v2 inference servicer."""
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        return ["inference.GRPCInferenceService"]

    async def start(self) -> None:
        """Loads and warms the versions the lifecycle needs, then follows its changes."""
        s = self.settings
        registry = ModelRegistry(
            s.models_path,
            s.model_name,
            threads=s.intra_op_threads,
            warmup_calls=s.warmup_calls,
            pinned_version=s.model_version,
            unload_grace_s=s.unload_grace_s,
        )
        await registry.start()
        self.servicer.registry = registry
        self._follower = asyncio.create_task(registry.follow(s.lifecycle_poll_ms / 1000))
        log.info(
            "models loaded",
            extra={
                "model": registry.name,
                "versions": registry.loaded(),
                "default": registry.default_version,
            },
        )

    async def close(self) -> None:
        """Stops following the lifecycle; the ONNX sessions go with the process."""
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
