"""The supervisor: restarts children of a started mesh that exit while they should run."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.mesh.process import Process
from services.mesh.topology import Mesh


@dataclass(frozen=True)
class RestartPolicy:
    """How a supervisor restarts children, and when it gives up."""

    backoff_initial_s: float = 0.5
    """Wait before the first restart after a crash."""
    backoff_max_s: float = 15.0
    """Longest wait between restarts; the wait doubles with each crash in the window."""
    max_crashes: int = 5
    """Crashes of one child within ``window_s`` that make the supervisor give up."""
    window_s: float = 60.0
    """Crashes older than this are forgotten (and the backoff starts over)."""
    ready_timeout_s: float = 120.0
    """A restarted child not ready within this long is killed and counted as a crash."""

    def __post_init__(self) -> None:
        if self.max_crashes < 1 or self.window_s <= 0 or self.backoff_initial_s < 0:
            raise ValueError(f"invalid restart policy {self}")


class CrashHistory:
    """One child's recent crashes: the backoff before the next restart, or the verdict that
    it crashes too often (``max_crashes`` within ``window_s``)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._policy = policy
        self._times: deque[float] = deque()

    def record(self, now: float) -> float | None:
        """Adds a crash at ``now``; returns seconds to wait before restarting, or None to give up."""
        p = self._policy
        self._times.append(now)
        while self._times and self._times[0] <= now - p.window_s:
            self._times.popleft()
        crashes = len(self._times)
        if crashes >= p.max_crashes:
            return None
        return float(min(p.backoff_max_s, p.backoff_initial_s * 2 ** (crashes - 1)))

    def recent(self, now: float) -> int:
        """Crashes within the window before ``now``."""
        return sum(1 for t in self._times if t > now - self._policy.window_s)


class CrashLoop(RuntimeError):
    """A child crashed too often; carries its name and its last log lines."""

    def __init__(self, process: Process, crashes: int, window_s: float) -> None:
        super().__init__(
            f"{process.name} crashed {crashes} times within {window_s:.0f} s "
            f"(last exit status {process.returncode()})"
        )
        self.process = process
        self.log_tail = process.log_tail()


@dataclass
class _Child:
    """What the supervisor knows of one child between ticks."""

    history: CrashHistory
    restart_at: float | None = None
    starting_since: float | None = None


class Supervisor:
    """Restarts children of a started mesh that exit while they should run.

    ``tick`` does one round and returns at once: a crashed child is restarted after its
    backoff, a restarting one is probed until ready (then gets normal priority and
    ``on_ready`` runs, e.g. to refill a fresh redis-server), and a child that crashes
    ``max_crashes`` times within ``window_s`` raises ``CrashLoop``. Children stopped on
    purpose, or held by ``Mesh.restart``, are left alone. Envoy's bootstrap is written once
    at start, so a restarted Envoy keeps its ports.
    """

    def __init__(
        self,
        mesh: Mesh,
        policy: RestartPolicy | None = None,
        on_ready: Callable[[str], None] | None = None,
        report: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mesh = mesh
        self.policy = policy or RestartPolicy()
        self._on_ready = on_ready
        self._report = report or (lambda _message: None)
        self._clock = clock
        self._children = {name: _Child(CrashHistory(self.policy)) for name in mesh.processes}
        self.restarts: dict[str, int] = dict.fromkeys(mesh.processes, 0)

    def tick(self) -> None:
        """One round over every child; raises CrashLoop when one crashes too often."""
        for name, process in self.mesh.processes.items():
            with self.mesh._lock:
                if self.mesh._stopping:
                    return
                child = self._children[name]
                if name in self.mesh._held:
                    # Someone else is restarting it; whatever we were doing is moot.
                    child.restart_at = child.starting_since = None
                    continue
                self._step(name, process, child)

    def _step(self, name: str, process: Process, child: _Child) -> None:
        now = self._clock()
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restart_at = None
                child.starting_since = now
                self.restarts[name] += 1
                process.start()
                self._report(f"{name} restarted (pid {process.pid})")
            return
        if child.starting_since is not None:
            if not process.alive():
                child.starting_since = None
                self._crashed(name, process, child, now)
            elif process.ready():
                process.normal_priority()
                took = now - child.starting_since
                child.starting_since = None
                self._report(f"{name} ready again ({took:.1f} s after its restart)")
                if self._on_ready is not None:
                    self._on_ready(name)
            elif now - child.starting_since > self.policy.ready_timeout_s:
                self._report(f"{name} not ready {self.policy.ready_timeout_s:.0f} s after restart")
                child.starting_since = None
                process.kill()
                self._crashed(name, process, child, now)
            return
        if process.expected and process.popen is not None and not process.alive():
            self._crashed(name, process, child, now)

    def _crashed(self, name: str, process: Process, child: _Child, now: float) -> None:
        delay = child.history.record(now)
        if delay is None:
            if process.optional:
                # Observability is never a reason to stop serving: leave it down.
                process.expected = False
                self._report(
                    f"{name} crashed {child.history.recent(now)} times within "
                    f"{self.policy.window_s:.0f} s; the mesh runs on without it"
                )
                return
            raise CrashLoop(process, child.history.recent(now), self.policy.window_s)
        child.restart_at = now + delay
        self._report(
            f"{name} exited ({process.returncode()}); restarting in {delay:.1f} s "
            f"({child.history.recent(now)} crash(es) in {self.policy.window_s:.0f} s)"
        )

    def run(self, stop: threading.Event, interval_s: float = 0.2) -> None:
        """Ticks until ``stop`` is set; raises CrashLoop."""
        while not stop.wait(interval_s):
            self.tick()
