"""Under ``CI=true`` no test skips: a missing tool or privilege fails it (tests/ci.py)."""

from __future__ import annotations

import pytest

from tests import ci

pytest_plugins = ("pytester",)

SKIPPING = """
import pytest
from tests.ci import unavailable

def test_needs_a_tool():
    unavailable("frobnicate is not installed")

@pytest.mark.skipif(True, reason="needs root")
def test_needs_root():
    pass

def test_skips_itself():
    pytest.skip("no chromium")

@pytest.mark.xfail(reason="a known defect", strict=True)
def test_known_defect():
    assert False

def test_runs():
    pass
"""

SKIPPED_MODULE = """
import pytest
pytest.skip("promtool is missing", allow_module_level=True)

def test_never_collected():
    pass
"""


@pytest.mark.parametrize("value", ["true", "1", "TRUE", "yes"])
def test_ci_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert ci.running_in_ci()


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_a_machine_without_ci_is_not_ci(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not ci.running_in_ci()


def test_under_ci_every_skip_fails_with_its_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_tools=SKIPPING)
    result = pytester.runpytest("-rA", "-p", "no:asyncio", plugins=[ci])
    # A skip mark acts in setup, so that test is reported as an error: red all the same.
    result.assert_outcomes(passed=1, failed=2, errors=1, xfailed=1)
    text = result.stdout.str()
    assert "frobnicate is not installed (CI=true: a missing tool or privilege fails" in text
    assert "skipped under CI=true, which allows no skip: needs root" in text
    assert "skipped under CI=true, which allows no skip: no chromium" in text


def test_under_ci_a_module_that_skips_itself_is_an_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_promtool=SKIPPED_MODULE)
    result = pytester.runpytest("-rA", "-p", "no:asyncio", plugins=[ci])
    result.assert_outcomes(errors=1)
    assert "skipped under CI=true, which allows no skip: promtool is missing" in result.stdout.str()


def test_outside_ci_a_missing_tool_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_tools=SKIPPING, test_promtool=SKIPPED_MODULE)
    result = pytester.runpytest("-rA", "-p", "no:asyncio", plugins=[ci])
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)
