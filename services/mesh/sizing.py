"""How many processes of each part ``fraudmesh up`` runs, and how many calls its edge lets in,
chosen from the cores the machine gives it.

Every process on a small machine costs a share of the cores that the calls in flight need.
On two cores a second feature service and a second scorer cost more capacity than they
protect: the gateway's breakers already answer on default features or with the rules when
one is down. A second gateway is kept, because it is what lets Envoy send a call elsewhere
when a gateway dies (a gateway SIGKILL fails no call), and one Envoy is enough, because one
Envoy worker proxies far more calls than the Python services behind it answer. On a small
machine the gateways also read the online store and run the model themselves (in process):
the two hops to the feature service and the scorer cost more of its cores than any other
work a Score does, and they protect nothing there that a gateway's own breakers do not (the
feature service and the scorer still run, for other clients). From four cores on, two of
every part, called over the network, protect more than they cost. The measurements behind
these choices: ``docs/performance.md``, "Defaults sized to the machine".

The edge's admission limit bounds the calls in flight to what the cores finish within the
budget: past it a call is refused at once (RESOURCE_EXHAUSTED) rather than queued until it is
late (``docs/reliability.md``, "Admission at the edge").
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

SMALL_MACHINE_CORES = 3
"""Up to this many cores the mesh runs one Envoy, feature service and scorer, and two gateways
that read the store and run the model in process."""

IN_FLIGHT_PER_CORE = 2
"""Calls the edge lets in at once per core. A Score costs the whole mesh 9–12 ms of CPU on
this project's 2-core reference machine, so two calls per core share a core for about
20–25 ms, inside the 42 ms budget with room for the tail. Side by side past saturation,
four calls in flight left fewer admitted calls late than six (at 600 calls/s 3.0–9.9 %
against 10.9–18.6 %), at some goodput (docs/reliability.md, "Admission at the edge")."""

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2 CPU quota of this process's group ("max 100000" when unlimited)."""


@dataclass(frozen=True)
class Sizing:
    """The processes per part and the edge's admission limit for ``cores`` cores."""

    cores: int
    envoy: int
    gateway: int
    features: int
    scorer: int
    edge_max_in_flight: int
    gateway_in_process: bool
    """The gateways read the online store and run the model themselves."""

    @property
    def reason(self) -> str:
        """One line saying what was chosen and why, for ``up``'s table."""
        size = "small" if self.cores <= SMALL_MACHINE_CORES else "large"
        why = (
            "two gateways (a gateway's death fails no call) that read the store and run the "
            "model in process (a hop costs more than it protects here); one feature service "
            "and scorer, for other clients"
            if size == "small"
            else "two of every part"
        )
        return (
            f"sized for {self.cores} core{'s' if self.cores != 1 else ''}: {why}; the edge "
            f"admits {self.edge_max_in_flight} calls at once ({IN_FLIGHT_PER_CORE} per core) "
            "and refuses the rest at once; flags win"
        )


def for_cores(cores: int) -> Sizing:
    """The sizing of a machine with ``cores`` usable cores (at least 1)."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    small = cores <= SMALL_MACHINE_CORES
    return Sizing(
        cores=cores,
        envoy=1 if small else 2,
        gateway=2,
        features=1 if small else 2,
        scorer=1 if small else 2,
        edge_max_in_flight=IN_FLIGHT_PER_CORE * cores,
        gateway_in_process=small,
    )


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may run on: its CPU affinity, lowered by a cgroup CPU quota (a
    container limited to 1.5 CPUs counts 2)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text(encoding="ascii").split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    try:
        limit = math.ceil(int(quota) / int(period))
    except (ValueError, ZeroDivisionError):
        return cores
    return max(1, min(cores, limit))
