"""Every test's duration, kept as a results file of the run: where a CI run's time goes.

``--durations-file PATH`` (``make test`` names one per lane it runs) writes, at the end of
the session, each test's setup, call and teardown seconds with its outcome and the CPU
seconds it spent (with the processes it started and ended), the totals per module, and the run's provenance (commit, date, machine, command; ``loadtest/provenance.py``). Under pytest-xdist the controller writes it from the reports its workers
send back, so one file covers the whole session. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from loadtest import provenance

REPO = Path(__file__).resolve().parents[1]

_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()
"""Node id → the test's seconds per phase and its outcome."""
_START = pytest.StashKey[float]()
"""When the session started (epoch seconds)."""
_CPU = "cpu_s"
"""The user property a phase's report carries its CPU seconds in (it crosses from an xdist
worker to the controller with the report)."""
_PHASE_CPU = pytest.StashKey[float]()
"""CPU seconds spent when the current phase started."""
_CONFIG: dict[str, pytest.Config] = {}
"""The session's config, for the report hook, which is not handed it."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--durations-file``: where to write the run's durations (JSON)."""
    parser.addoption(
        "--durations-file",
        default=None,
        help="write every test's setup/call/teardown seconds and the run's conditions to this JSON file",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Starts the record (on the controller only: a worker's reports reach it)."""
    config.stash[_KEY] = {}


def cpu_seconds() -> float:
    """CPU seconds, user and system, of this process and of every child it has reaped: the
    services, meshes, drivers and builds a test starts count once they have ended, so a
    module's total includes the processes of its module-scoped fixtures."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Puts the CPU seconds of the phase just ended on its report."""
    outcome = yield
    started = item.stash.get(_PHASE_CPU, None)
    now = cpu_seconds()
    item.stash[_PHASE_CPU] = now
    if started is not None:
        outcome.get_result().user_properties.append((_CPU, round(now - started, 3)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Starts the CPU count of the test's phases."""
    item.stash[_PHASE_CPU] = cpu_seconds()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds a phase's duration to its test's record."""
    config = _CONFIG.get("config")
    tests = None if config is None else config.stash.get(_KEY, None)
    if tests is None:
        return
    record = tests.setdefault(
        report.nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0, "outcome": "passed"}
    )
    record[report.when] = round(record[report.when] + report.duration, 3)
    for key, value in report.user_properties:
        if key == _CPU:
            record["cpu"] = round(record.get("cpu", 0.0) + float(value), 3)
    if report.failed:
        record["outcome"] = "failed" if report.when == "call" else "error"
    elif report.skipped and record["outcome"] == "passed":
        record["outcome"] = "skipped"
    worker = getattr(report, "node", None)
    if worker is not None:
        record["worker"] = str(getattr(worker, "gateway", worker).id)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Remembers the config for reports that do not carry it, and the start time."""
    _CONFIG["config"] = session.config
    session.config.stash[_START] = time.time()


def conditions(command: list[str]) -> dict[str, Any]:
    """Commit, date, machine and command of a run: the record every results file carries
    (``loadtest/provenance.py``), with a mark on the commit when the tree had changes."""
    found = provenance.record(" ".join(command))
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=10,
    ).stdout.strip()
    if dirty:
        found = dataclasses.replace(found, commit=f"{found.commit}+changes")
    return {"provenance": found.as_json()}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Writes the file (the controller of an xdist run, or a plain run)."""
    config = session.config
    path = config.getoption("--durations-file")
    if not path or hasattr(config, "workerinput"):
        return
    tests = config.stash.get(_KEY, {})
    modules: dict[str, float] = defaultdict(float)
    module_cpu: dict[str, float] = defaultdict(float)
    for nodeid, record in tests.items():
        record["total"] = round(record["setup"] + record["call"] + record["teardown"], 3)
        module = nodeid.split("::", 1)[0]
        modules[module] += record["total"]
        module_cpu[module] += record.get("cpu", 0.0)
    started = config.stash.get(_START, time.time())
    document = conditions(["pytest", *sys.argv[1:]]) | {
        "exit_status": int(exitstatus),
        "wall_s": round(time.time() - started, 1),
        "workers": getattr(config.option, "numprocesses", None) or 0,
        "tests": len(tests),
        "modules": {k: round(v, 1) for k, v in sorted(modules.items(), key=lambda kv: -kv[1])},
        "modules_cpu_s": {
            k: round(module_cpu[k], 1) for k in sorted(modules, key=lambda k: -modules[k])
        },
        "durations": dict(sorted(tests.items(), key=lambda kv: -kv[1]["total"])),
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=1) + "\n")
