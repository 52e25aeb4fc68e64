"""How the crash matrix judges a row: windows around the kill, calls in flight at it, the
pooled reference, the time until answers are at full quality again."""

from __future__ import annotations

from loadtest.crash import Call, Row, reference
from loadtest.faultwindow import Tally, allowed


def _calls(start: float, n: int, step: float = 0.01, **kw: object) -> list[Call]:
    defaults: dict[str, object] = {"latency_s": 0.005, "status": "OK", "degraded": False}
    defaults.update(kw)
    return [
        Call(start + i * step, transaction_id=f"t{start}-{i}", **defaults)  # type: ignore[arg-type]
        for i in range(n)
    ]


def test_a_call_in_flight_at_the_kill_belongs_to_the_kill() -> None:
    calls = [*_calls(0.0, 100), Call(1.095, 0.01, "UNAVAILABLE", "x"), *_calls(1.2, 50)]
    row = Row("envoy", calls=calls, kill_s=1.1, ready_again_s=0.5)
    assert row.in_flight_at_kill() == 1
    assert row.failures_allowed() == 1, "an Envoy may fail what was in flight on it"
    assert row.passed()
    gateway = Row("gateway", calls=row.calls, kill_s=1.1)
    assert gateway.failures_allowed() == 0
    assert "1 failed, at most 0 allowed" in gateway.problems()


def test_a_call_sent_after_the_kill_must_not_fail() -> None:
    calls = [*_calls(0.0, 100), Call(1.2, 0.001, "UNAVAILABLE", "late-fail"), *_calls(1.3, 50)]
    row = Row("envoy", calls=calls, kill_s=1.1)
    assert "a call sent after the kill failed" in row.problems()


def test_late_calls_are_judged_against_the_pooled_reference() -> None:
    before = _calls(0.0, 300)
    after = _calls(3.0, 300)
    late = [Call(6.0 + i * 0.01, 0.05, "OK", f"l{i}") for i in range(20)]
    row = Row("scorer", calls=[*before, *after, *late], kill_s=3.0, ready_again_s=1.0)
    assert row.windows() == (Tally(250, 0), Tally(300 + 20, 20))
    assert row.late_allowed() == allowed(Tally(250, 0), 320) == 15
    assert not row.passed()
    # The verdict says when the late calls were sent: here one burst 3.00-3.19 s after the kill.
    assert "20/320 late, at most 15 allowed (sent 3.00 to 3.19 s after the kill)" in row.problems()
    row.reference = Tally(1000, 20)  # a machine late 2 % of the time anyway
    assert row.late_allowed() == 21 and row.passed()


def test_the_reference_is_every_unfaulted_call_of_the_run() -> None:
    baseline = Row(None, calls=_calls(0.0, 300), kill_s=1.5)
    killed = Row("features", calls=[*_calls(10.0, 300, latency_s=0.05)], kill_s=11.5)
    pooled = reference([baseline, killed])
    # The baseline row whole (less its warm-up), the killed row before its kill only.
    assert pooled == Tally(250 + 95, 95)


def test_quality_is_back_after_the_last_degraded_answer() -> None:
    calls = [*_calls(0.0, 100), *_calls(1.0, 100, degraded=True), *_calls(2.0, 100)]
    row = Row("scorer", calls=calls, kill_s=1.0)
    back = row.quality_back_s()
    assert back is not None and 0.99 <= back <= 1.01
    ended_degraded = Row("scorer", calls=calls[:200], kill_s=1.0)
    assert ended_degraded.quality_back_s() is None
    assert "answers still degraded at the end of the row" in ended_degraded.problems()
    clean = Row("gateway", calls=_calls(0.0, 100), kill_s=0.5)
    assert clean.quality_back_s() == 0.0
