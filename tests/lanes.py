"""Which lane of ``make test`` each test module runs in, and why.

A run has two phases, because on two cores the suite is bound by CPU and the modules that
judge time cannot share the machine with a busy neighbour of equal priority:

1. ``timing`` (the modules that judge time: a fault window's late calls against the same
   run's baseline, a load step's answers against the budget), one after another at normal
   priority, beside ``quick``: the unit tests, then the static checks (generated code, lint,
   types, manifests, ``go test``), all under ``SCHED_IDLE``. An idle-class process runs only
   on a core that nothing else wants and is preempted the moment a normal one wakes, so the
   timing modules keep the machine's time while its pauses do the quick work. Run beside the
   integration tests at nice 10 instead, the chaos matrix's SIGTERM row, the crash matrix and
   the lifecycle's canary saw late calls past their bound (load average 9 to 15).
2. ``rest`` (every other integration module) over ``TEST_WORKERS`` pytest-xdist workers, two by
   default, whole modules to a worker, beside ``images`` (the image build, mostly download and
   copying, at nice 10). In one process the integration and unit modules took 2,137 s of a CI
   run; over two workers, 1,665 s (``loadtest/results/test-durations-rest-2workers.json``).

``tests/unit/test_lanes.py`` holds that every integration module is in exactly one lane.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
INTEGRATION = TESTS / "integration"

TIMING: tuple[str, ...] = (
    "test_chaos.py",
    "test_crash.py",
    "test_lifecycle.py",
    "test_rollout.py",
    "test_hostile_input.py",
    "test_cascade.py",
    "test_supervisor.py",
    "test_loadtest_smoke.py",
    "test_feature_order.py",
)
"""Integration modules (paths under tests/integration) that judge latency or late calls."""


def timing_modules() -> list[Path]:
    """The timing lane's modules, in the order they run."""
    return [INTEGRATION / name for name in TIMING]


def integration_modules() -> list[Path]:
    """Every integration test module."""
    return sorted(INTEGRATION.rglob("test_*.py"))


IMAGES: tuple[str, ...] = ("test_images.py",)
"""Integration modules of the ``images`` lane: builds that mostly wait on downloads and disks."""


def images_modules() -> list[Path]:
    """The ``images`` lane's modules."""
    return [INTEGRATION / name for name in IMAGES]


def rest_modules() -> list[Path]:
    """The integration modules of the ``rest`` lane."""
    elsewhere = set(timing_modules()) | set(images_modules())
    return [path for path in integration_modules() if path not in elsewhere]
