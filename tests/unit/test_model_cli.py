"""``fraudmesh model …``: what each command prints and what it refuses."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.model import app
from services.models.lifecycle import GateCheck, GateReport, ModelLifecycle, VersionState

from .tiny_models import publish

runner = CliRunner()


def _report(passed: bool) -> GateReport:
    check = GateCheck(
        name="average_precision",
        passed=passed,
        value=0.61,
        limit=0.70,
        detail="0.6100 vs live v1 0.7100 (may be at most 0.01 lower)",
    )
    return GateReport(
        passed=passed, checks=[check], against="1", evaluated_at=datetime(2026, 5, 1, tzinfo=UTC)
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Live v1 (published before the lifecycle), candidate v2 (gates passed), v3 (failed)."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx")
    root = tmp_path / "models"
    publish(root, model, candidate=False)
    publish(root, model, gates=_report(True))
    publish(root, model, gates=_report(False))
    return root


def _run(root: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "--model-root", str(root)], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_list_shows_states_traffic_gates_and_history(root: Path) -> None:
    ModelLifecycle(root).canary("2", 25)
    code, out = _run(root, "list")
    assert code == 0
    assert "routing: live v1, canary v2 at 25%" in out
    assert "75%" in out and "25%" in out
    assert "failed: average_precision" in out
    assert "gate average_precision FAILED: 0.6100 vs live v1" in out
    assert "v2 candidate → canary" in out


def test_canary_promote_rollback_retire_print_what_changed(root: Path) -> None:
    code, out = _run(root, "canary", "2", "--percent", "10")
    assert code == 0 and "v2: candidate → canary (canary at 10%)" in out
    code, out = _run(root, "promote", "2")
    assert code == 0
    assert "v1: live → retired" in out and "v2: canary → live" in out
    assert "rollback target v1" in out
    code, out = _run(root, "rollback", "--reason", "spike in declines")
    assert code == 0 and "v1: retired → live (spike in declines)" in out
    code, out = _run(root, "retire", "2")
    assert code == 0 and "already retired" in out and "unchanged" in out
    assert ModelLifecycle(root).read().versions["2"].state is VersionState.RETIRED


def test_shadow(root: Path) -> None:
    code, out = _run(root, "shadow", "3")
    assert code == 0 and "v3: candidate → shadow" in out and "shadow v3" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("promote", "3"), "promote refused: v3 failed its gates"),
        (("canary", "9", "--percent", "5"), "canary refused: version '9'"),
        (("canary", "2", "--percent", "150"), "canary refused: percent"),
        (("retire", "1"), "retire refused: v1 is live"),
        (("rollback",), "rollback refused: no previous live version"),
    ],
)
def test_refusals_exit_1_with_the_reason(root: Path, args: tuple[str, ...], message: str) -> None:
    before = ModelLifecycle(root).read().generation
    code, out = _run(root, *args)
    assert code == 1
    assert message in " ".join(out.split())
    assert ModelLifecycle(root).read().generation == before


def test_list_without_models_says_so(tmp_path: Path) -> None:
    code, out = _run(tmp_path / "none", "list")
    assert code == 1 and "no version" in out


@pytest.mark.parametrize("command", [("list",), ("promote", "2"), ("rollback",)])
def test_a_model_name_that_is_a_path_exits_2(root: Path, command: tuple[str, ...]) -> None:
    code, output = _run(root, *command, "--name", "x/../fraud-lgbm")
    assert code == 2, output
    assert "not a model name" in output
