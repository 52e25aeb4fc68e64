"""``fraudmesh model …``: what each command prints and what it refuses."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.main import app
from services.models import repository
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
    result = runner.invoke(app, ["model", *args, "--model-root", str(root)], env={"COLUMNS": "200"})
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
        (("retire", "1"), "retire refused: v1 is live"),
        (("rollback",), "rollback refused: no previous live version"),
    ],
)
def test_refusals_exit_1_with_the_reason(root: Path, args: tuple[str, ...], message: str) -> None:
    """A valid request the lifecycle does not allow: exit 1, one line saying why."""
    before = _files(root)
    code, _, err = _run_split(root, *args)
    assert code == 1
    assert err.strip().startswith(message) and len(err.strip().splitlines()) == 1, err
    assert _files(root) == before


def test_list_without_models_says_so(tmp_path: Path) -> None:
    code, out = _run(tmp_path / "none", "list")
    assert code == 1 and "no version" in out
    assert not (tmp_path / "none").exists()


def _run_split(root: Path, *args: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr; an exception escaping the command fails the test."""
    result = runner.invoke(
        app,
        ["model", *args, "--model-root", str(root)],
        env={"COLUMNS": "200"},
        catch_exceptions=False,
    )
    return result.exit_code, result.stdout, result.stderr


