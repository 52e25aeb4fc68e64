"""Which lane of ``make test`` each test module runs in, and why.

- ``rest``: every test module that does not judge time, unit and integration, in one pytest
  process by default; ``TEST_WORKERS=N`` spreads it over N pytest-xdist workers (whole modules
  to a worker, so a module's mesh is started once). On two cores the suite is bound by CPU, not
  by waiting: with two workers the lane took 1,665 s of wall time for 2,970 s of test time
  (``loadtest/results/test-durations-rest-2workers.json``, at a load average of 3 to 6), while
  the landed suite took 35 min one module after another, the timing modules included.
- ``static``: lint, type checks, generated-code and manifest checks, ``go test``, beside it at
  a lower priority.
- ``timing``: the modules that judge time, a fault window's late calls against the same
  run's baseline or a load step's answers against the budget. They run one after another
  once the other lanes have ended, alone on the machine: run beside the ``rest`` lane, even
  at a lower priority for the rest (nice 10), a restart's or a fault's late calls rose past
  their bound (the chaos matrix's SIGTERM row, the crash matrix, the lifecycle's canary).

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


def rest_modules() -> list[Path]:
    """The integration modules of the ``rest`` lane."""
    timing = set(timing_modules())
    return [path for path in integration_modules() if path not in timing]
