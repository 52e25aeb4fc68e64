"""The scorer as a Service for the shared runtime: load the model, warm it, serve v2."""

from __future__ import annotations

import logging

import grpc

from inference import grpc_predict_v2_pb2_grpc as pb_grpc
from services.models.onnx import OnnxModel
from services.scorer.servicer import InferenceServicer
from services.scorer.settings import ScorerSettings

log = logging.getLogger(__name__)


class ScorerApp:
    """Loads the published model with ONNX Runtime and serves it over the v2 protocol."""

    name = "scorer"

    def __init__(self, settings: ScorerSettings) -> None:
        self.settings = settings
        self.servicer = InferenceServicer(settings.fault_delay_ms / 1000.0)

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the v2 inference servicer."""
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        return ["inference.GRPCInferenceService"]

    async def start(self) -> None:
        """Loads the model version and runs warm-up inferences."""
        s = self.settings
        model = OnnxModel.load(s.models_path, s.model_name, s.model_version, s.intra_op_threads)
        model.warm_up(s.warmup_calls)
        self.servicer.model = model
        log.info(
            "model loaded",
            extra={"model": model.name, "version": model.version, "features": model.n_features},
        )

    async def close(self) -> None:
        """Nothing to release: the ONNX session goes with the process."""
