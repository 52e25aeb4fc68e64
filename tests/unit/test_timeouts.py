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

from tests.timeouts import register_logs


class Process:
    def __init__(self, name, log_path=None, says=""):
        self.name, self.log_path, self.says = name, log_path, says

    def log_tail(self, lines):
        return self.log_path.read_text() if self.log_path else self.says


class Mesh:
    def __init__(self, folder):
        self.processes = {"scorer": Process("scorer", folder / "scorer.log")}


class Broker:
    process = Process("kafka", says="kafka: controller elected")


@pytest.fixture(scope="module")
def mesh(request, tmp_path_factory):
    # Handed to tests and in a registered folder: its log must come once.
    folder = register_logs(request, tmp_path_factory.mktemp("mesh-logs"))
    (folder / "scorer.log").write_text("scorer: waiting for the model folder\\n")
    (folder / "envoy.log").write_text("envoy: upstream reset\\n")
    return Mesh(folder)


@pytest.fixture
def broker():
    return Broker()


@pytest.fixture
def own_mesh(request, tmp_path):
    # A mesh the test starts itself: only its log folder is known, for this test alone.
    folder = register_logs(request, tmp_path / "own-logs")
    (folder / "gateway").mkdir(parents=True)
    (folder / "gateway" / "gateway.log").write_text("gateway: features unavailable\\n")


@pytest.mark.timeout(1)
def test_hangs(mesh, broker, own_mesh):
    time.sleep(30)


def test_runs_after_the_hang():
    pass


def test_fails_later_in_the_module():
    assert False
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
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    hung, later = text.split("_ test_fails_later_in_the_module _")
    assert "Timeout" in hung
    for section, line in [
        ("mesh: scorer log, last 40 lines", "scorer: waiting for the model folder"),
        ("mesh-logs0/envoy.log, last 40 lines", "envoy: upstream reset"),
        ("broker: kafka log, last 40 lines", "kafka: controller elected"),
        ("own-logs/gateway/gateway.log, last 40 lines", "gateway: features unavailable"),
    ]:
        assert hung.count(section) == 1 and hung.count(line) == 1, (section, hung)
    # The module's mesh logs come with every failed test of the module; the test's own
    # mesh and its fixtures do not.
    assert later.count("scorer: waiting for the model folder") == 1, later
    assert later.count("envoy: upstream reset") == 1, later
    assert "gateway: features unavailable" not in later and "kafka" not in later, later
