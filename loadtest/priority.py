"""Process priority of the processes under test."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import psutil


def normal_priority(pids: Sequence[int]) -> None:
    """Gives every thread of each process (and its children) this process's niceness.

    ``services.mesh.Process`` starts children niced and renices only their main thread once
    ready; threads started during warm-up (gRPC's poller and event-engine threads, Envoy's
    workers) would otherwise stay niced for good and lose the CPU to anything else running,
    ghz included, which measures the start-up niceness instead of the services.
    """
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for pid in pids:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            for task in Path(f"/proc/{proc.pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), mine)
