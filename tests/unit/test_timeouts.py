"""Every integration module has a time limit, and a hung test fails alone, with its logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import timeouts

pytest_plugins = ("pytester",)

REPO = Path(__file__).resolve().parents[2]

HANGING = """
import time
import pytest


class Process:
    name = "scorer"

    def log_tail(self, lines):
        return "scorer: waiting for the model folder"


class Mesh:
    processes = {"scorer": Process()}


@pytest.fixture
def mesh():
    return Mesh()


@pytest.mark.timeout(1)
def test_hangs(mesh):
    time.sleep(30)


def test_runs_after_the_hang():
    pass
"""


def test_every_integration_module_has_a_limit() -> None:
    modules = {
        p.relative_to(timeouts.INTEGRATION).as_posix()
        for p in timeouts.INTEGRATION.rglob("test_*.py")
    }
    assert modules - timeouts.LIMITS_S.keys() == set(), "add a limit to tests/timeouts.py"
    assert timeouts.LIMITS_S.keys() - modules == set(), "a listed module no longer exists"


def test_limits_are_found_by_path() -> None:
    integration = timeouts.INTEGRATION
    assert timeouts.limit_for(integration / "test_images.py") == 1800
    assert timeouts.limit_for(integration / "eventlog" / "test_file_log.py") == 90
    assert timeouts.limit_for(Path(__file__)) is None


def test_a_hung_test_fails_with_its_logs_and_the_run_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a child pytest: the signal timeout would replace this test's own alarm in process.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_hang=HANGING)
    result = pytester.runpytest_subprocess("-p", "tests.timeouts", "-p", "no:asyncio", timeout=120)
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "Timeout" in text
    assert "mesh: scorer log, last 40 lines" in text
    assert "scorer: waiting for the model folder" in text
