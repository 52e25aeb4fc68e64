"""Settings shared by every service: the base class each service's settings extend."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_origin

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound=BaseSettings)


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
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request message accepted; larger ones are RESOURCE_EXHAUSTED.",
    )
    max_metadata_bytes: int = Field(
        64 * 1024,
        ge=8 * 1024,
        description="Largest request header block (metadata) accepted; above Envoy's 60 KiB "
        "limit, so what the edge forwards is never refused mid-path by a reset.",
    )
    max_response_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest response message the server sends."
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
    observe_rpcs: bool = Field(
        True,
        description="Server-side latency histograms of every call, garbage-collection pauses "
        "and event-loop lag (off only to measure what they cost: docs/performance.md).",
    )
    tracing: Literal["off", "console", "otlp"] = Field(
        "off",
        description="OpenTelemetry tracing of gRPC calls: off, spans to the log (console), or "
        "OTLP to OTEL_EXPORTER_OTLP_ENDPOINT (otlp). OTEL_TRACES_EXPORTER overrides it.",
    )
    trace_sample_ratio: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Share of new traces recorded when tracing is on by this setting "
        "(OTEL_TRACES_SAMPLER and _ARG override it); a request with a parent, as every one "
        "through Envoy has, follows its parent's decision.",
    )


def env_name(settings_class: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` of ``settings_class``."""
    if field not in settings_class.model_fields:
        raise KeyError(f"{settings_class.__name__} has no setting {field!r}")
    return f"{settings_class.model_config.get('env_prefix', '')}{field}".upper()


def to_env(settings_class: type[BaseSettings], **values: object) -> dict[str, str]:
    """Environment variables that give ``settings_class`` these field values (None skipped)."""
    env: dict[str, str] = {}
    for field, value in values.items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        env[env_name(settings_class, field)] = text
    return env


def from_mapping(settings_class: type[S], env: Mapping[str, str]) -> S:
    """The settings a process started with ``env`` on top of this one's would build."""
    prefix = str(settings_class.model_config.get("env_prefix", "")).upper()
    fields: dict[str, Any] = {}
    for key, value in env.items():
        name = key.upper().removeprefix(prefix).lower()
        if key.upper().startswith(prefix) and name in settings_class.model_fields:
            annotation = settings_class.model_fields[name].annotation
            # The environment source reads collections as JSON; keyword arguments are not.
            complex_ = get_origin(annotation) in (tuple, list, dict, set)
            fields[name] = json.loads(value) if complex_ else value
    return settings_class(**fields)
