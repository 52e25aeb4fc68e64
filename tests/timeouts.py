"""Time limits of the integration tests, one per module, and the logs a failed test carries.

A hang fails its test, not the run: pytest-timeout's signal method raises inside the hung test,
which fails with the stack where it waited; its fixtures are torn down (processes stopped by PID),
the tails of the logs of the processes it ran are added to its report, and the run goes on.

Any failed test carries, once each, the last lines of the logs of the processes it was handed
as fixtures (a mesh, a broker, a process) and of the log folders registered for it, its module
or its session with ``register_logs`` (meshes a test or module starts itself).

A limit covers one test with its setup and teardown, including the session's prepared state or
the brokers and the module's mesh when that test is the one that starts them. It sits well
above what the module's slowest test takes on a loaded 2-core machine, and above the module's
own bounded waits (a subprocess timeout, a start deadline), so that those fail first with their
own message and only a hang nothing else bounds reaches it. A ``@pytest.mark.timeout`` on a test
or module wins over the table; ``tests/unit/test_timeouts.py`` checks every integration module is
listed. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
INTEGRATION = TESTS / "integration"

LIMITS_S: dict[str, int] = {
    # In-process servers and logs, no mesh: seconds per test.
    "eventlog/test_file_log.py": 90,
    "decisionlog/test_recovery.py": 90,
    "test_runtime_errors.py": 120,
    "test_streams.py": 120,
    "test_transport_reasons.py": 120,
    # The session's redis-server or Kafka broker (Kafka formats and starts in ~15 s), a sink.
    "eventlog/test_redis_streams.py": 120,
    "eventlog/test_journal.py": 180,
    "eventlog/test_contract.py": 240,
    "eventlog/test_outage.py": 240,
    "decisionlog/test_sink.py": 240,
    # Two or three sinks on one log, one killed: bounded waits of up to 390 s in all.
    "decisionlog/test_sinks.py": 420,
    "decisionlog/test_cli.py": 180,
    "test_feature_writer.py": 180,
    # One mesh (start bounded at 120 s) and a handful of calls, after the prepared state.
    "decisionlog/test_mesh_sink.py": 300,
    "test_cli_up.py": 300,
    "test_fallbacks.py": 300,
    "test_policy.py": 420,
    "test_admission.py": 240,
    "test_list_store.py": 120,
    "test_model_reasons.py": 300,
    "test_merchant_thresholds.py": 300,
    "test_in_process.py": 300,
    "test_mesh_redis.py": 300,
    "test_tracing.py": 300,
    "test_reflection_tools.py": 300,
    "test_feature_store.py": 300,
    "test_train_lifecycle.py": 300,
    # A mesh with the live loop (start bounded at 180 s) and a flow through it, or a training.
    "test_liveloop.py": 420,
    "test_liveloop_brokers.py": 420,
    "test_liveloop_replay.py": 420,
    "test_liveloop_group.py": 300,
    # The same, with the console, Chromium and verdicts waited for in the decision log.
    "test_console.py": 480,
    "test_console_secured.py": 420,
    # A mesh without the loop, the console beside it, Chromium, a few changes followed.
    "test_console_controls.py": 420,
    "test_cascade.py": 600,
    # A mesh with the monitor on a store it materializes first, a few thousand calls through
    # Envoy per test, and the report and export commands (each bounded at 300 s).
    "test_monitor.py": 900,
    "test_data_import.py": 420,
    # A mesh with Prometheus and its collector, a second collector, traces waited for.
    "test_observability.py": 420,
    # Two collectors and a handful of spans, waited for past the sampler's decision wait.
    "test_tail_sampling.py": 120,
    # A mesh with the monitor, steady traffic, three model imports and three rollouts.
    "test_rollout.py": 900,
    # A version folder imported, then a candidate in its own feature order through shadow,
    # canary, promotion and rollback under steady traffic.
    "test_feature_order.py": 900,
    "test_train_from_decisions.py": 420,
    # A Go client built in the test or its module (bounded at 300 s, 600 s cold in envoy_edge).
    "test_mesh.py": 600,
    "test_edge_security.py": 600,
    "test_envoy_edge.py": 720,
    # A wheel built and installed (300 s each), manifests built with kustomize.
    "test_k8s.py": 720,
    # Every container of both overlays under bubblewrap, each overlay's pods started at once:
    # 5-7 min an overlay at a load average of 12-15 on 2 cores (five Feast imports at once).
    "test_k8s_pods.py": 1800,
    # Load for minutes: hostile requests, the runner's rate steps, faults under traffic.
    "test_hostile_input.py": 480,
    "test_loadtest_smoke.py": 480,
    "test_lifecycle.py": 900,
    "test_supervisor.py": 600,
    "test_chaos.py": 1200,
    "test_crash.py": 1200,
    # debootstrap, a buildah build and the smoke test inside the image.
    "test_images.py": 1800,
}
"""Seconds each test of a module may take, keyed by its path under tests/integration."""

LOG_LINES = 40
"""Lines of each log added to a failed test's report."""
TAIL_BYTES = 256 * 1024
"""Bytes read from the end of a log file for its tail (a load test's log can be large)."""