def _files(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with the bytes of its routing files (None: a folder or a
    model file, compared by presence)."""
    return {
        str(p.relative_to(root)): (
            p.read_bytes() if p.is_file() and p.name.startswith(("routing", ".")) else None
        )
        for p in sorted(root.rglob("*"))
    }


def _bad_input(root: Path, *args: str) -> str:
    """Runs a command that must reject its input: exit 2, one line on stderr, no change."""
    before = _files(root)
    code, out, err = _run_split(root, *args)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert _files(root) == before
    return err


@pytest.mark.parametrize("command", ["shadow", "promote", "retire", "canary"])
@pytest.mark.parametrize("version", ["9", "../1", "/etc", "", "1 ", "v" * 5000])
def test_an_unknown_version_exits_2_in_one_line(root: Path, command: str, version: str) -> None:
    ModelLifecycle(root).materialize()
    extra = ("--percent", "5") if command == "canary" else ()
    err = _bad_input(root, command, version, *extra)
    line = err.strip()
    assert len(line.splitlines()) == 1 and len(line) < 150, err  # a long version is cut
    assert line.startswith(f"{command} rejected: version "), line
    assert line.endswith("is not published (published: 1, 2, 3)"), line


@pytest.mark.parametrize(
    "percent", ["nan", "NaN", "inf", "-inf", "-5", "0", "0.001", "100.5", "1e9", "ten"]
)
def test_a_percent_that_is_not_a_share_exits_2_naming_the_option(root: Path, percent: str) -> None:
    ModelLifecycle(root).materialize()
    err = _bad_input(root, "canary", "2", "--percent", percent)
    assert len(err.strip().splitlines()) == 1, err
    assert err.strip().startswith("fraudmesh model canary: Invalid value for '--percent': "), err
    if percent != "ten":  # not a number at all: Typer's own reason
        assert err.strip().endswith("is not a share from 0.01 to 100"), err


def test_the_smallest_and_largest_shares_are_accepted(root: Path) -> None:
    code, out = _run(root, "canary", "2", "--percent", "0.01")
    assert code == 0 and "canary at 0.01%" in out
    code, out = _run(root, "canary", "2", "--percent", "100")
    assert code == 0 and "0.01% → 100%" in out


CORRUPT: dict[str, bytes] = {
    "truncated": b'{"schema_version": 1, "name": "fraud", "generation": 3, "routing": {"li',
    "empty": b"",
    "not JSON": b"live: 1\ncanary: 2\n",
    "not UTF-8": b'{"name": "fraud\xe9"}',
    "a list": b"[]",
    "no name": b'{"generation": 1}',
    "a negative generation": b'{"name": "fraud", "generation": "many"}',
    "canary percent NaN": b'{"name": "fraud", "routing": {"canary": {"version": "2", "percent": NaN}}}',
    "canary percent 500": b'{"name": "fraud", "routing": {"canary": {"version": "2", "percent": 500}}}',
    "unknown state": b'{"name": "fraud", "versions": {"1": {"version": "1", "state": "gone", "since": "2026-01-01T00:00:00Z"}}}',
}  # fmt: skip


@pytest.mark.parametrize("case", list(CORRUPT))
@pytest.mark.parametrize(
    "args",
    [("list",), ("shadow", "2"), ("canary", "2", "--percent", "5"), ("promote", "2"),
     ("rollback",), ("retire", "3")],
    ids=lambda args: args[0],
)  # fmt: skip
def test_a_corrupt_routing_file_exits_2_naming_it_and_is_left_alone(
    root: Path, case: str, args: tuple[str, ...]
) -> None:
    routing = root / repository.DEFAULT_MODEL_NAME / "routing.json"
    routing.parent.mkdir(parents=True, exist_ok=True)
    routing.write_bytes(CORRUPT[case])
    err = _bad_input(root, *args)
    line = err.strip()
    assert len(line.splitlines()) == 1, err
    assert line.startswith(f"{args[0]} rejected: {routing} is not a valid lifecycle file ("), line
    assert routing.read_bytes() == CORRUPT[case]


def test_an_unreadable_routing_file_exits_2_naming_it(root: Path) -> None:
    routing = root / repository.DEFAULT_MODEL_NAME / "routing.json"
    routing.unlink(missing_ok=True)
    routing.mkdir()
    err = _bad_input(root, "shadow", "2")
    assert err.strip() == f"shadow rejected: {routing} cannot be read: Is a directory"


@pytest.mark.parametrize("name", ["../elsewhere", "a/b", ".", "..", "", "x\ny", "n" * 200])
def test_a_model_name_that_is_not_plain_exits_2_and_creates_nothing(
    tmp_path: Path, root: Path, name: str
) -> None:
    before = sorted(tmp_path.rglob("*"))
    code, out, err = _run_split(root, "shadow", "2", "--name", name)
    assert code == 2 and "Traceback" not in out + err, (out, err)
    line = err.strip()
    assert line.startswith("fraudmesh model shadow: Invalid value for '--name': "), err
    assert "\n" not in line
    assert sorted(tmp_path.rglob("*")) == before


def test_a_missing_model_root_is_an_unknown_version_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "no-models"
    for args in (("shadow", "1"), ("canary", "1", "--percent", "5"), ("promote", "1")):
        code, _, err = _run_split(missing, *args)
        assert (
            code == 2
            and f"version '1' of '{repository.DEFAULT_MODEL_NAME}' is not published" in err
        ), err
    code, _, err = _run_split(missing, "rollback")
    assert code == 1 and "no previous live version" in err
    assert not missing.exists()


def test_a_negative_history_exits_2(root: Path) -> None:
    assert "--history" in _bad_input(root, "list", "--history", "-1")


@pytest.mark.parametrize("command", [("list",), ("promote", "2"), ("rollback",)])
def test_a_model_name_that_is_a_path_exits_2(root: Path, command: tuple[str, ...]) -> None:
    code, output = _run(root, *command, "--name", "x/../fraud-lgbm")
    assert code == 2, output
    assert "not a model name" in output


def test_rollout_hands_a_plan_to_the_monitor_and_refuses_bad_input(root: Path) -> None:
    from services.models.rollout import Phase, RolloutFile

    code, out = _run(root, "rollout", "2", "--steps", "5,1,100")
    assert code == 2 and out.strip().splitlines() == [
        "fraudmesh model rollout: Invalid value for '--steps': shares must increase"
    ]
    code, out = _run(root, "rollout", "9")
    assert code == 2 and "rollout rejected: version '9' of 'fraud-lgbm' is not published" in out
    code, out = _run(root, "rollout", "3")
    assert code == 1 and "v3 failed its gates" in out
    assert RolloutFile(root).read() is None
    code, out = _run(root, "rollout", "2", "--steps", "10,100", "--step-min-decisions", "50")
    assert code == 0, out
    plan = RolloutFile(root).read()
    assert plan is not None and plan.steps == [10, 100] and plan.phase is Phase.SHADOW
    code, out = _run(root, "rollout", "2")
    assert code == 1 and "v2 is being rolled out (shadow gate (needs 1000 decisions))" in out
    code, out = _run(root, "approve", "2")
    assert code == 1 and "v2 is not waiting for approval" in out
    code, out = _run(root, "list")
    assert "rollout of v2: shadow gate (needs 1000 decisions)" in out


def test_approve_promotes_a_rollout_waiting_for_approval(root: Path) -> None:
    from services.models.rollout import Phase, RolloutEnd, RolloutFile

    assert _run(root, "rollout", "2", "--steps", "10,100", "--require-approval")[0] == 0
    plans = RolloutFile(root)
    plan = plans.read()
    assert plan is not None
    # Where the controller leaves a rollout whose every canary step passed.
    ModelLifecycle(root).canary("2", 10)
    plan.phase = Phase.APPROVAL
    with plans.locked():
        plans.write(plan)
    code, out = _run(root, "list")
    assert "waiting for `fraudmesh model approve 2`" in out
    code, out = _run(root, "approve", "3")
    assert code == 1 and "v3 is not waiting for approval (v2: every step passed" in out
    code, out = _run(root, "approve", "2")
    assert code == 0, out
    state = ModelLifecycle(root).read()
    assert state.routing.live == "2" and state.routing.canary is None
    assert "approved by " in state.history[-1].reason
    done = plans.read()
    assert done is not None and done.phase is Phase.DONE and done.outcome is RolloutEnd.PROMOTED
    assert done.finished_at is not None
    code, out = _run(root, "approve", "2")
    assert code == 1 and "not waiting for approval" in out
