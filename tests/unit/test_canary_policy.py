"""One canary policy: the gateway's fast guard and the monitor's staged analysis read the same
object, configured once (``FRAUD_CANARY_*`` for both services, or the rollout's flags)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.domain.canary import CanaryPolicy
from services.gateway.canary import CanaryWatch
from services.gateway.ports import Arm
from services.gateway.settings import GatewaySettings
from services.models.lifecycle import ModelLifecycle
from services.models.rollout import RolloutEnd, RolloutFile
from services.monitor.controller import RolloutController, compare_rate
from services.monitor.settings import MonitorSettings

from .test_rollout_controller import Clock, FakeEngine, _plan, arm
from .tiny_models import onnx_model, publish


def _published(tmp_path: Path) -> tuple[ModelLifecycle, RolloutFile, str]:
    """Live v1 and a candidate v2 of a tiny model."""
    root = tmp_path / "models"
    model = onnx_model(tmp_path / "m.onnx", trees=3)
    publish(root, model, candidate=False)
    version = publish(root, model)
    return ModelLifecycle(root), RolloutFile(root), version


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ModelLifecycle, RolloutFile, str]:
    """Live v1, candidate v2."""
    return _published(tmp_path)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No canary, gateway or monitor settings in the environment."""
    for name in os.environ:
        if name.startswith(("FRAUD_CANARY_", "FRAUD_GATEWAY_", "FRAUD_MONITOR_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_both_services_default_to_the_one_policy(clean_env: pytest.MonkeyPatch) -> None:
    assert GatewaySettings().canary_policy == CanaryPolicy()
    assert MonitorSettings().canary_policy == CanaryPolicy()


def test_one_shared_variable_sets_both_judges(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FRAUD_CANARY_P99_SLACK_MS", "7.5")
    clean_env.setenv("FRAUD_CANARY_RATE_ABS", "0.01")
    for settings in (GatewaySettings(), MonitorSettings()):
        policy = settings.canary_policy
        assert (policy.p99_slack_ms, policy.rate_abs) == (7.5, 0.01)


def test_a_service_own_variable_overrides_the_shared_one(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FRAUD_CANARY_P99_SLACK_MS", "7.5")
    clean_env.setenv("FRAUD_GATEWAY_CANARY_P99_SLACK_MS", "25")
    assert GatewaySettings().canary_policy.p99_slack_ms == 25
    assert MonitorSettings().canary_policy.p99_slack_ms == 7.5
    clean_env.setenv("FRAUD_MONITOR_CANARY_P99_SLACK_MS", "4")
    assert MonitorSettings().canary_policy.p99_slack_ms == 4
    assert GatewaySettings().canary_policy.p99_slack_ms == 25


def test_a_contradictory_policy_is_refused_naming_the_field(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("FRAUD_CANARY_MAX_DECLINE_RATE_INCREASE", "0.001")
    with pytest.raises(ValidationError, match="max_decline_rate_increase"):
        MonitorSettings()
    with pytest.raises(ValueError, match="rate_abs"):
        CanaryPolicy(rate_abs=1.5)


def test_overrides_name_unknown_and_bad_fields() -> None:
    policy = CanaryPolicy().with_overrides({"p99_slack_ms": 5, "min_calls": 30})
    assert (policy.p99_slack_ms, policy.min_calls) == (5.0, 30)
    assert isinstance(policy.min_calls, int)
    with pytest.raises(ValueError, match="p99_slak_ms: not a canary policy field"):
        CanaryPolicy().with_overrides({"p99_slak_ms": 5})
    with pytest.raises(ValueError, match=r"min_calls: 2\.5 is not a whole number"):
        CanaryPolicy().with_overrides({"min_calls": 2.5})


def test_both_judges_apply_the_same_latency_yardstick() -> None:
    # A canary answer 2.5 ms past twice live's p99 is late for both at a 2 ms slack and
    # on time for both once the one slack is 3 ms.
    for slack, late in ((2.0, True), (3.0, False)):
        policy = CanaryPolicy(min_calls=100, p99_min_calls=100, p99_slack_ms=slack)
        watch = CanaryWatch("2", policy, clock=lambda: 0.0)
        for _ in range(200):
            watch.record(Arm.LIVE, True, 0.002, False)
            watch.record(Arm.CANARY, True, 0.0065, False)
        assert (watch.breach() is not None) is late
        assert (policy.p99_bound_ms(2.0) < 6.5) is late


def test_the_decision_rate_yardstick_is_the_policy_s() -> None:
    # 3 % against 2 % on 100,000 decisions each: beyond half a point (the default), within
    # two points.
    strict, loose = CanaryPolicy(), CanaryPolicy(rate_abs=0.02, max_decline_rate_increase=0.05)
    assert not compare_rate("decline", 3000, 100_000, 2000, 100_000, strict).passed
    assert compare_rate("decline", 3000, 100_000, 2000, 100_000, loose).passed
    assert strict.allowed_rate_gap(0.9) == pytest.approx(0.025)  # a quarter of the 10 %


def test_a_rollout_s_policy_overrides_the_monitor_s(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    # A candidate that declines far more than live fails the default half-point yardstick
    # (test_rollout_controller); the same windows pass once the rollout allows 60 points.
    lifecycle, plans, version = setup
    wide = {"rate_abs": 0.6, "max_decline_rate_increase": 0.6, "psi_limit": 10.0}
    plans.write(_plan(version, steps=[10.0, 100.0], policy=wide))
    engine, clock = FakeEngine(), Clock()
    controller = RolloutController(engine, lifecycle, plans, slice_s=1, clock=clock)
    controller.tick()
    engine.windows = {(version, "canary"): arm(400, 1, 0.7, 0.95), ("1", "live"): arm(4000, 2)}
    controller.tick()  # the canary's first calls: its window starts at the next whole slice
    controller.tick()
    plan = plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.PROMOTED, plan and plan.reason


def test_a_rollout_with_a_contradictory_policy_stops_naming_the_field(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    lifecycle, plans, version = setup
    plans.write(_plan(version, policy={"max_decline_rate_increase": 0.001}))
    RolloutController(FakeEngine(), lifecycle, plans, slice_s=1, clock=Clock()).tick()
    plan = plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.STOPPED
    assert "max_decline_rate_increase" in plan.reason


def test_the_rollout_command_takes_policy_fields_and_names_bad_ones(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from services.cli.main import app

    lifecycle, plans, version = _published(tmp_path)

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(
            app,
            ["model", "rollout", version, "--model-root", str(lifecycle.model_root), *args],
            env={"COLUMNS": "200"},
        )
        return result.exit_code, result.output

    code, out = run("--policy", "p99_slak_ms=3")
    assert code == 2 and "'--policy': p99_slak_ms: not a canary policy field" in out
    code, out = run("--policy", "rate_abs=half")
    assert code == 2 and "'--policy'" in out and "half" in out
    code, out = run("--policy", "max_decline_rate_increase=0.001")
    assert code == 2 and "max_decline_rate_increase: 0.001 is below rate_abs" in out
    assert plans.read() is None
    code, out = run("--policy", "p99_slack_ms=3", "--policy", "min_calls=30")
    assert code == 0, out
    plan = plans.read()
    assert plan is not None and plan.policy == {"p99_slack_ms": 3.0, "min_calls": 30.0}


def test_the_figures_docs_lifecycle_quotes_are_the_policy_s_defaults() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md").read_text()
    p = CanaryPolicy()
    points = round(p.max_error_rate_increase * 100)
    slack, ratio = f"{p.p99_slack_ms:g}", f"{p.p99_ratio:g}"
    assert f"by more than {points} points beyond the intervals" in text
    assert f"slower than {ratio} × live's p99 + {slack} ms" in text
    assert f"(`max_error_rate_increase`, {points} points)" in text
    assert f"(`p99_ratio` × live's p99 + `p99_slack_ms`: {ratio} × + {slack} ms)" in text
    decline = round(p.max_decline_rate_increase * 100)
    assert f"`max_decline_rate_increase` ({decline} points)" in text
    assert f"max({p.rate_abs * 100:g} point, {p.rate_rel * 100:g} % of live's rate" in text
