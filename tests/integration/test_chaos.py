"""The fault matrix, short and at a low rate, each fault judged against its own baseline.

ghz drives Score through Envoy open loop (60 calls/s, each with a 200 ms deadline that Envoy
cuts to 50 ms) while each row breaks something on schedule. A call is late or failed when it
ends with DEADLINE_EXCEEDED or another error, or OK past the 42 ms budget as ghz measures it.
The calls that ended from the fault on may hold at most the baseline's share of such calls
plus max(15 calls, 1 %) (``loadtest.faultwindow``); the baseline is the calls of the same row
that ended before the fault or, for a fault that lasts the whole row (a slow scorer,
overload), the baseline row of the same run. A fallback that answers late fails this at
once: every call it answers is late. No status but OK and DEADLINE_EXCEEDED (and
RESOURCE_EXHAUSTED where shedding is the answer) may appear at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from loadtest import faultwindow
from loadtest.chaos import BUDGET_MS, Chaos, ChaosPlan, Row, markdown

from .conftest import register_logs

pytestmark = pytest.mark.integration

PLAN = ChaosPlan(rps=60, duration_s=8.0, fault_at_s=3.0, recover_at_s=5.0, overload_capacity_rps=40)

BASELINE_LATE_SHARE = 0.05
"""Share of the baseline row's calls that may be late or failed. The baseline is what the
faults are judged by, so it must itself answer on time: a mesh late for everyone (a blocking
call on the request path, say) fails here rather than passing every relative check. One stall
of the machine fits (a local run of this row, nothing faulted: 9 of 450 calls late within
100 ms; a 250 ms stall at 60 calls/s is 15 calls, 3.3 %)."""

FAULTS = ["scorer-killed", "scorer-slowed", "features-service", "redis-server", "3x", "SIGTERM"]


@pytest.fixture(scope="module")
def matrix(
    prepared_env: Any, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Row]:
    """Runs every row once; the tests below read their rows."""
    logs = register_logs(request, tmp_path_factory.mktemp("chaos"))
    rows = Chaos(prepared_env.var_dir, logs, PLAN).run()
    print(markdown(rows, PLAN))
    return {
        row.fault.split(" ")[0] + ("-" + row.fault.split(" ")[1] if " " in row.fault else ""): row
        for row in rows
    }


def _row(matrix: dict[str, Row], prefix: str) -> Row:
    return next(row for key, row in matrix.items() if key.startswith(prefix))


def _late_or_failed(row: Row) -> list[tuple[float, float, str]]:
    """(seconds from the fault, ms, status) of every late or failed call of the row."""
    assert row.load is not None
    origin = row.fault_s or min(c.started_s for c in row.load.calls)
    return [
        (round(c.started_s - origin, 2), round(c.latency_ms, 1), c.status)
        for c in row.load.calls
        if not (row.shed_expected and c.status == "ResourceExhausted")
        and faultwindow.late_or_failed(c.status == "OK", c.latency_ms, BUDGET_MS)
    ]


def test_the_baseline_answers_on_time(matrix: dict[str, Row]) -> None:
    row = _row(matrix, "none")
    whole = row.whole()
    assert whole.calls > 0
    assert whole.share <= BASELINE_LATE_SHARE, (str(whole), _late_or_failed(row))


@pytest.mark.parametrize("prefix", ["none", *FAULTS])
def test_no_call_fails_but_by_its_deadline(matrix: dict[str, Row], prefix: str) -> None:
    row = _row(matrix, prefix)
    assert row.load is not None and row.load.count > 0
    assert not row.unexpected_statuses(), (row.load.status_counts, row.load.errors)


@pytest.mark.parametrize("prefix", ["none", *FAULTS])
def test_a_fault_costs_no_more_late_or_failed_calls_than_its_baseline(
    matrix: dict[str, Row], prefix: str
) -> None:
    row = _row(matrix, prefix)
    verdict = row.verdict()
    assert verdict is not None, "no baseline to judge by"
    assert verdict.ok, f"{row.fault}: {verdict}; late or failed: {_late_or_failed(row)}"


def test_scorer_outage_is_answered_by_the_small_model_and_recovers(
    matrix: dict[str, Row],
) -> None:
    row = _row(matrix, "scorer-killed")
    assert "small model 0%" not in row.breaker and "rules 0%" in row.breaker, row.breaker
    assert any(note.startswith("recovered") for note in row.notes), row.notes


def test_slow_scorer_opens_the_breaker(matrix: dict[str, Row]) -> None:
    row = _row(matrix, "scorer-slowed")
    assert "scorer→open" in row.breaker, row.breaker


def test_feature_outages_fall_back_to_defaults_and_recover(matrix: dict[str, Row]) -> None:
    for prefix in ("features-service", "redis-server"):
        row = _row(matrix, prefix)
        assert "default features 0%" not in row.breaker, row.breaker
        assert any(note.startswith("recovered") for note in row.notes), row.notes


def test_overload_is_shed_fast_with_resource_exhausted(matrix: dict[str, Row]) -> None:
    row = _row(matrix, "3x")
    assert row.load is not None
    assert row.load.status_counts.get("ResourceExhausted", 0) > 0
    # Shed calls are refused at the edge, far faster than scored ones: the typical one (a
    # stall of the machine moves every p99 alike).
    shed, scored = row.median_ms("ResourceExhausted"), row.median_ms("OK")
    assert 2 * shed < scored, (shed, scored)
