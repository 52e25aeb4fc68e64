"""Settings shared by every service: the base class each service's settings extend."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    """What every gRPC server needs; each service subclasses it with its own env prefix."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address the gRPC server binds to.")
    port: int = Field(0, ge=0, le=65535, description="gRPC port; 0 lets the kernel choose.")
    grace_seconds: float = Field(
        5.0, ge=0, description="On SIGTERM: how long in-flight calls may finish before stop."
    )
    drain_seconds: float = Field(
        1.0,
        ge=0,
        description="On SIGTERM: how long to report NOT_SERVING before refusing new calls, "
        "so that Envoy's health checks route around the instance first.",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Prometheus /metrics port; unset disables it."
    )
    log_level: str = Field("INFO", description="Python logging level name.")
    log_json: bool = Field(True, description="One JSON object per log line (else plain text).")
    var_dir: Path = Field(
        Path("var"), description="Runtime state root: data, Feast registry, models."
    )
    max_connection_age_s: float | None = Field(
        None,
        gt=0,
        description="Close each client connection gracefully after this long, so clients "
        "re-resolve the server's name and balance onto replicas added since (Kubernetes "
        "autoscaling); unset keeps connections open.",
    )
    tracing: Literal["off", "console"] = Field(
        "off", description="OpenTelemetry tracing of gRPC calls: off, or spans to the log."
    )
    trace_sample_ratio: float = Field(
        0.01, ge=0, le=1, description="Share of new traces sampled when tracing is on."
    )
