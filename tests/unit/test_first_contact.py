"""A new user's first run: `make run` installs only what running needs, training prints no
warning a user should not act on, and a missing collector is named in one line with its cure."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import lightgbm as lgb
import numpy as np
import onnxruntime as ort
import pytest

from services.cli import up
from services.pipelines.training import export

REPO = Path(__file__).resolve().parents[2]
TEST_ONLY = ("chromium", "java", "mvn", "bwrap", "curl")


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.M))


def _prerequisites(target: str) -> list[str]:
    found = re.search(rf"^{target}:([^#\n]*)", (REPO / "Makefile").read_text(), re.M)
    assert found, target
    return found.group(1).split()


def test_make_run_installs_what_running_needs_and_nothing_only_tests_use() -> None:
    assert _prerequisites("run") == ["system-run", "data"]
    assert "tools" not in _prerequisites("data") and "tools" not in _prerequisites("install")
    script = (REPO / "scripts" / "system-deps.sh").read_text()
    run_part = script[script.index("declare -A wanted=(") : script.index('case "$profile"')]
    test_part = script[script.index("  test)") :]
    for program in TEST_ONLY:
        assert f"[{program}]" not in run_part, program
        assert f"[{program}]" in test_part, program
    for program in ("redis-server", "setpriv", "prometheus", "npm"):
        assert f"[{program}]" in run_part, program


def test_the_profiles_of_the_system_script_are_checked() -> None:
    refused = subprocess.run(
        ["bash", str(REPO / "scripts" / "system-deps.sh"), "everything"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2
    assert "unknown profile 'everything'" in refused.stderr


def test_a_missing_observability_process_is_one_line_naming_a_target_that_exists() -> None:
    targets = _make_targets()
    for line in up.MISSING_OBSERVABILITY.values():
        assert "\n" not in line
        named = re.findall(r"'make ([a-z-]+)'", line)
        assert named and set(named) <= targets, line


def test_the_exported_model_runs_batches_without_a_warning(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    y = (x[:, 0] > 0.8).astype(int)
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_threads": 1}, lgb.Dataset(x, y), 5
    )
    path = tmp_path / "model.onnx"
    export.export_onnx(booster, 4, path)
    capfd.readouterr()
    # Every output, as a batch of ten: the label output's declared shape was one row.
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {export.INPUT_NAME: x[:10]})
    assert all(len(out) == 10 for out in outputs)
    assert export.parity_gap(path, x, booster.predict(x)) < export.PARITY_TOLERANCE
    captured = capfd.readouterr()
    assert "VerifyOutputSizes" not in captured.err + captured.out
    assert "[W:onnxruntime" not in captured.err + captured.out
