"""The monitor's alert rules: valid for Prometheus, their unit tests pass under promtool, and
every metric they name is one the catalogue declares (so a renamed gauge cannot leave a rule
that silently never fires)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.common import metric_catalogue as catalogue

RULES = Path(__file__).resolve().parents[2] / "deploy" / "observability" / "rules"
RULE_FILE = RULES / "monitor.rules.yml"
TEST_FILE = RULES / "monitor.test.yml"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: run `make system` (Debian's prometheus package)")
    return found


def test_the_rules_are_valid() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULE_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_pass_their_unit_tests() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", str(TEST_FILE)], capture_output=True, text=True, cwd=RULES
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_metric_a_rule_names_is_declared() -> None:
    declared = {spec.name for spec in catalogue.CATALOGUE}
    rules = yaml.safe_load(RULE_FILE.read_text())["groups"][0]["rules"]
    named = set()
    for rule in rules:
        named |= set(re.findall(r"\bfraudmesh_[a-z_]+\b", rule["expr"]))
        assert rule["annotations"]["runbook_url"].startswith("docs/observability.md#")
    assert named and named <= declared, sorted(named - declared)
    tested = {t["alertname"] for case in yaml.safe_load(TEST_FILE.read_text())["tests"]
              for t in case["alert_rule_test"]}  # fmt: skip
    assert tested == {rule["alert"] for rule in rules}
