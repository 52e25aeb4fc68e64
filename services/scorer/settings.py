"""Settings of the scorer service (env prefix ``FRAUD_SCORER_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings


class ScorerSettings(ServerSettings):
    """How the scorer finds its model and runs it."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_SCORER_", extra="ignore", frozen=True)

    port: int = Field(50053, ge=0, le=65535, description="gRPC port of the v2 inference API.")
    model_root: Path | None = Field(
        None, description="Folder of published models; default <var_dir>/models."
    )
    model_name: str = Field("fraud-lgbm", description="Name of the model to serve.")
    model_version: str | None = Field(
        None, description="Version to serve; unset serves the latest published version."
    )
    intra_op_threads: int = Field(
        1,
        ge=1,
        description="ONNX Runtime threads per inference; one row per call gains nothing from more.",
    )
    warmup_calls: int = Field(50, ge=1, description="Inferences run before reporting SERVING.")
    fault_delay_ms: float = Field(
        0.0,
        ge=0,
        description="Fault injection for resilience tests: delay every ModelInfer by this much.",
    )

    @property
    def models_path(self) -> Path:
        """The folder models are published to."""
        return self.model_root or self.var_dir / "models"