def limit_for(path: Path) -> int | None:
    """The table's limit for a test module, or None outside tests/integration."""
    try:
        key = path.resolve().relative_to(INTEGRATION).as_posix()
    except ValueError:
        return None
    return LIMITS_S.get(key)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each integration test with its module's limit unless it has its own."""
    for item in items:
        limit = limit_for(item.path)
        if limit is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))


_FOLDERS: dict[str, list[Path]] = {}
"""Log folders registered by fixtures and tests, by the node id of the requesting scope."""


def register_logs(request: pytest.FixtureRequest, folder: Path) -> Path:
    """Makes a failed test carry the tails of the ``*.log`` files in ``folder``: every test of
    the requesting module when a module fixture asks, the one test when a test or a function
    fixture does. For what a test starts without handing it out as a fixture (a mesh inside
    a fault run, ``fraudmesh up`` in a subprocess); processes that are fixtures need nothing."""
    _FOLDERS.setdefault(request.node.nodeid, []).append(folder)
    return folder


@dataclass(frozen=True)
class _Log:
    """One log a failed test's report carries."""

    title: str
    path: Path | None
    """The file, when known: a log reached two ways is reported once."""
    process: Any = None
    """Read through its ``log_tail`` when its file is not known."""

    def read(self) -> str:
        """The log's last ``LOG_LINES`` lines."""
        if self.path is not None:
            return _tail(self.path)
        return str(self.process.log_tail(LOG_LINES))


def _tail(path: Path) -> str:
    """The last ``LOG_LINES`` lines of the file at ``path`` (none before it is written)."""
    if not path.exists():
        return ""
    with path.open("rb") as log:
        log.seek(max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES))
        text = log.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-LOG_LINES:])


def _processes(value: Any) -> Iterator[Any]:
    """The processes a fixture value runs: a mesh's, a broker's, or itself."""
    processes = getattr(value, "processes", None)
    if isinstance(processes, dict):
        yield from processes.values()
        return
    for candidate in (getattr(value, "process", None), value):
        if callable(getattr(candidate, "log_tail", None)):
            yield candidate
            return


def _of_process(fixture: str, process: Any) -> _Log:
    path = getattr(process, "log_path", None)
    title = f"{fixture}: {getattr(process, 'name', fixture)} log"
    return _Log(title, path if isinstance(path, Path) else None, process)


def _logs(item: pytest.Item) -> Iterator[_Log]:
    """The logs of the processes ``item`` was handed, then those in the folders registered for
    it, its module or its session, each file once."""
    logs = [
        _of_process(name, process)
        for name, value in getattr(item, "funcargs", {}).items()
        for process in _processes(value)
    ]
    for node in item.listchain():
        for folder in _FOLDERS.get(node.nodeid, []):
            logs.extend(
                _Log(path.relative_to(folder.parent).as_posix(), path)
                for path in sorted(folder.rglob("*.log"))
            )
    seen: set[Path] = set()
    for log in logs:
        if log.path is not None:
            if log.path.resolve() in seen:
                continue
            seen.add(log.path.resolve())
        yield log


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the last lines of each of its logs, once each."""
    report = yield
    if report.failed:
        for log in _logs(item):
            try:
                tail = log.read()
            except OSError as error:
                tail = f"(log unreadable: {error})"
            if tail:
                report.sections.append((f"{log.title}, last {LOG_LINES} lines", tail))
    return report
