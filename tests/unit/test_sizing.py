"""What ``fraudmesh up`` runs on a machine of a given size, and how it counts the cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.mesh import sizing


def test_a_small_machine_runs_one_of_each_part_but_the_gateway() -> None:
    two = sizing.for_cores(2)
    assert (two.envoy, two.gateway, two.features, two.scorer) == (1, 2, 1, 1)
    assert two.gateway_in_process and "in process" in two.reason
    assert two.edge_max_in_flight == 2 * sizing.IN_FLIGHT_PER_CORE
    assert "sized for 2 cores" in two.reason and "flags win" in two.reason


def test_a_large_machine_runs_two_of_every_part() -> None:
    eight = sizing.for_cores(8)
    assert (eight.envoy, eight.gateway, eight.features, eight.scorer) == (2, 2, 2, 2)
    assert not eight.gateway_in_process
    assert eight.edge_max_in_flight == 8 * sizing.IN_FLIGHT_PER_CORE


def test_no_cores_is_refused() -> None:
    with pytest.raises(ValueError, match="cores"):
        sizing.for_cores(0)


@pytest.mark.parametrize(
    "cpu_max,expected",
    [
        ("max 100000\n", None),
        ("150000 100000\n", 2),
        ("50000 100000\n", 1),
        ("garbage\n", None),
    ],
)
def test_a_cgroup_quota_lowers_the_cores(
    tmp_path: Path, cpu_max: str, expected: int | None
) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    want = affinity if expected is None else min(affinity, expected)
    assert sizing.usable_cores(path) == want


def test_no_cgroup_file_counts_the_affinity(tmp_path: Path) -> None:
    assert sizing.usable_cores(tmp_path / "absent") == len(os.sched_getaffinity(0))
