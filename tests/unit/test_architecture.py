"""The dependency rules in pyproject.toml hold, and breaking one is caught."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    # The packages are found on PYTHONPATH first, so a copy is checked, not the install.
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{root / 'gen' / 'python'}",
        # One contract a line in the report.
        "COLUMNS": "400",
    }
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.json", "*.png")
    for folder in ("services", "loadtest", "tests"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    shutil.copytree(REPO / "gen" / "python", root / "gen" / "python", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("services/scorer/servicer.py", "import services.gateway.app", "never import each other"),
        ("services/common/errors.py", "import services.features.app", "Inside the product"),
        ("services/gateway/app.py", "import services.pipelines.simulate", "Serving code"),
        ("services/app_less.py", "import loadtest.runner", "Top level"),
        ("services/domain/money.py", "import grpc", "never import the transport"),
    ],
)
def test_breaking_a_rule_fails(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = _copy(tmp_path)
    path = root / module
    text = path.read_text() if path.exists() else '"""A module."""\n'
    path.write_text(text + f"\n{line}  # noqa: E402, F401\n")
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith(" BROKEN")]
    assert any(contract in b for b in broken), result.stdout
