"""The gateway's settings take their defaults from the domain dataclasses, and the
environment they stand for has not moved."""

from __future__ import annotations

import os

import pytest

from services.common.settings import to_env
from services.gateway.breaker import BreakerConfig
from services.gateway.budget import BudgetPolicy
from services.gateway.canary import CanaryLimits
from services.gateway.pipeline import CANARY_CAP_S
from services.gateway.settings import GatewaySettings
from services.gateway.shadow import ShadowPolicy
from services.gateway.streams import StreamSettings
from services.gateway.validate import Limits

# The defaults of the settings a dataclass stands behind, as operators set them.
DERIVED_ENV = {
    "FRAUD_GATEWAY_BUDGET_MS": "42.0",
    "FRAUD_GATEWAY_RESERVE_MS": "4.0",
    "FRAUD_GATEWAY_FEATURES_CAP_MS": "12.0",
    "FRAUD_GATEWAY_SCORER_CAP_MS": "20.0",
    "FRAUD_GATEWAY_SCORER_MIN_MS": "2.0",
    "FRAUD_GATEWAY_BREAKER_WINDOW": "50",
    "FRAUD_GATEWAY_BREAKER_MINIMUM_CALLS": "20",
    "FRAUD_GATEWAY_BREAKER_FAILURE_RATE": "50.0",
    "FRAUD_GATEWAY_BREAKER_SLOW_RATE": "50.0",
    "FRAUD_GATEWAY_BREAKER_WAIT_S": "2.0",
    "FRAUD_GATEWAY_BREAKER_HALF_OPEN_CALLS": "5",
    "FRAUD_GATEWAY_CANARY_CAP_MS": "8.0",
    "FRAUD_GATEWAY_CANARY_WINDOW_CALLS": "500",
    "FRAUD_GATEWAY_CANARY_WINDOW_S": "120.0",
    "FRAUD_GATEWAY_CANARY_MIN_CALLS": "100",
    "FRAUD_GATEWAY_CANARY_MAX_ERROR_RATE_INCREASE": "0.05",
    "FRAUD_GATEWAY_CANARY_P99_RATIO": "2.0",
    "FRAUD_GATEWAY_CANARY_P99_SLACK_MS": "2.0",
    "FRAUD_GATEWAY_CANARY_MAX_DECLINE_RATE_INCREASE": "0.05",
    "FRAUD_GATEWAY_STREAMS": "2",
    "FRAUD_GATEWAY_STREAM_MAX_BATCH": "16",
    "FRAUD_GATEWAY_STREAM_MAX_QUEUE_DELAY_US": "0",
    "FRAUD_GATEWAY_STREAM_MAX_AGE_S": "8.0",
    "FRAUD_GATEWAY_MAX_FUTURE_S": "300.0",
    "FRAUD_GATEWAY_MAX_AGE_S": "604800.0",
    "FRAUD_GATEWAY_MAX_AMOUNT_EUR": "1000000.0",
    "FRAUD_GATEWAY_MAX_OUTCOME_AGE_DAYS": "540.0",
    "FRAUD_GATEWAY_SHADOW_QUEUE_SIZE": "1000",
    "FRAUD_GATEWAY_SHADOW_WORKERS": "1",
    "FRAUD_GATEWAY_SHADOW_MAX_BATCH": "32",
    "FRAUD_GATEWAY_SHADOW_LINGER_MS": "50.0",
    "FRAUD_GATEWAY_SHADOW_TIMEOUT_MS": "50.0",
}


@pytest.fixture
def defaults(monkeypatch: pytest.MonkeyPatch) -> GatewaySettings:
    """The settings with nothing set in the environment."""
    for name in os.environ:
        if name.startswith("FRAUD_GATEWAY_"):
            monkeypatch.delenv(name)
    return GatewaySettings()


def test_the_defaults_are_the_dataclasses(defaults: GatewaySettings) -> None:
    assert defaults.budget_policy == BudgetPolicy()
    assert defaults.canary_limits == CanaryLimits()
    assert defaults.stream_settings == StreamSettings()
    assert defaults.limits == Limits()
    assert defaults.shadow_policy == ShadowPolicy()
    assert defaults.canary_cap_ms / 1000 == CANARY_CAP_S
    # The slow-call threshold is the gateway's per dependency; every other field is the
    # dataclass's default.
    for slow_ms in (defaults.features_slow_ms, defaults.scorer_slow_ms):
        assert defaults.breaker_config(slow_ms) == BreakerConfig(
            slow_call_duration_threshold_s=slow_ms / 1000
        )


def test_the_environment_the_defaults_stand_for_is_unchanged(defaults: GatewaySettings) -> None:
    values = {field: getattr(defaults, field) for field in GatewaySettings.model_fields}
    env = to_env(GatewaySettings, **values)
    assert {name: env[name] for name in DERIVED_ENV} == DERIVED_ENV
