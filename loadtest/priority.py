"""Process priority of the processes under test."""

from __future__ import annotations

import os
from collections.abc import Sequence

import psutil

from services.mesh import renice_threads


def normal_priority(pids: Sequence[int]) -> None:
    """Gives every thread of each process, and of its child processes, this process's niceness.

    ``services.mesh.Process`` starts children niced and renices the threads of the process it
    started once ready; child processes started during warm-up (MLServer's inference workers,
    `feast serve`'s workers) would otherwise stay niced for good and lose the CPU to anything
    else running, ghz included, which would measure the start-up niceness instead of the peer.
    """
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for pid in pids:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            renice_threads(proc.pid, mine)
