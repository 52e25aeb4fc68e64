"""Which lane of ``make test`` each test module runs in, and why.

A run has two phases, because on two cores the suite is bound by CPU and the modules that
judge time cannot share the machine. Before them, ``tools`` builds the pinned Go tools and
the trace collector (``scripts/tools.sh``, a no-op once they are installed), which every
lane but ``images`` runs; ``images`` starts beside it, so that its downloads and the test
data's preparation overlap the compiles.

1. ``rest``, every module that does not judge time, unit and integration, over
   ``TEST_WORKERS`` pytest-xdist workers (two by default, whole modules to a worker), beside
   ``static`` (generated code, lint, types, manifests, ``go test``) and ``images`` (the image
   build, mostly download and copying), both at nice 10. In one process the rest took 2,137 s
   of a CI run; over two workers, 1,665 s (``loadtest/results/test-durations-rest-2workers.json``);
   with the image's dependencies kept, 695 s over two and 635 s over three, which saturated
   the cores and are not the default (``loadtest/results/test-durations-2workers.json``,
   ``test-durations-3workers.json``); with bytecode compiled at install, 477 s over two
   (``test-durations.json``).
2. ``timing`` alone, once the others have ended: the modules that judge time (a fault
   window's late calls against the same run's baseline, a load step's answers against the
   budget), one after another. Nothing runs beside them, not even at idle priority. Beside the
   integration tests at nice 10, the chaos matrix's SIGTERM row, the crash matrix and the
   lifecycle's canary saw late calls past their bound (load average 9 to 15); beside
   ``SCHED_IDLE`` work (a mesh test and two trainings), five chaos rows, the crash matrix and a
   lifecycle test failed as well: a neighbour that comes and goes between a baseline and its
   fault window makes them incomparable.

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
    "test_admission.py",
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
