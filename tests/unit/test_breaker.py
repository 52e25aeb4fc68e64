"""Circuit breaker: rate windows, open wait, half-open probes, hooks and config, on a fake clock."""

from __future__ import annotations

import ast
import dataclasses
import logging
import random
from collections import deque
from pathlib import Path

import pytest

from services.gateway import breaker as breaker_module
from services.gateway.breaker import (
    BreakerConfig,
    BreakerSnapshot,
    CircuitBreaker,
    State,
    WindowType,
)

FAST = 0.001
SLOW = 0.100


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Transitions:
    """Records the hook's calls."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, State, State]] = []

    def __call__(self, name: str, before: State, after: State) -> None:
        self.seen.append((name, before, after))


def config(**overrides: object) -> BreakerConfig:
    """A small config: count window 10, judged from 10 calls, 50 % thresholds, 3 probes."""
    fields: dict[str, object] = {
        "sliding_window_size": 10,
        "minimum_number_of_calls": 10,
        "failure_rate_threshold": 50.0,
        "slow_call_rate_threshold": 50.0,
        "slow_call_duration_threshold_s": 0.025,
        "wait_duration_in_open_state_s": 2.0,
        "permitted_number_of_calls_in_half_open_state": 3,
    }
    fields.update(overrides)
    return BreakerConfig(**fields)  # type: ignore[arg-type]


def make(
    clock: FakeClock | None = None, hook: Transitions | None = None, **overrides: object
) -> CircuitBreaker:
    return CircuitBreaker("features", config(**overrides), clock or FakeClock(), hook)


def call(breaker: CircuitBreaker, *, fail: bool = False, duration_s: float = FAST) -> bool:
    """One guarded call as the gateway makes it; False if the breaker refused it."""
    if not breaker.try_acquire():
        return False
    if fail:
        breaker.on_error(duration_s)
    else:
        breaker.on_success(duration_s)
    return True


def trip(breaker: CircuitBreaker) -> None:
    """Fails calls until the breaker opens."""
    for _ in range(breaker.config.sliding_window_size):
        call(breaker, fail=True)
        if breaker.state is State.OPEN:
            return
    raise AssertionError("breaker did not open")


# -- closed: failure rate, slow-call rate, minimum number of calls ---------------------------------


def test_new_breaker_is_closed_and_permits_calls() -> None:
    breaker = make()
    assert breaker.state is State.CLOSED
    assert breaker.try_acquire()
    assert breaker.failure_rate == -1.0
    assert breaker.slow_call_rate == -1.0


def test_opens_when_failure_rate_reaches_threshold() -> None:
    breaker = make()
    for _ in range(5):
        call(breaker)
    for _ in range(4):
        call(breaker, fail=True)
    assert breaker.state is State.CLOSED  # 9 calls: below the minimum of 10
    call(breaker, fail=True)
    # 5 of 10 failed: exactly at the threshold opens, as in resilience4j.
    assert breaker.state is State.OPEN
    assert breaker.failure_rate == 50.0


def test_stays_closed_below_failure_threshold() -> None:
    breaker = make()
    for _ in range(6):
        call(breaker)
    for _ in range(4):
        call(breaker, fail=True)
    assert breaker.state is State.CLOSED
    assert breaker.failure_rate == 40.0
    assert breaker.slow_call_rate == 0.0


def test_rates_are_not_judged_before_the_minimum_number_of_calls() -> None:
    breaker = make(minimum_number_of_calls=5)
    for _ in range(4):
        call(breaker, fail=True)
    assert breaker.state is State.CLOSED
    assert breaker.failure_rate == -1.0
    call(breaker, fail=True)
    assert breaker.state is State.OPEN


def test_a_success_that_reaches_the_minimum_is_judged_too() -> None:
    breaker = make(minimum_number_of_calls=5)
    for _ in range(4):
        call(breaker, fail=True)
    call(breaker)  # 4 of 5 failed once the minimum is reached
    assert breaker.state is State.OPEN


def test_slow_successful_calls_open_via_slow_call_rate() -> None:
    breaker = make()
    for _ in range(5):
        call(breaker)
    for _ in range(4):
        call(breaker, duration_s=SLOW)
    assert breaker.state is State.CLOSED
    call(breaker, duration_s=SLOW)
    assert breaker.state is State.OPEN
    assert breaker.failure_rate == 0.0
    assert breaker.slow_call_rate == 50.0


def test_a_call_exactly_at_the_slow_threshold_is_not_slow() -> None:
    breaker = make()
    for _ in range(10):
        call(breaker, duration_s=0.025)
    assert breaker.state is State.CLOSED
    assert breaker.slow_call_rate == 0.0
    assert breaker.slow_calls == 0


def test_a_failed_slow_call_counts_for_both_rates() -> None:
    breaker = make(failure_rate_threshold=100.0, slow_call_rate_threshold=100.0)
    for _ in range(8):
        call(breaker)
    call(breaker, fail=True, duration_s=SLOW)
    call(breaker, fail=True)
    snap = breaker.snapshot()
    assert snap.window_failed_calls == 2
    assert snap.window_slow_calls == 1
    assert snap.failure_rate == 20.0
    assert snap.slow_call_rate == 10.0
    assert (snap.failed_calls, snap.slow_calls) == (2, 1)


def test_thresholds_of_100_percent_open_only_when_every_call_is_bad() -> None:
    breaker = make(failure_rate_threshold=100.0)
    call(breaker)
    for _ in range(9):
        call(breaker, fail=True)
    assert breaker.state is State.CLOSED
    call(breaker, fail=True)  # evicts the one success
    assert breaker.state is State.OPEN


# -- the windows forget ---------------------------------------------------------------------------


def test_count_window_forgets_the_oldest_outcomes() -> None:
    breaker = make(sliding_window_size=4, minimum_number_of_calls=4, failure_rate_threshold=75.0)
    for fail in (True, True, False, False):
        call(breaker, fail=fail)
    assert breaker.failure_rate == 50.0
    call(breaker)
    call(breaker)  # both early failures have been pushed out
    assert breaker.failure_rate == 0.0
    assert breaker.snapshot().window_calls == 4
    call(breaker, fail=True)
    call(breaker, fail=True)
    assert breaker.state is State.CLOSED  # 2 of the last 4, not 4 of 8
    call(breaker, fail=True)
    assert breaker.state is State.OPEN


def test_time_window_forgets_outcomes_older_than_its_size() -> None:
    clock = FakeClock(1000.2)
    breaker = make(clock, sliding_window_type=WindowType.TIME_BASED, minimum_number_of_calls=3)
    call(breaker, fail=True)
    call(breaker, fail=True)
    clock.now = 1009.9  # second 1009: second 1000 is still one of the last 10
    assert breaker.snapshot().window_calls == 2
    clock.now = 1010.0  # second 1010: second 1000 has aged out
    assert breaker.snapshot().window_calls == 0
    call(breaker, fail=True)
    call(breaker)
    call(breaker)
    # 1 of 3 failed; had the old failures been kept it would be 3 of 5 and open.
    assert breaker.state is State.CLOSED
    assert breaker.failure_rate == pytest.approx(100 / 3)


def test_time_window_keeps_outcomes_inside_its_size() -> None:
    clock = FakeClock(1000.2)
    breaker = make(clock, sliding_window_type=WindowType.TIME_BASED, minimum_number_of_calls=3)
    call(breaker, fail=True)
    call(breaker, fail=True)
    clock.now = 1009.9
    call(breaker, fail=True)
    call(breaker)
    call(breaker)
    assert breaker.state is State.OPEN  # 3 of 5 within the last 10 seconds


def test_time_window_drops_buckets_one_second_at_a_time() -> None:
    clock = FakeClock(1000.0)
    breaker = make(
        clock,
        sliding_window_type=WindowType.TIME_BASED,
        sliding_window_size=3,
        minimum_number_of_calls=1,
        failure_rate_threshold=100.0,
    )
    for calls_this_second in (1, 2, 4):
        for _ in range(calls_this_second):
            call(breaker)
        clock.advance(1.0)
    clock.now = 1002.5
    assert breaker.snapshot().window_calls == 7
    clock.now = 1003.0
    assert breaker.snapshot().window_calls == 6
    clock.now = 1004.0
    assert breaker.snapshot().window_calls == 4
    call(breaker)  # the newest bucket holds a call too
    clock.now = 5000.0  # a long idle spell empties the whole ring in one pass
    assert breaker.snapshot().window_calls == 0
    call(breaker)
    assert breaker.snapshot().window_calls == 1


def test_time_window_minimum_may_exceed_its_size_in_seconds() -> None:
    clock = FakeClock()
    breaker = make(
        clock,
        sliding_window_type=WindowType.TIME_BASED,
        sliding_window_size=2,
        minimum_number_of_calls=20,
    )
    for _ in range(19):
        call(breaker, fail=True)
    assert breaker.state is State.CLOSED
    call(breaker, fail=True)
    assert breaker.state is State.OPEN


# -- open, then half-open -------------------------------------------------------------------------


def test_open_refuses_calls_until_the_wait_has_passed() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    opened_at = clock.now
    assert not breaker.try_acquire()
    clock.now = opened_at + 1.999
    assert not breaker.try_acquire()
    clock.now = opened_at + 2.0  # the wait must have passed, not just been reached
    assert not breaker.try_acquire()
    assert breaker.state is State.OPEN
    assert breaker.not_permitted_calls == 3
    clock.now = opened_at + 2.001
    assert breaker.try_acquire()
    assert breaker.state is State.HALF_OPEN


def test_refused_calls_do_not_enter_the_window() -> None:
    breaker = make()
    trip(breaker)
    before = breaker.snapshot()
    for _ in range(5):
        assert not call(breaker)
    after = breaker.snapshot()
    assert after.window_calls == before.window_calls
    assert after.successful_calls == before.successful_calls
    assert after.not_permitted_calls == before.not_permitted_calls + 5


def test_half_open_permits_exactly_the_configured_probes() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    assert [breaker.try_acquire() for _ in range(5)] == [True, True, True, False, False]
    assert breaker.state is State.HALF_OPEN
    assert breaker.not_permitted_calls == 2


def test_half_open_successes_close_with_a_fresh_window() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    assert call(breaker)
    assert call(breaker)
    assert breaker.state is State.HALF_OPEN  # decided only once every probe has reported
    assert call(breaker)
    assert breaker.state is State.CLOSED
    snap = breaker.snapshot()
    assert (snap.window_calls, snap.failure_rate, snap.slow_call_rate) == (0, -1.0, -1.0)
    # The failures that tripped it are gone: the next failures start from zero.
    for _ in range(9):
        call(breaker, fail=True)
    assert breaker.state is State.CLOSED


def test_half_open_decides_on_the_probes_rates() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    call(breaker)
    call(breaker)
    call(breaker, fail=True)  # 1 of 3: below 50 %
    assert breaker.state is State.CLOSED


def test_half_open_failures_open_again_with_a_new_wait() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    call(breaker)
    call(breaker, fail=True)
    call(breaker, fail=True)  # 2 of 3 failed
    assert breaker.state is State.OPEN
    assert breaker.failure_rate == pytest.approx(200 / 3)
    reopened_at = clock.now
    clock.now = reopened_at + 1.9
    assert not breaker.try_acquire()
    clock.now = reopened_at + 2.1
    assert breaker.try_acquire()
    assert breaker.state is State.HALF_OPEN


def test_slow_half_open_probes_open_again() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    call(breaker)
    call(breaker, duration_s=SLOW)
    call(breaker, duration_s=SLOW)
    assert breaker.state is State.OPEN
    assert breaker.failure_rate == 0.0


def test_release_frees_a_half_open_permit() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    assert all(breaker.try_acquire() for _ in range(3))
    assert not breaker.try_acquire()
    breaker.release()  # one probe was cancelled
    assert breaker.try_acquire()
    assert not breaker.try_acquire()
    assert breaker.snapshot().released_calls == 1


def test_cancelled_probes_do_not_leave_half_open_stuck() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    for _ in range(3):
        assert breaker.try_acquire()
    for _ in range(3):
        breaker.release()
    for _ in range(3):
        assert call(breaker)
    assert breaker.state is State.CLOSED


def test_release_without_a_probe_out_adds_no_permit() -> None:
    clock = FakeClock()
    breaker = make(clock)
    assert breaker.try_acquire()  # permitted while closed, cancelled much later
    trip(breaker)
    clock.advance(2.5)
    assert breaker.try_acquire()
    breaker.on_success(FAST)
    breaker.release()  # the closed-era call: no probe of its own to give back
    breaker.release()
    assert breaker.try_acquire()
    assert breaker.try_acquire()
    assert not breaker.try_acquire()


def test_release_while_closed_changes_nothing() -> None:
    breaker = make()
    assert breaker.try_acquire()
    breaker.release()
    snap = breaker.snapshot()
    assert (snap.state, snap.window_calls, snap.released_calls) == (State.CLOSED, 0, 1)


def test_outcome_of_a_call_permitted_before_opening_is_no_probe() -> None:
    clock = FakeClock()
    breaker = make(clock)
    assert breaker.try_acquire()  # in flight while the breaker trips
    trip(breaker)
    clock.advance(2.5)
    assert breaker.try_acquire()  # the breaker turns half-open: probe 1 of 3
    breaker.on_error(FAST)  # the probe fails
    breaker.on_success(FAST)  # the old call finally reports: no probe is out, so it is ignored
    assert breaker.snapshot().window_calls == 1
    assert breaker.state is State.HALF_OPEN


def test_outcomes_reported_while_open_are_kept_but_not_judged() -> None:
    breaker = make()
    for _ in range(3):
        assert breaker.try_acquire()  # in flight while the breaker trips
    trip(breaker)
    before = breaker.snapshot()
    for _ in range(3):
        breaker.on_success(FAST)
    after = breaker.snapshot()
    assert after.state is State.OPEN
    assert after.successful_calls == before.successful_calls + 3
    assert after.failure_rate < before.failure_rate


def test_max_wait_in_half_open_opens_again() -> None:
    clock = FakeClock()
    breaker = make(clock, max_wait_duration_in_half_open_state_s=1.0)
    trip(breaker)
    clock.advance(2.5)
    for _ in range(3):
        assert breaker.try_acquire()  # probes that never report
    clock.advance(0.9)
    assert not breaker.try_acquire()
    assert breaker.state is State.HALF_OPEN
    clock.advance(0.2)
    assert not breaker.try_acquire()
    assert breaker.state is State.OPEN
    clock.advance(2.5)
    assert breaker.try_acquire()
    assert breaker.state is State.HALF_OPEN


def test_half_open_waits_for_its_probes_without_a_max_wait() -> None:
    clock = FakeClock()
    breaker = make(clock)
    trip(breaker)
    clock.advance(2.5)
    for _ in range(3):
        assert breaker.try_acquire()
    clock.advance(3600.0)
    assert not breaker.try_acquire()
    assert breaker.state is State.HALF_OPEN


# -- hook, logging, manual control ----------------------------------------------------------------


def test_transitions_call_the_hook_with_name_and_states() -> None:
    clock = FakeClock()
    hook = Transitions()
    breaker = make(clock, hook)
    trip(breaker)
    clock.advance(2.5)
    call(breaker, fail=True)
    call(breaker, fail=True)
    call(breaker, fail=True)
    clock.advance(2.5)
    for _ in range(3):
        call(breaker)
    assert hook.seen == [
        ("features", State.CLOSED, State.OPEN),
        ("features", State.OPEN, State.HALF_OPEN),
        ("features", State.HALF_OPEN, State.OPEN),
        ("features", State.OPEN, State.HALF_OPEN),
        ("features", State.HALF_OPEN, State.CLOSED),
    ]


def test_hook_sees_the_new_state_already_in_place() -> None:
    states: list[State] = []
    breaker: CircuitBreaker

    def hook(name: str, before: State, after: State) -> None:
        states.append(breaker.state)

    breaker = CircuitBreaker("scorer", config(), FakeClock(), hook)
    trip(breaker)
    assert states == [State.OPEN]


def test_a_failing_hook_does_not_fail_the_call(caplog: pytest.LogCaptureFixture) -> None:
    def hook(name: str, before: State, after: State) -> None:
        raise RuntimeError("metrics backend down")

    breaker = CircuitBreaker("scorer", config(), FakeClock(), hook)
    with caplog.at_level(logging.ERROR, logger=breaker_module.__name__):
        trip(breaker)
    assert breaker.state is State.OPEN
    assert any("hook failed" in record.getMessage() for record in caplog.records)


def test_logs_transitions_only(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    breaker = make(clock)
    with caplog.at_level(logging.DEBUG, logger=breaker_module.__name__):
        for _ in range(50):
            call(breaker)
        assert caplog.records == []
        trip(breaker)
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.WARNING
    assert record.__dict__["breaker"] == "features"
    assert (record.__dict__["from_state"], record.__dict__["to_state"]) == ("closed", "open")


def test_forced_open_refuses_everything_until_reset() -> None:
    clock = FakeClock()
    hook = Transitions()
    breaker = make(clock, hook)
    breaker.force_open()
    clock.advance(3600.0)
    assert not breaker.try_acquire()
    assert breaker.state is State.FORCED_OPEN
    assert breaker.not_permitted_calls == 1
    breaker.reset()
    assert breaker.state is State.CLOSED
    assert breaker.try_acquire()
    assert hook.seen == [
        ("features", State.CLOSED, State.FORCED_OPEN),
        ("features", State.FORCED_OPEN, State.CLOSED),
    ]


def test_disabled_permits_everything_and_judges_nothing() -> None:
    breaker = make()
    breaker.disable()
    for _ in range(50):
        assert call(breaker, fail=True)
    assert breaker.state is State.DISABLED
    snap = breaker.snapshot()
    assert (snap.window_calls, snap.failed_calls) == (0, 50)


def test_reset_empties_the_window_but_keeps_the_counters() -> None:
    hook = Transitions()
    breaker = make(hook=hook)
    for _ in range(4):
        call(breaker, fail=True)
    breaker.reset()
    assert hook.seen == []  # already closed: no transition
    snap = breaker.snapshot()
    assert (snap.window_calls, snap.failed_calls) == (0, 4)


# -- snapshot ------------------------------------------------------------------------------------


def test_snapshot_reports_state_rates_and_counters() -> None:
    clock = FakeClock()
    breaker = make(clock)
    for _ in range(6):
        call(breaker)
    call(breaker, duration_s=SLOW)
    call(breaker, fail=True)
    call(breaker, fail=True, duration_s=SLOW)
    breaker.try_acquire()
    breaker.release()
    snap = breaker.snapshot()
    assert snap == BreakerSnapshot(
        name="features",
        state=State.CLOSED,
        failure_rate=-1.0,  # 9 calls, minimum 10
        slow_call_rate=-1.0,
        window_calls=9,
        window_failed_calls=2,
        window_slow_calls=2,
        successful_calls=7,
        failed_calls=2,
        slow_calls=2,
        not_permitted_calls=0,
        released_calls=1,
    )
    call(breaker)
    snap = breaker.snapshot()
    assert (snap.failure_rate, snap.slow_call_rate) == (20.0, 20.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.state = State.OPEN  # type: ignore[misc]


def test_snapshot_while_open_shows_the_window_that_tripped() -> None:
    breaker = make()
    for _ in range(5):
        call(breaker)
    trip(breaker)
    snap = breaker.snapshot()
    assert snap.state is State.OPEN
    assert (snap.window_calls, snap.window_failed_calls, snap.failure_rate) == (10, 5, 50.0)


# -- configuration -------------------------------------------------------------------------------


def test_default_config_is_valid_and_sized_for_the_budget() -> None:
    default = BreakerConfig()
    assert default.sliding_window_type is WindowType.COUNT_BASED
    assert default.minimum_number_of_calls <= default.sliding_window_size
    assert default.slow_call_duration_threshold_s < 0.042
    CircuitBreaker("default", default)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sliding_window_type": "COUNT_BASED"}, "sliding_window_type"),
        ({"sliding_window_size": 0}, "sliding_window_size"),
        ({"sliding_window_size": 2.5}, "sliding_window_size"),
        ({"sliding_window_size": True}, "sliding_window_size"),
        ({"minimum_number_of_calls": 0}, "minimum_number_of_calls"),
        ({"minimum_number_of_calls": 11}, "must not exceed"),
        ({"permitted_number_of_calls_in_half_open_state": 0}, "permitted_number_of_calls"),
        ({"failure_rate_threshold": 0.0}, "failure_rate_threshold"),
        ({"failure_rate_threshold": 100.5}, "failure_rate_threshold"),
        ({"failure_rate_threshold": float("nan")}, "failure_rate_threshold"),
        ({"slow_call_rate_threshold": -1.0}, "slow_call_rate_threshold"),
        ({"slow_call_duration_threshold_s": 0.0}, "slow_call_duration_threshold_s"),
        ({"wait_duration_in_open_state_s": 0.0}, "wait_duration_in_open_state_s"),
        ({"wait_duration_in_open_state_s": float("inf")}, "wait_duration_in_open_state_s"),
        ({"max_wait_duration_in_half_open_state_s": -1.0}, "max_wait_duration_in_half_open"),
    ],
)
def test_invalid_config_is_rejected(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_edge_values_are_accepted() -> None:
    config(failure_rate_threshold=100.0, slow_call_rate_threshold=0.001)
    config(slow_call_duration_threshold_s=float("inf"))  # slow-call detection off
    config(sliding_window_size=1, minimum_number_of_calls=1)
    config(sliding_window_type=WindowType.TIME_BASED, sliding_window_size=1)


def test_module_stays_free_of_transport_and_event_loop() -> None:
    tree = ast.parse(Path(breaker_module.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"grpc", "asyncio"}


# -- random sequences against a reference model -----------------------------------------------


class ReferenceWindow:
    """The rates computed the slow, obvious way from every outcome still in the window."""

    def __init__(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self.outcomes: deque[tuple[int, bool, bool]] = deque()  # (second, failed, slow)

    def add(self, second: int, failed: bool, slow: bool) -> None:
        self.outcomes.append((second, failed, slow))
        if self.cfg.sliding_window_type is WindowType.COUNT_BASED:
            while len(self.outcomes) > self.cfg.sliding_window_size:
                self.outcomes.popleft()

    def rates(self, second: int) -> tuple[float, float]:
        if self.cfg.sliding_window_type is WindowType.TIME_BASED:
            oldest = second - self.cfg.sliding_window_size + 1
            while self.outcomes and self.outcomes[0][0] < oldest:
                self.outcomes.popleft()
        calls = len(self.outcomes)
        if calls == 0 or calls < self.cfg.minimum_number_of_calls:
            return -1.0, -1.0
        failed = sum(1 for _, f, _ in self.outcomes if f)
        slow = sum(1 for _, _, s in self.outcomes if s)
        return failed * 100.0 / calls, slow * 100.0 / calls

    def should_open(self, second: int) -> bool:
        failure, slow = self.rates(second)
        return failure >= 0 and (
            failure >= self.cfg.failure_rate_threshold or slow >= self.cfg.slow_call_rate_threshold
        )


@pytest.mark.parametrize("window_type", list(WindowType))
@pytest.mark.parametrize("seed", range(20))
def test_random_calls_match_the_reference_model(window_type: WindowType, seed: int) -> None:
    rng = random.Random(seed)
    size = rng.randint(1, 30)
    cfg = config(
        sliding_window_type=window_type,
        sliding_window_size=size,
        minimum_number_of_calls=rng.randint(
            1, size if window_type is WindowType.COUNT_BASED else 40
        ),
        failure_rate_threshold=float(rng.choice([10, 25, 50, 75, 100])),
        slow_call_rate_threshold=float(rng.choice([10, 33, 50, 90, 100])),
    )
    clock = FakeClock(1000.0)
    breaker = CircuitBreaker("model", cfg, clock)
    model = ReferenceWindow(cfg)
    p_fail, p_slow = rng.random(), rng.random() * 0.5
    opened = 0
    for _ in range(2000):
        if window_type is WindowType.TIME_BASED:
            clock.advance(rng.choice([0.0, 0.0, 0.05, 0.3, 1.0, 2.5]))
        second = int(clock.now)
        assert breaker.try_acquire()
        failed, slow = rng.random() < p_fail, rng.random() < p_slow
        duration = SLOW if slow else FAST
        if failed:
            breaker.on_error(duration)
        else:
            breaker.on_success(duration)
        model.add(second, failed, slow)
        expected_open = model.should_open(second)
        assert (breaker.state is State.OPEN) == expected_open
        failure_rate, slow_call_rate = model.rates(second)
        assert breaker.failure_rate == pytest.approx(failure_rate)
        assert breaker.slow_call_rate == pytest.approx(slow_call_rate)
        if expected_open:
            opened += 1
            breaker.reset()
            model.outcomes.clear()
    snap = breaker.snapshot()
    assert snap.successful_calls + snap.failed_calls == 2000
    # Most seeds trip the breaker along the way, so the opening rule is exercised too.
    if p_fail >= 0.6:
        assert opened > 0


# -- sparse traffic: outcomes age out of a count window ----------------------------------------


def test_failures_of_long_ago_do_not_count_with_a_max_age() -> None:
    clock = FakeClock()
    aged, plain = make(clock, max_outcome_age_s=30.0), make(clock, max_outcome_age_s=0.0)
    for _ in range(9):
        call(aged, fail=True)
        call(plain, fail=True)
    clock.advance(60)
    call(aged)
    call(plain)
    # The plain count window still holds the nine failures of a minute ago and opens on
    # its tenth call; the aged one holds only the call of now.
    assert plain.state is State.OPEN
    assert aged.state is State.CLOSED
    assert aged.failure_rate == -1.0


def test_an_aged_window_still_opens_on_what_fails_now() -> None:
    clock = FakeClock()
    breaker = make(clock, max_outcome_age_s=30.0)
    for _ in range(10):
        call(breaker)
    clock.advance(31)  # the successes age out
    for _ in range(9):
        call(breaker, fail=True)
        clock.advance(1)
    assert breaker.state is State.CLOSED  # nine within 30 s: below the minimum of ten
    call(breaker, fail=True)
    assert breaker.state is State.OPEN
    assert breaker.failure_rate == 100.0


def test_the_count_still_bounds_an_aged_window() -> None:
    clock = FakeClock()
    breaker = make(clock, max_outcome_age_s=30.0)
    for _ in range(3):
        call(breaker, fail=True)
    for _ in range(10):
        call(breaker)
    # Ten newer calls pushed the failures out, however young they are.
    assert breaker.state is State.CLOSED
    assert breaker.failure_rate == 0.0


@pytest.mark.parametrize("age", [-1.0, float("inf"), float("nan")])
def test_a_bad_max_age_is_refused(age: float) -> None:
    with pytest.raises(ValueError, match="max_outcome_age_s"):
        config(max_outcome_age_s=age)
