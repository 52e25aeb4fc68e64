"""Judging a fault against its own baseline: the bound, ghz's per-call records, and how a row
of the fault matrix splits its calls into the baseline and the fault's window."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest import faultwindow
from loadtest.chaos import Row
from loadtest.faultwindow import Tally
from loadtest.ghz import CallRecord, Result, parse_report


@pytest.mark.parametrize(
    ("baseline", "calls", "allowed"),
    [
        (Tally(100, 0), 50, 15),  # a short window: one pause's fifteen calls
        (Tally(100, 0), 300, 15),
        (Tally(100, 0), 3000, 30),  # a long one: 1 %
        (Tally(200, 2), 300, 18),  # the baseline's share (3) plus fifteen calls
        (Tally(200, 2), 3000, 60),  # the baseline's share (30) plus 1 % (30)
        (Tally(0, 0), 100, 15),  # no baseline calls: the slack alone
    ],
)
def test_the_bound_is_the_baseline_share_plus_max_of_fifteen_calls_and_one_percent(
    baseline: Tally, calls: int, allowed: int
) -> None:
    assert faultwindow.allowed(baseline, calls) == allowed


def test_a_verdict_needs_calls_in_the_fault_window() -> None:
    assert not faultwindow.judge(Tally(100, 0), Tally(0, 0)).ok
    assert faultwindow.judge(Tally(100, 0), Tally(300, 15)).ok
    assert not faultwindow.judge(Tally(100, 0), Tally(300, 16)).ok


@pytest.mark.parametrize(
    ("ok", "latency_ms", "late"),
    [(True, 41.9, False), (True, 42.0, False), (True, 42.1, True), (False, 3.0, True)],
)
def test_late_or_failed(ok: bool, latency_ms: float, late: bool) -> None:
    assert faultwindow.late_or_failed(ok, latency_ms) is late


def test_ghz_details_become_call_records_stamped_at_their_start() -> None:
    report: dict[str, Any] = {
        "count": 2,
        "total": 2_000_000_000,
        "details": [
            # ghz stamps a call when it ends, in RFC 3339 with nanoseconds.
            {"timestamp": "2026-01-01T00:00:01.050000000Z", "latency": 50_000_000, "status": "OK"},
            {
                "timestamp": "2026-01-01T01:00:02.000000000+01:00",
                "latency": 1_000_000,
                "status": "DeadlineExceeded",
                "error": "rpc error: code = DeadlineExceeded",
            },
        ],
    }
    result = parse_report(report)
    epoch = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    assert [c.status for c in result.calls] == ["OK", "DeadlineExceeded"]
    assert result.calls[0].started_s == pytest.approx(epoch + 1.0)
    assert result.calls[0].latency_ms == pytest.approx(50.0)
    assert result.calls[1].started_s == pytest.approx(epoch + 1.999)


def _load(calls: list[CallRecord]) -> Result:
    statuses: dict[str, int] = {}
    slowest: dict[str, float] = {}
    for call in calls:
        statuses[call.status] = statuses.get(call.status, 0) + 1
        slowest[call.status] = max(slowest.get(call.status, 0.0), call.latency_ms)
    return Result(
        offered_rps=60.0,
        achieved_rps=60.0,
        count=len(calls),
        duration_s=8.0,
        p50_ms=5.0,
        p90_ms=8.0,
        p99_ms=20.0,
        p999_ms=30.0,
        max_ms=30.0,
        mean_ms=5.0,
        status_counts=statuses,
        status_p99_ms=slowest,
        calls=tuple(calls),
    )


def _steady(start: float, seconds: float, late: frozenset[int] = frozenset()) -> list[CallRecord]:
    """Calls every 1/60 s from ``start``; those numbered in ``late`` took 60 ms."""
    return [
        CallRecord(start + i / 60, 60.0 if i in late else 4.0, "OK")
        for i in range(int(60 * seconds))
    ]


def test_a_fallback_that_answers_late_fails_its_row() -> None:
    # 3 s before the fault, then 2 s of late answers while the scorer is down.
    calls = _steady(0.0, 8.0, late=frozenset(range(180, 300)))
    row = Row("scorer killed", "", load=_load(calls), fault_s=3.0)
    verdict = row.verdict()
    assert verdict is not None and not verdict.ok
    assert verdict.fault.bad == 120 and verdict.baseline.bad == 0
    assert not row.passed()


def test_a_call_in_flight_at_the_fault_belongs_to_its_window() -> None:
    calls = _steady(0.0, 8.0)
    # Sent just before the fault, ended after it, late: the fault's.
    calls.append(CallRecord(2.99, 45.0, "DeadlineExceeded"))
    row = Row("scorer killed", "", load=_load(calls), fault_s=3.0)
    baseline, fault = row.tallies()
    assert baseline is not None and baseline.bad == 0 and fault.bad == 1


def test_a_machine_that_is_late_as_often_before_the_fault_passes() -> None:
    # One call in 60 late, before and after the fault alike: the machine, not the fault.
    calls = _steady(0.0, 8.0, late=frozenset({*range(0, 480, 60), 31}))
    row = Row("features killed", "", load=_load(calls), fault_s=3.0)
    assert row.passed(), row.verdict()


def test_the_load_generators_first_half_second_is_not_judged() -> None:
    calls = _steady(0.0, 8.0, late=frozenset(range(5)))
    row = Row("none", "", load=_load(calls), fault_s=3.0)
    baseline, _ = row.tallies()
    assert baseline is not None and baseline.bad == 0 and baseline.calls == 150


def test_a_whole_row_fault_is_judged_against_the_reference_and_sheds_are_not_late() -> None:
    calls = _steady(0.0, 8.0, late=frozenset({200}))
    calls += [CallRecord(1.0 + i / 100, 1.0, "ResourceExhausted") for i in range(500)]
    row = Row(
        "3x the edge limit",
        "",
        load=_load(calls),
        shed_expected=True,
        reference=Tally(400, 0),
    )
    verdict = row.verdict()
    assert verdict is not None and verdict.ok
    assert verdict.fault.calls == 450 and verdict.fault.bad == 1
    assert row.passed()
    assert Row("slow scorer", "", load=_load(calls)).verdict() is None


def test_a_call_lost_with_any_other_status_fails_its_row_however_few() -> None:
    calls = _steady(0.0, 8.0)
    calls.append(CallRecord(4.0, 1.0, "Unavailable"))
    row = Row("scorer killed", "", load=_load(calls), fault_s=3.0)
    verdict = row.verdict()
    assert verdict is not None and verdict.ok  # one failed call is within the bound...
    assert row.unexpected_statuses() == {"Unavailable"}
    assert not row.passed()  # ...but no call may be lost
