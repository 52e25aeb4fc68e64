"""Under CI a test never skips: a missing tool or privilege fails it, with the reason.

``CI=true`` (``.ci/run`` sets it; hosted CI services do too) marks a run whose green must mean
every check ran. A developer's machine may lack root or a tool, and there ``unavailable()``
skips; under CI it fails, and any other skip is turned into a failure by the hooks below, so
a check that never ran cannot be reported as passed. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any, NoReturn

import pytest

CI_VALUES = frozenset({"1", "true", "yes"})
"""Values of ``CI`` that mean a CI run (compared lower-case)."""


def running_in_ci() -> bool:
    """True when ``CI`` says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def unavailable(reason: str) -> NoReturn:
    """Skips the calling test on a developer's machine; fails it under CI."""
    if running_in_ci():
        pytest.fail(f"{reason} (CI=true: a missing tool or privilege fails the run)", pytrace=False)
    pytest.skip(reason)


def _as_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turns a skipped report into a failed one that names the skip's reason."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, which allows no skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, Any, None]:
    """A test that skips (a skip mark, ``pytest.skip``, ``importorskip``) fails under CI."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and running_in_ci():
        _as_failure(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """A module that skips itself while collected fails under CI (an error that stops the run)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and running_in_ci():
        _as_failure(report)
