"""The autopilot decides when to retrain and hands what passed its gates to the rollout
controller; every decision is in the new version's history."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.models.lifecycle import GateCheck, GateReport, ModelLifecycle
from services.models.rollout import Phase, RolloutFile
from services.pipelines.autopilot import Autopilot, AutopilotPolicy, Trained, due

from .tiny_models import onnx_model, publish

NOW = datetime(2026, 6, 10, 12, tzinfo=UTC)


def _gates(passed: bool) -> GateReport:
    check = GateCheck(
        name="average_precision", passed=passed, value=0.5, limit=0.6, detail="0.5 vs live 0.6"
    )
    return GateReport(passed=passed, checks=[check], against="1", evaluated_at=NOW)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    publish(root, onnx_model(tmp_path / "m.onnx", trees=3), candidate=False)
    return root


def _pilot(root: Path, tmp_path: Path, passed: bool = True) -> tuple[Autopilot, list[str]]:
    trained: list[str] = []
    model = tmp_path / "m.onnx"

    def train() -> Trained:
        gates = _gates(passed)
        version = publish(root, model, gates=gates)
        trained.append(version)
        return Trained(version, gates)

    pilot = Autopilot(root, tmp_path / "advice.jsonl", train, AutopilotPolicy(), clock=lambda: NOW)
    return pilot, trained


def test_due_after_advice_or_when_the_last_run_is_old() -> None:
    policy = AutopilotPolicy(max_age_days=7)
    last = NOW - timedelta(days=1)
    assert due([], last, NOW, policy) is None
    advice = [{"at_s": NOW.timestamp() - 60, "reason": "score_drift", "model_version": "1"}]
    assert due(advice, last, NOW, policy) == "the monitor advised retraining (score_drift of v1)"
    assert due(advice, NOW, NOW, policy) is None  # already acted on
    assert due([], NOW - timedelta(days=8), NOW, policy) == "the last run was more than 7 days ago"
    assert due([], None, NOW, policy) == "no run before"


def test_advice_retrains_and_hands_the_candidate_to_the_rollout(root: Path, tmp_path: Path) -> None:
    pilot, trained = _pilot(root, tmp_path)
    (tmp_path / "advice.jsonl").write_text(
        json.dumps({"at_s": NOW.timestamp() - 5, "reason": "live_recall", "model_version": "1"})
        + "\n"
    )
    run = pilot.run()
    assert trained == [run.version]
    plan = RolloutFile(root).read()
    assert plan is not None and plan.version == run.version and plan.phase is Phase.SHADOW
    assert plan.require_approval
    reason = ModelLifecycle(root).read().last_transition(run.version or "")
    assert reason is not None and reason.by == "autopilot"
    assert reason.reason.startswith(
        "autopilot: retrained because the monitor advised retraining (live_recall of v1); "
        "gates passed against v1; handed to the rollout controller"
    )
    # The next run finds the rollout under way and leaves it alone.
    again = pilot.run(force=True)
    assert again.decision.startswith(f"skipped: v{run.version} is being rolled out")
    assert trained == [run.version]


def test_failed_gates_are_explained_and_not_rolled_out(root: Path, tmp_path: Path) -> None:
    pilot, _ = _pilot(root, tmp_path, passed=False)
    run = pilot.run(force=True)
    assert "gates failed (average_precision: 0.5 vs live 0.6): not rolled out" in run.decision
    assert RolloutFile(root).read() is None
    last = ModelLifecycle(root).read().last_transition(run.version or "")
    assert last is not None and last.reason == run.decision
    # Recent run, no advice: not due.
    assert pilot.run().decision.startswith("not due")
