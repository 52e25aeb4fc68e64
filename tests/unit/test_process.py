"""How the mesh starts its children: same PID, low priority until ready, gone with the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.mesh import STARTUP_NICENESS, Process

REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` no longer runs (or is a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _execs_into(pid: int, program: bytes, timeout_s: float) -> bool:
    """True once ``pid`` runs ``program`` (its argv[0])."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == program:
            return True
        time.sleep(0.01)
    return False


def test_child_keeps_its_pid_and_gets_normal_priority_once_ready(tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    child = Process(
        name="sleeper",
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        ready=flag.exists,
        log_path=tmp_path / "sleeper.log",
    )
    child.start()
    try:
        assert child.pid is not None
        # The launch tools exec into the child: the PID we hold becomes the service itself.
        assert _execs_into(child.pid, sys.executable.encode(), timeout_s=10)
        parent_nice = os.getpriority(os.PRIO_PROCESS, 0)
        # Niceness stops at 19: a test run that is itself niced (make test's lanes) sees less.
        starting = min(parent_nice + STARTUP_NICENESS, 19)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == starting

        flag.touch()
        child.wait_ready(timeout_s=5)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == parent_nice
    finally:
        assert child.stop(timeout_s=5) == -signal.SIGTERM


def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    parent_code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from services.mesh import Process
        child = Process(name="orphan", argv=["sleep", "60"], ready=lambda: True)
        child.start()
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert _execs_into(child_pid, b"sleep", timeout_s=10)
        assert not _gone(child_pid, timeout_s=0.2)
        parent.kill()  # no chance to clean up: only the death signal can end the child
        parent.wait(5)
        dead = _gone(child_pid, timeout_s=5)
        if not dead:
            os.kill(child_pid, signal.SIGKILL)
        assert dead, "the child outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(5)


def _ports_of_another_process(count: int) -> set[int]:
    """``count`` ports reserved by another process, which still holds them when this returns
    (it waits for a line on stdin before it exits)."""
    code = textwrap.dedent(
        f"""
        import sys
        from services.mesh.process import free_port
        print(" ".join(str(free_port()) for _ in range({count})), flush=True)
        sys.stdin.readline()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        return {int(word) for word in child.stdout.readline().split()}
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_free_ports_are_distinct_below_the_ephemeral_range_and_held_across_processes() -> None:
    from services.mesh.process import PORT_FLOOR, _ephemeral_floor, _reserved, free_port

    mine = {free_port() for _ in range(200)}
    assert len(mine) == 200
    assert all(PORT_FLOOR <= port < _ephemeral_floor() for port in mine)
    # Another process never gets a port this one holds, while this one lives.
    theirs = _ports_of_another_process(200)
    assert len(theirs) == 200
    assert not mine & theirs
    assert mine <= set(_reserved)


def test_a_free_port_is_one_nothing_listens_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from services.mesh import process

    with socket.socket() as sock:
        for taken in range(process.PORT_FLOOR + 500, process.PORT_FLOOR + 900):
            try:
                sock.bind(("127.0.0.1", taken))
            except OSError:
                continue
            break
        sock.listen(1)
        # The search starts at the port something listens on: it must pass over it.
        monkeypatch.setattr(process.random, "randrange", lambda _: taken - process.PORT_FLOOR)
        port = process.free_port()
        assert port != taken
        assert process.PORT_FLOOR <= port < process._ephemeral_floor()


def test_a_reserved_port_is_held_from_other_processes_free_port() -> None:
    from services.mesh.process import _reserved, free_port, reserve_port

    # A port derived from another (a replica's, a step above its part's), reserved here.
    base = free_port()
    derived = base + 100
    while not reserve_port(derived):
        base = free_port()
        derived = base + 100
    assert derived in _reserved and reserve_port(derived)
    # Another process whose search starts at that very port passes over it.
    code = textwrap.dedent(
        f"""
        from services.mesh import process
        process.random.randrange = lambda _: {derived} - process.PORT_FLOOR
        print(process.free_port())
        """
    )
    theirs = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert theirs.returncode == 0, theirs.stderr
    assert int(theirs.stdout) not in (derived, base)


def test_a_port_block_never_takes_a_port_this_process_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block for a counted-up option (``--metrics-port``) must not take a port handed out
    before in the same process (a part's, a replica's): a benchmark's metrics block once
    took a gateway replica's gRPC port and read HTTP/2 bytes as /metrics."""
    from services.mesh import process

    handed = process.up_ports(["gateway"], ["gateway"], replicas=3)["gateway"]
    replica = handed + 100  # reserved by up_ports for the second gateway
    assert replica in process._reserved
    # The block's search starts just below that replica's port.
    starts = iter([replica - 2 - process.PORT_FLOOR])
    real = process.random.randrange
    monkeypatch.setattr(process.random, "randrange", lambda n: next(starts, None) or real(n))
    first = process.free_port_block(24)
    assert not first <= replica < first + 24
    assert not first <= handed < first + 24
