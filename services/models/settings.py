"""Settings of a process that uses a published model: where the repository is, which model,
and the canary policy that judges a candidate version."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from services.common.settings import ServerSettings
from services.domain.canary import CanaryPolicy
from services.models.repository import DEFAULT_MODEL_NAME


class ModelServerSettings(ServerSettings):
    """A server that loads a model version (the gateway for its metadata, the scorer to run it)."""

    model_root: Path | None = Field(
        None, description="Folder of published models; default <var_dir>/models."
    )
    model_name: str = Field(DEFAULT_MODEL_NAME, description="Name of the model to use.")
    model_version: str | None = Field(
        None,
        description="Pin this version for every call; unset follows the model lifecycle "
        "(routing.json: the live version, and any canary and shadow).",
    )

    @property
    def models_path(self) -> Path:
        """The folder models are published to."""
        return self.model_root or self.var_dir / "models"


_POLICY = CanaryPolicy()
SHARED_CANARY_PREFIX = "FRAUD_CANARY_"
"""Environment prefix of the canary policy that every service reading it shares:
``FRAUD_CANARY_P99_SLACK_MS`` sets ``canary_p99_slack_ms`` of the gateway and the monitor
alike; a service's own name (``FRAUD_GATEWAY_CANARY_P99_SLACK_MS``) overrides it there."""


class _SharedCanaryEnv(PydanticBaseSettingsSource):
    """Reads ``canary_*`` settings from ``FRAUD_CANARY_*``, below the service's own names."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """The shared variable's value of ``field_name``, if set."""
        name = f"{SHARED_CANARY_PREFIX}{field_name.removeprefix('canary_')}".upper()
        return os.environ.get(name), name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field_name, field in self.settings_cls.model_fields.items():
            if field_name.startswith("canary_"):
                value, _, _ = self.get_field_value(field, field_name)
                if value is not None:
                    values[field_name] = value
        return values


class CanarySettings(BaseSettings):
    """The canary policy as settings, one class for every service that judges a canary
    (defaults from ``CanaryPolicy``; shared names ``FRAUD_CANARY_*``)."""

    canary_max_error_rate_increase: float = Field(
        _POLICY.max_error_rate_increase,
        ge=0,
        le=1,
        description="Canary error rate may exceed live's by this (0..1); both judges.",
    )
    canary_p99_ratio: float = Field(
        _POLICY.p99_ratio,
        gt=0,
        description="Canary latency may reach this multiple of live's p99 …",
    )
    canary_p99_slack_ms: float = Field(
        _POLICY.p99_slack_ms, ge=0, description="… plus this many milliseconds; both judges."
    )
    canary_window_calls: int = Field(
        _POLICY.window_calls, ge=1, description="Fast guard: recent model calls kept per arm."
    )
    canary_window_s: float = Field(
        _POLICY.window_s, gt=0, description="Fast guard: calls older than this leave the window."
    )
    canary_min_calls: int = Field(
        _POLICY.min_calls, ge=1, description="Fast guard: calls each arm needs to be judged."
    )
    canary_p99_min_calls: int = Field(
        _POLICY.p99_min_calls, ge=1, description="Fast guard: calls each arm needs for its p99."
    )
    canary_max_decline_rate_increase: float = Field(
        _POLICY.max_decline_rate_increase,
        ge=0,
        le=1,
        description="Fast guard: canary decline rate may exceed live's by this (0..1).",
    )
    canary_confidence_z: float = Field(
        _POLICY.confidence_z, gt=0, description="Fast guard: standard errors a breach needs."
    )
    canary_level: float = Field(
        _POLICY.level, gt=0, lt=1, description="Staged analysis: confidence of its intervals."
    )
    canary_rate_abs: float = Field(
        _POLICY.rate_abs,
        ge=0,
        le=1,
        description="Staged analysis: a decision rate may move by this …",
    )
    canary_rate_rel: float = Field(
        _POLICY.rate_rel, ge=0, description="… or this share of live's rate, the larger."
    )
    canary_late_share: float = Field(
        _POLICY.late_share,
        ge=0,
        le=1,
        description="Staged analysis: share of answers that may be late.",
    )
    canary_psi_limit: float = Field(
        _POLICY.psi_limit, ge=0, description="Staged analysis: score PSI allowed beyond noise."
    )
    canary_psi_noise: float = Field(
        _POLICY.psi_noise, ge=0, description="Staged analysis: a PSI's noise, as a multiple."
    )
    canary_min_agreement: float = Field(
        _POLICY.min_agreement, ge=0, le=1, description="Shadow gate: least decision agreement."
    )
    canary_min_shadow_scored: float = Field(
        _POLICY.min_shadow_scored,
        ge=0,
        le=1,
        description="Shadow gate: least share scored in time.",
    )
    canary_recall_drop: float = Field(
        _POLICY.recall_drop, ge=0, le=1, description="Precision and recall may be this much lower."
    )
    canary_min_matured_frauds: int = Field(
        _POLICY.min_matured_frauds, ge=0, description="Matured frauds each version needs first."
    )

    @model_validator(mode="after")
    def _usable(self) -> CanarySettings:
        """Refuses a policy whose fields contradict each other, naming the field."""
        _ = self.canary_policy
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The service's own variables first, then the shared ``FRAUD_CANARY_*`` ones."""
        shared = _SharedCanaryEnv(settings_cls)
        return init_settings, env_settings, shared, dotenv_settings, file_secret_settings

    @property
    def canary_policy(self) -> CanaryPolicy:
        """The canary policy these settings give."""
        names = [f.name for f in dataclasses.fields(CanaryPolicy)]
        return CanaryPolicy(**{name: getattr(self, f"canary_{name}") for name in names})
