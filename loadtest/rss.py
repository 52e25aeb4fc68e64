"""Peak resident memory and CPU time of a set of processes, sampled with psutil."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import TracebackType

import psutil


class RssSampler:
    """Samples the RSS of named PIDs every ``interval_s`` and keeps each one's peak (bytes).

    A process's RSS includes its children's (MLServer's inference workers, gunicorn's
    worker under its master), summed, so shared pages of a forked tree count more than once.

    Use as a context manager around a load step; ``peaks`` then holds the step's peaks, and
    ``reset()`` starts a new step. A process that exits is simply no longer sampled.
    """

    def __init__(self, pids: Mapping[str, int], interval_s: float = 0.2) -> None:
        self._procs: dict[str, psutil.Process] = {}
        for name, pid in pids.items():
            try:
                self._procs[name] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.peaks: dict[str, int] = dict.fromkeys(self._procs, 0)

    def sample(self) -> None:
        """Takes one sample of every process now."""
        for name, proc in self._procs.items():
            try:
                rss = int(proc.memory_info().rss)
                for child in proc.children(recursive=True):
                    try:
                        rss += int(child.memory_info().rss)
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            with self._lock:
                if rss > self.peaks[name]:
                    self.peaks[name] = rss

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU time so far of each process and its live children."""
        out: dict[str, float] = {}
        for name, proc in self._procs.items():
            total = 0.0
            try:
                for p in (proc, *proc.children(recursive=True)):
                    times = p.cpu_times()
                    total += times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
            out[name] = total
        return out

    def reset(self) -> dict[str, int]:
        """Returns the peaks so far and starts over."""
        with self._lock:
            peaks, self.peaks = self.peaks, dict.fromkeys(self._procs, 0)
        return peaks

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
