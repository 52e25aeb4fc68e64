"""A child process of the mesh: launch, readiness probes, priority, stop.

Every child gets its own process group and dies with its parent (PR_SET_PDEATHSIG), so
nothing is left behind even if the parent is killed. The death signal and the start-up
niceness are set by exec'ing through util-linux ``setpriv`` and coreutils ``nice`` rather
than a ``preexec_fn``: Python code between fork and exec can deadlock in a process that
runs threads (gRPC's), and then ``Popen`` never returns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

STARTUP_NICENESS = 10
"""Children start at this niceness and get normal priority once ready: the seconds of CPU
a Python service spends importing and warming up must not starve the replicas that are
serving meanwhile (a rolling restart on a small machine)."""


def _launch_prefix() -> list[str]:
    """The argv prefix every child is exec'd through: SIGTERM when the parent dies, start
    at ``STARTUP_NICENESS``. Each tool execs the next, so the child keeps its PID."""
    setpriv, nice = shutil.which("setpriv"), shutil.which("nice")
    if setpriv is None or nice is None:
        raise RuntimeError("starting the mesh needs setpriv (util-linux) and nice (coreutils)")
    return [setpriv, "--pdeathsig", "TERM", "--", nice, "-n", str(STARTUP_NICENESS), "--"]


def renice_threads(pid: int, niceness: int) -> None:
    """Sets every thread of ``pid`` to ``niceness``. Niceness is per thread on Linux: the
    threads a process has started by now (gRPC pollers, timers, Envoy's workers) need it,
    not only the main one. Threads that end meanwhile, and a lack of permission to lower
    niceness (root or CAP_SYS_NICE), are skipped."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


PORT_FLOOR = 15000
"""Lowest port ``free_port`` hands out; it hands out ports below the kernel's ephemeral range."""
PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "fraudmesh-ports"
"""One lock file per handed-out port: what reserves it across processes."""
_reserved: dict[int, IO[bytes]] = {}
"""Ports this process reserved, with the open lock file that holds each until it exits."""


def _ephemeral_floor() -> int:
    """The lowest port of the kernel's ephemeral range (outgoing connections take theirs
    from it), 32768 where the kernel does not say."""
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768


def _binds(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that binds now and that no other caller on this machine holds.

    A port the kernel picks for port 0 comes from the ephemeral range: between this call and
    the server's bind, any outgoing connection may take it, and so may the next caller in
    another process (tests that run side by side). So ports come from below that range,
    each reserved by a lock on its own file, held by this process until it exits (the lock
    file is not inherited by children, which bind the port themselves)."""
    ceiling = _ephemeral_floor()
    if ceiling - PORT_FLOOR < 1000:
        with socket.socket() as sock:  # a narrowed-down range: the kernel's choice it is
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    span = ceiling - PORT_FLOOR
    start = random.randrange(span)
    for step in range(span):
        port = PORT_FLOOR + (start + step) % span
        if port not in _reserved and reserve_port(port, host):
            return port
    raise RuntimeError(f"no free port between {PORT_FLOOR} and {ceiling}")


def reserve_port(port: int, host: str = "127.0.0.1") -> bool:
    """Reserves ``port`` as ``free_port`` reserves the ports it hands out (a lock on its own
    file, held by this process until it exits), if no other caller holds it and it binds
    now: for a port derived from another (a replica's, a fixed step above its part's), which
    a free-port check alone leaves to the next caller of ``free_port`` elsewhere. True if
    this process holds it."""
    if port in _reserved:
        return True
    PORT_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(PORT_LOCK_DIR / str(port), "ab")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return False
    if not _binds(host, port):
        lock.close()
        return False
    _reserved[port] = lock
    return True


def _reserve_new(port: int, host: str = "127.0.0.1") -> bool:
    """Reserves ``port`` unless this process already holds it: a port it handed out before
    (another part's, a block's, an earlier run's) is not free for the next caller, though
    ``reserve_port`` would say this process holds it."""
    return port not in _reserved and reserve_port(port, host)


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports, every one reserved as ``free_port``
    reserves its port: for an option whose value the program counts up from (``fraudmesh
    up --metrics-port``: one /metrics port per process), where another caller's
    ``free_port`` could take a port of the run before its process binds it."""
    while True:
        first = free_port(host)
        if all(_reserve_new(first + i, host) for i in range(1, count)):
            return first


def grpc_serving(target: str, timeout_s: float = 0.5, service: str = "") -> bool:
    """True when ``target`` answers grpc.health.v1 Check with SERVING."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def http_ok(url: str, timeout_s: float = 0.5) -> bool:
    """True when ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def up_ports(
    names: Sequence[str], replicated: Sequence[str] = (), step: int = 100, replicas: int = 2
) -> dict[str, int]:
    """Free ports for ``fraudmesh up``'s ``--<name>-port`` options. For a part in
    ``replicated``, the ports of its replicas up to ``replicas`` (``step`` apart, as
    ``--replica-port-step`` places them) are reserved too: a port only checked free could go
    to another caller's ``free_port`` before the replica binds it."""
    ports: dict[str, int] = {}
    for name in names:
        port = free_port()
        while name in replicated and not all(
            _reserve_new(port + step * n) for n in range(1, replicas)
        ):
            port = free_port()
        ports[name] = port
    return ports


def tcp_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


TERMINATE = signal.SIGTERM
"""What a stop sends unless told otherwise."""


@dataclass
class Process:
    """One child process of the mesh, with its readiness probe and log file."""

    name: str
    argv: list[str]
    ready: Callable[[], bool]
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    popen: subprocess.Popen[bytes] | None = None
    expected: bool = False
    """True from start() to stop(): an exit in between is a crash."""
    niceness: int = 0
    """Niceness once serving, above the parent's (0: the parent's)."""
    optional: bool = False
    """The mesh serves without it: a failed start or a crash loop leaves it down."""

    @property
    def pid(self) -> int | None:
        """The PID while running."""
        return self.popen.pid if self.popen is not None else None

    def start(self) -> None:
        """Starts the process with its environment, logging to ``log_path``."""
        # Importing feast in this process switches prometheus_client to multiprocess mode
        # through the environment; the children keep plain in-memory metrics.
        env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
        env.update(self.env)
        out: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        self.expected = True
        try:
            self.popen = subprocess.Popen(
                [*_launch_prefix(), *self.argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        """Blocks until the readiness probe passes; raises with the log tail if it never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.returncode()}\n{self.log_tail()}"
                )
            if self.ready():
                self.normal_priority()
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s\n{self.log_tail()}")

    def normal_priority(self) -> None:
        """Back to the parent's niceness once serving (lowering niceness needs root or
        CAP_SYS_NICE; without it the process keeps its start-up niceness)."""
        assert self.popen is not None
        renice_threads(self.popen.pid, os.getpriority(os.PRIO_PROCESS, 0) + self.niceness)

    def returncode(self) -> int | None:
        """Exit status once ended."""
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the process if it runs."""
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap, without marking the exit as intended (a hung child)."""
        if self.popen is not None and self.alive():
            self.popen.kill()
            self.popen.wait(5)

    def stop(self, timeout_s: float = 15.0, sig: int = TERMINATE) -> int | None:
        """``sig``, wait, then SIGKILL if it will not go; returns the exit status. A service
        drains on SIGTERM and stops without draining on SIGINT (``services.common.server``)."""
        self.expected = False
        if self.popen is None:
            return None
        if self.alive():
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the process log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
