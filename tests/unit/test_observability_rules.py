"""The alert and recording rules under deploy/observability/rules, checked and unit-tested
with promtool: every rule file (generated or any component's own) passes ``promtool check
rules`` and its ``<area>.test.yml``; every alert has a test that fires it and one that keeps
it quiet, a summary, a description and a runbook section; a broken rule fails the check."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.observability import __main__ as generate
from services.observability import dashboards, prometheus

RULES_DIR = prometheus.RULES_DIR
RUNBOOK = RULES_DIR.parents[2] / "docs" / "observability.md"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs promtool (Debian's prometheus package: `make system`)."""
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run `make system`")
    return subprocess.run(
        [tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _alerts(path: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_the_rules_folder_holds_the_generated_files() -> None:
    assert {p.name for p in RULE_FILES} >= {"latency.rules.yml", "answers.rules.yml",
                                             "loop.rules.yml", "processes.rules.yml"}  # fmt: skip


@pytest.mark.parametrize("rules", RULE_FILES, ids=lambda p: p.name)
def test_rule_file_checks_and_its_tests_pass(rules: Path) -> None:
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = rules.with_name(rules.name.replace(".rules.yml", ".test.yml"))
    assert tests.exists(), f"{rules.name} has no {tests.name}"
    ran = promtool("test", "rules", tests.name, cwd=RULES_DIR)
    assert ran.returncode == 0, ran.stdout + ran.stderr


@pytest.mark.parametrize("rules", RULE_FILES, ids=lambda p: p.name)
def test_every_alert_fires_in_one_test_and_keeps_quiet_in_another(rules: Path) -> None:
    tests = yaml.safe_load(
        rules.with_name(rules.name.replace(".rules.yml", ".test.yml")).read_text()
    )
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    for alert in _alerts(rules):
        name = alert["alert"]
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case.get("exp_alerts") for case in mine), f"no test fires {name}"
        assert any(not case.get("exp_alerts") for case in mine), f"no test keeps {name} quiet"


@pytest.mark.parametrize("rules", RULE_FILES, ids=lambda p: p.name)
def test_every_alert_has_a_summary_a_description_and_a_runbook(rules: Path) -> None:
    # A section per alert, or one per topic that several alerts share (the monitor's): the
    # runbook link's anchor must name a section of the runbook.
    anchors = {
        "-".join(line.lstrip("#").strip().strip("`").lower().split())
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("### ")
    }
    for alert in _alerts(rules):
        annotations = alert.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), alert["alert"]
        link, _, anchor = annotations.get("runbook_url", "").rpartition("#")
        assert link.endswith("docs/observability.md"), alert["alert"]
        assert anchor in anchors, f"no runbook section for {alert['alert']} (#{anchor})"


def test_a_broken_expression_fails_the_check(tmp_path: Path) -> None:
    broken = tmp_path / "answers.rules.yml"
    text = (RULES_DIR / "answers.rules.yml").read_text()
    broken.write_text(text.replace("min_over_time(", "min_over_time((", 1))
    checked = promtool("check", "rules", str(broken))
    assert checked.returncode != 0
    assert "parse error" in (checked.stdout + checked.stderr)


def test_a_wrong_threshold_fails_the_rule_tests(tmp_path: Path) -> None:
    # The tests hold the rules' meaning, not only their syntax: a degraded-answers threshold
    # of 50 % no longer fires on 10 % degraded answers, and promtool says so.
    text = (RULES_DIR / "answers.rules.yml").read_text()
    loosened = re.sub(r"ratio_rate1m > 0\.05", "ratio_rate1m > 0.5", text)
    assert loosened != text
    (tmp_path / "answers.rules.yml").write_text(loosened)
    shutil.copy(RULES_DIR / "answers.test.yml", tmp_path)
    ran = promtool("test", "rules", "answers.test.yml", cwd=tmp_path)
    assert ran.returncode != 0
    assert "FraudmeshDegradedAnswers" in ran.stdout + ran.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    queries = dashboards.panel_queries()
    assert len(queries) > 20
    rules = [
        {"record": f"dashboard:query:{i}", "expr": expr} for i, expr in enumerate(queries.values())
    ]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboards_name_only_catalogued_metrics_and_recorded_rules() -> None:
    from services.common import metric_catalogue as catalogue

    known = {spec.name for spec in catalogue.CATALOGUE} | {"up"}
    known |= {
        f"{spec.name}_{part}" for spec in catalogue.CATALOGUE for part in ("bucket", "count", "sum")
    }
    recorded = {
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    functions = {"sum", "rate", "max", "histogram_quantile", "or", "vector"}
    for key, expr in dashboards.panel_queries().items():
        for name in re.findall(
            r"[a-zA-Z_:][a-zA-Z0-9_:]*",
            re.sub(r'"[^"]*"|\{[^}]*\}|\[[^]]*\]|by \([a-z_, ]*\)', "", expr),
        ):
            if name in functions or re.fullmatch(r"\d+[mh]?", name):
                continue
            assert name in known or name in recorded, (
                f"{key}: {name} is neither catalogued nor recorded"
            )


def test_generated_files_are_current() -> None:
    assert generate.main(["--check"]) == 0, "run `python -m services.observability` and commit"
