"""Settings of the scorer service (env prefix ``FRAUD_SCORER_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.models.settings import ModelServerSettings


class ScorerSettings(ModelServerSettings):
    """How the scorer finds its model and runs it."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_SCORER_", extra="ignore", frozen=True)

    port: int = Field(50053, ge=0, le=65535, description="gRPC port of the v2 inference API.")
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
    fault_delay_versions: str = Field(
        "",
        description="Comma-separated model versions the fault delay applies to; empty: all.",
    )
    lifecycle_poll_ms: float = Field(
        200.0,
        gt=0,
        description="How often the lifecycle file (routing.json) is checked for changes: "
        "versions routed to are loaded, versions no longer needed unloaded.",
    )
    unload_grace_s: float = Field(
        10.0,
        ge=0,
        description="A version no longer needed stays loaded this long, so gateways still "
        "routing to it for a moment are answered.",
    )

    @property
    def fault_versions(self) -> frozenset[str]:
        """The versions the fault delay applies to (empty: every version)."""
        return frozenset(v.strip() for v in self.fault_delay_versions.split(",") if v.strip())
