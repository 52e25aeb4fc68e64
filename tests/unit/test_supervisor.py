"""The supervisor over real child processes (``sleep`` and ``sh`` stand in for services):
restarts after a crash, leaves deliberate stops and explicit restarts alone, and gives up
on a crash loop with the child's log."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.mesh import CrashLoop, Mesh, MeshConfig, Process, RestartPolicy, Supervisor

FAST = RestartPolicy(backoff_initial_s=0.05, backoff_max_s=0.2, max_crashes=3, window_s=60)
WAIT_S = 30.0


def _until(condition: Callable[[], bool], supervisor: Supervisor | None = None) -> None:
    """Ticks (if given a supervisor) until ``condition`` holds; fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        if supervisor is not None:
            supervisor.tick()
        time.sleep(0.02)


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    """A mesh object whose children are two sleeping processes."""
    m = Mesh(MeshConfig(var_dir=tmp_path, log_dir=tmp_path / "logs"))
    m.processes = {
        name: Process(name, ["sleep", "600"], ready=lambda: True, log_path=tmp_path / f"{name}.log")
        for name in ("a", "b")
    }
    for process in m.processes.values():
        process.start()
    yield m
    m.stop()


def test_a_killed_child_is_restarted_and_the_others_untouched(mesh: Mesh) -> None:
    supervisor = Supervisor(mesh, FAST)
    a, b = mesh.processes["a"], mesh.processes["b"]
    old_a, old_b = a.pid, b.pid
    a.signal(9)
    _until(lambda: a.alive() and a.pid != old_a, supervisor)
    _until(lambda: supervisor._children["a"].starting_since is None, supervisor)
    assert supervisor.restarts == {"a": 1, "b": 0}
    assert b.pid == old_b and b.alive()


def test_a_deliberate_stop_is_left_alone(mesh: Mesh) -> None:
    supervisor = Supervisor(mesh, FAST)
    mesh.processes["a"].stop()
    for _ in range(20):
        supervisor.tick()
        time.sleep(0.01)
    assert not mesh.processes["a"].alive()
    assert supervisor.restarts["a"] == 0


def test_explicit_restarts_and_the_supervisor_do_not_fight(mesh: Mesh) -> None:
    supervisor = Supervisor(mesh, FAST)
    stop = threading.Event()
    thread = threading.Thread(target=supervisor.run, args=(stop, 0.01))
    thread.start()
    try:
        for _ in range(5):
            old = mesh.processes["a"].pid
            mesh.restart("a", timeout_s=WAIT_S)
            assert mesh.processes["a"].pid != old
    finally:
        stop.set()
        thread.join(10)
    assert supervisor.restarts == {"a": 0, "b": 0}
    assert all(p.alive() for p in mesh.processes.values())


def test_a_crash_loop_gives_up_with_the_log(mesh: Mesh, tmp_path: Path) -> None:
    crashing = Process(
        "c",
        ["sh", "-c", "echo boom before dying; exit 3"],
        ready=lambda: False,
        log_path=tmp_path / "c.log",
    )
    mesh.processes["c"] = crashing
    crashing.start()
    supervisor = Supervisor(mesh, FAST)
    deadline = time.monotonic() + WAIT_S
    with pytest.raises(CrashLoop) as caught:
        while time.monotonic() < deadline:
            supervisor.tick()
            time.sleep(0.02)
    assert caught.value.process is crashing
    assert "crashed 3 times" in str(caught.value)
    assert "boom before dying" in caught.value.log_tail
    assert mesh.processes["a"].alive()


def test_a_child_never_ready_after_restart_is_killed_and_counted(mesh: Mesh) -> None:
    policy = RestartPolicy(backoff_initial_s=0.01, max_crashes=2, window_s=60, ready_timeout_s=0.2)
    hung = mesh.processes["b"]
    hung.ready = lambda: False
    supervisor = Supervisor(mesh, policy)
    hung.signal(9)
    with pytest.raises(CrashLoop):
        _until(lambda: False, supervisor)


def test_an_optional_child_that_keeps_crashing_is_left_down_and_the_mesh_serves_on(
    tmp_path: Path,
) -> None:
    # Prometheus or the trace collector crashing (a port taken, a bad disk) never stops the
    # mesh: after its crash loop it is left down, the other children untouched.
    m = Mesh(MeshConfig(var_dir=tmp_path, log_dir=tmp_path / "logs"))
    m.processes = {
        "serving": Process("serving", ["sleep", "600"], ready=lambda: True),
        "prometheus": Process(
            "prometheus", ["sh", "-c", "exit 3"], ready=lambda: False, optional=True
        ),
    }
    reports: list[str] = []
    try:
        for process in m.processes.values():
            process.start()
        supervisor = Supervisor(m, FAST, report=reports.append)
        _until(lambda: any("runs on without it" in line for line in reports), supervisor)
        for _ in range(20):
            supervisor.tick()  # no CrashLoop, no more restarts
            time.sleep(0.01)
        assert supervisor.restarts["prometheus"] == FAST.max_crashes - 1
        assert not m.processes["prometheus"].alive()
        assert m.processes["serving"].alive()
    finally:
        m.stop()
