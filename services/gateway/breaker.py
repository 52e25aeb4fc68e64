"""A circuit breaker with resilience4j's semantics, as pure synchronous logic.

The failure rate and the slow-call rate are judged over a count- or time-based sliding window;
past either threshold the breaker opens, refuses calls for a wait, then lets a fixed number of
probe calls through (half-open) whose rates decide between closing and opening again.

The gateway calls it around each downstream call from one event loop. Nothing here awaits, so
every method runs to completion without interleaving and no lock is taken; the breaker is not
meant to be shared between threads.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]
TransitionHook = Callable[[str, "State", "State"], None]

log = logging.getLogger(__name__)

# A call's outcome is stored as a code: bit 0 = failed, bit 1 = slower than the threshold.
# Windows keep one count per code, so a failed call that was also slow counts for both rates.
_OK = 0
_FAILED = 1
_SLOW = 2
_SLOW_FAILED = _FAILED | _SLOW
_CODES = 4

_floor = math.floor


class State(enum.Enum):
    """Where the breaker is; the value doubles as a metric label."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    DISABLED = "disabled"
    FORCED_OPEN = "forced_open"


class WindowType(enum.Enum):
    """What the sliding window holds: the last N calls, or the calls of the last N seconds."""

    COUNT_BASED = "count_based"
    TIME_BASED = "time_based"


# Module-level aliases: an identity test against a global is the cheapest check on the hot path.
_CLOSED = State.CLOSED
_OPEN = State.OPEN
_HALF_OPEN = State.HALF_OPEN
_DISABLED = State.DISABLED
_FORCED_OPEN = State.FORCED_OPEN


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """How one breaker judges its dependency; names follow resilience4j's, durations in seconds."""

    sliding_window_type: WindowType = WindowType.COUNT_BASED
    """COUNT_BASED judges the last ``sliding_window_size`` calls, TIME_BASED the last seconds."""
    sliding_window_size: int = 50
    """Calls (COUNT_BASED) or seconds (TIME_BASED) in the window."""
    minimum_number_of_calls: int = 20
    """Calls the window must hold before either rate is judged."""
    failure_rate_threshold: float = 50.0
    """Percent of failed calls at or above which the breaker opens."""
    slow_call_rate_threshold: float = 50.0
    """Percent of slow calls (failed or not) at or above which the breaker opens."""
    slow_call_duration_threshold_s: float = 0.025
    """A call that took longer than this is slow, whatever its outcome."""
    wait_duration_in_open_state_s: float = 2.0
    """How long an open breaker refuses calls before it lets probes through."""
    permitted_number_of_calls_in_half_open_state: int = 5
    """Probe calls let through while half-open; their outcomes decide the next state."""
    max_wait_duration_in_half_open_state_s: float = 0.0
    """Longest stay in half-open before opening again; 0 waits for the probes indefinitely."""
    max_outcome_age_s: float = 30.0
    """COUNT_BASED only: an outcome older than this leaves the window even before
    ``sliding_window_size`` newer ones push it out, so that sparse traffic is judged on what
    the dependency does now, not on calls of minutes ago; 0 keeps outcomes until pushed out
    (resilience4j's count window)."""

    def __post_init__(self) -> None:
        if not isinstance(self.sliding_window_type, WindowType):
            raise ValueError(
                f"sliding_window_type must be a WindowType, got {self.sliding_window_type!r}"
            )
        _require_count("sliding_window_size", self.sliding_window_size)
        _require_count("minimum_number_of_calls", self.minimum_number_of_calls)
        _require_count(
            "permitted_number_of_calls_in_half_open_state",
            self.permitted_number_of_calls_in_half_open_state,
        )
        if (
            self.sliding_window_type is WindowType.COUNT_BASED
            and self.minimum_number_of_calls > self.sliding_window_size
        ):
            # resilience4j silently lowers the minimum to the window size; a config that can
            # never be met as written is more likely a mistake, so say so.
            raise ValueError(
                f"minimum_number_of_calls ({self.minimum_number_of_calls}) must not exceed "
                f"sliding_window_size ({self.sliding_window_size}) for a COUNT_BASED window"
            )
        _require_percent("failure_rate_threshold", self.failure_rate_threshold)
        _require_percent("slow_call_rate_threshold", self.slow_call_rate_threshold)
        # An infinite slow-call threshold is allowed: it switches slow-call detection off.
        if not self.slow_call_duration_threshold_s > 0:
            raise ValueError(
                "slow_call_duration_threshold_s must be > 0, "
                f"got {self.slow_call_duration_threshold_s!r}"
            )
        wait = self.wait_duration_in_open_state_s
        if not (wait > 0 and math.isfinite(wait)):
            raise ValueError(f"wait_duration_in_open_state_s must be finite and > 0, got {wait!r}")
        age = self.max_outcome_age_s
        if not (age >= 0 and math.isfinite(age)):
            raise ValueError(f"max_outcome_age_s must be finite and >= 0, got {age!r}")
        half_open_wait = self.max_wait_duration_in_half_open_state_s
        if not (half_open_wait >= 0 and math.isfinite(half_open_wait)):
            raise ValueError(
                "max_wait_duration_in_half_open_state_s must be finite and >= 0, "
                f"got {half_open_wait!r}"
            )


def _require_count(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be an integer >= 1, got {value!r}")


def _require_percent(field: str, value: float) -> None:
    # Written so that NaN fails too.
    if not 0 < value <= 100:
        raise ValueError(f"{field} must be in (0, 100], got {value!r}")


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """One breaker at one moment: state, window rates and counters, for admin views and metrics."""

    name: str
    state: State
    failure_rate: float
    """Percent of the window's calls that failed; -1.0 until the minimum number is in it."""
    slow_call_rate: float
    """Percent of the window's calls that were slow; -1.0 until the minimum number is in it."""
    window_calls: int
    """Outcomes in the window the rates are judged on (the probes' while half-open)."""
    window_failed_calls: int
    """Failed calls in that window."""
    window_slow_calls: int
    """Slow calls in that window, failed ones included."""
    successful_calls: int
    """Calls reported successful since the breaker was created (slow ones included)."""
    failed_calls: int
    """Calls reported failed since the breaker was created (slow ones included)."""
    slow_calls: int
    """Calls slower than the threshold since the breaker was created, failed or not."""
    not_permitted_calls: int
    """Calls refused since the breaker was created."""
    released_calls: int
    """Permitted calls given back without an outcome since the breaker was created."""


class _CountWindow:
    """The outcomes of the last ``size`` calls: a ring of codes plus running counts per code."""

    __slots__ = ("_codes", "_size", "counts")

    def __init__(self, size: int) -> None:
        # A bounded deque evicts in C; only the count of the evicted code is adjusted here.
        self._codes: deque[int] = deque(maxlen=size)
        self._size = size
        self.counts = [0] * _CODES

    @property
    def calls(self) -> int:
        """Outcomes in the window."""
        return len(self._codes)

    def record(self, code: int) -> int:
        """Adds one outcome, evicting the oldest once full; returns the outcomes in the window."""
        codes = self._codes
        counts = self.counts
        if len(codes) == self._size:
            counts[codes[0]] -= 1
        codes.append(code)
        counts[code] += 1
        return len(codes)

    def refresh(self) -> None:
        """Nothing ages out of a count window."""


class _AgedCountWindow:
    """The outcomes of the last ``size`` calls that are at most ``max_age_s`` old: a count
    window whose outcomes also leave it with age."""

    __slots__ = ("_clock", "_entries", "_max_age_s", "_size", "counts")

    def __init__(self, size: int, max_age_s: float, clock: Clock) -> None:
        # (time recorded, code), oldest first; the ring is bounded by size as the plain one.
        self._entries: deque[tuple[float, int]] = deque()
        self._size = size
        self._max_age_s = max_age_s
        self._clock = clock
        self.counts = [0] * _CODES

    @property
    def calls(self) -> int:
        """Outcomes in the window."""
        return len(self._entries)

    def record(self, code: int) -> int:
        """Adds one outcome, evicting the oldest once full and every one aged out; returns
        the outcomes in the window."""
        now = self._clock()
        entries = self._entries
        counts = self.counts
        if len(entries) == self._size:
            counts[entries.popleft()[1]] -= 1
        entries.append((now, code))
        counts[code] += 1
        self._expire(now)
        return len(entries)

    def refresh(self) -> None:
        """Drops the outcomes that have aged out, so the counts describe the window now."""
        self._expire(self._clock())

    def _expire(self, now: float) -> None:
        entries = self._entries
        oldest = now - self._max_age_s
        while entries and entries[0][0] < oldest:
            self.counts[entries.popleft()[1]] -= 1


class _TimeWindow:
    """The outcomes of the last ``seconds`` seconds, in one bucket of counts per second.

    Like resilience4j's, the window is the current second plus the ``seconds - 1`` before it,
    so memory is O(seconds) whatever the call rate, and an outcome is forgotten between
    ``seconds - 1`` and ``seconds`` after it was recorded.
    """

    __slots__ = ("_buckets", "_clock", "_head", "_head_second", "_size", "calls", "counts")

    def __init__(self, seconds: int, clock: Clock) -> None:
        self._size = seconds
        self._clock = clock
        # Flat: the counts of bucket i are _buckets[i * _CODES : (i + 1) * _CODES].
        self._buckets = [0] * (seconds * _CODES)
        self._head = 0
        self._head_second = _floor(clock())
        self.calls = 0
        self.counts = [0] * _CODES

    def record(self, code: int) -> int:
        """Adds one outcome to the current second's bucket; returns the outcomes in the window."""
        second = _floor(self._clock())
        if second > self._head_second:
            self._advance(second)
        self._buckets[self._head * _CODES + code] += 1
        self.counts[code] += 1
        self.calls += 1
        return self.calls

    def refresh(self) -> None:
        """Drops the buckets that have aged out, so the counts describe the window now."""
        second = _floor(self._clock())
        if second > self._head_second:
            self._advance(second)

    def _advance(self, second: int) -> None:
        # At most one pass over the ring however long the window sat idle. A clock that steps
        # back never gets here: its outcomes go to the newest bucket, which is the best guess.
        buckets = self._buckets
        counts = self.counts
        head = self._head
        for _ in range(min(second - self._head_second, self._size)):
            head = head + 1 if head + 1 < self._size else 0
            base = head * _CODES
            for code in range(_CODES):
                stale = buckets[base + code]
                if stale:
                    counts[code] -= stale
                    self.calls -= stale
                    buckets[base + code] = 0
        self._head = head
        self._head_second = second


class CircuitBreaker:
    """Guards one dependency: ask ``try_acquire`` before a call, then report how it went.

    Every permitted call must end in exactly one of ``on_success``, ``on_error`` or ``release``
    (for a call abandoned without an outcome, e.g. cancelled), or a half-open breaker keeps
    waiting for the probe that never reports.
    """

    __slots__ = (
        "_clock",
        "_config",
        "_failed_calls",
        "_failure_threshold",
        "_half_open_deadline",
        "_minimum",
        "_not_permitted_calls",
        "_on_transition",
        "_open_until",
        "_probes_free",
        "_probes_out",
        "_released_calls",
        "_slow_calls",
        "_slow_s",
        "_slow_threshold",
        "_state",
        "_successful_calls",
        "_window",
        "name",
    )

    def __init__(
        self,
        name: str,
        config: BreakerConfig,
        clock: Clock = time.monotonic,
        on_transition: TransitionHook | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._clock = clock
        self._on_transition = on_transition
        # Copies of hot config values: one attribute load instead of two on every call.
        self._slow_s = config.slow_call_duration_threshold_s
        self._failure_threshold = config.failure_rate_threshold
        self._slow_threshold = config.slow_call_rate_threshold
        self._state = _CLOSED
        self._window: _CountWindow | _AgedCountWindow | _TimeWindow = self._closed_window()
        self._minimum = config.minimum_number_of_calls
        self._open_until = 0.0
        self._half_open_deadline: float | None = None
        self._probes_free = 0
        self._probes_out = 0
        self._successful_calls = 0
        self._failed_calls = 0
        self._slow_calls = 0
        self._not_permitted_calls = 0
        self._released_calls = 0

    # -- the request path ----------------------------------------------------------------------

    def try_acquire(self) -> bool:
        """Whether one call may go to the dependency now; a refusal is counted."""
        state = self._state
        if state is _CLOSED:
            return True
        return self._try_acquire_not_closed(state)

    def on_success(self, duration_s: float) -> None:
        """Reports that a permitted call succeeded after ``duration_s`` seconds."""
        self._successful_calls += 1
        if duration_s > self._slow_s:
            self._slow_calls += 1
            self._record(_SLOW)
        else:
            self._record(_OK)

    def on_error(self, duration_s: float) -> None:
        """Reports that a permitted call failed after ``duration_s`` seconds."""
        self._failed_calls += 1
        if duration_s > self._slow_s:
            self._slow_calls += 1
            self._record(_SLOW_FAILED)
        else:
            self._record(_FAILED)

    def release(self) -> None:
        """Gives back the permission of a call that ends without an outcome (cancelled, ignored)."""
        self._released_calls += 1
        # Only a probe holds a permit worth returning; the guard keeps a call permitted before the
        # breaker opened from adding a permit beyond the configured number.
        if self._state is _HALF_OPEN and self._probes_out > 0:
            self._probes_out -= 1
            self._probes_free += 1

    def _try_acquire_not_closed(self, state: State) -> bool:
        if state is _OPEN:
            now = self._clock()
            # Strictly after the wait, as resilience4j does.
            if now <= self._open_until:
                self._not_permitted_calls += 1
                return False
            self._transition(_HALF_OPEN, now)
        elif state is _HALF_OPEN:
            deadline = self._half_open_deadline
            if deadline is not None:
                now = self._clock()
                if now > deadline:
                    self._transition(_OPEN, now)
                    self._not_permitted_calls += 1
                    return False
        elif state is _DISABLED:
            return True
        else:
            self._not_permitted_calls += 1
            return False
        if self._probes_free > 0:
            self._probes_free -= 1
            self._probes_out += 1
            return True
        self._not_permitted_calls += 1
        return False

    def _record(self, code: int) -> None:
        window = self._window
        if self._state is _CLOSED:
            calls = window.record(code)
            # A window holding only fast successes, the usual case, has nothing to judge.
            if (
                calls >= self._minimum
                and window.counts[_OK] != calls
                and self._exceeded(window.counts, calls)
            ):
                self._transition(_OPEN, self._clock())
        else:
            self._record_not_closed(window, code)

    def _record_not_closed(
        self, window: _CountWindow | _AgedCountWindow | _TimeWindow, code: int
    ) -> None:
        state = self._state
        if state is _HALF_OPEN:
            # With no probe out, this outcome belongs to a call permitted before the breaker
            # opened: counting it would let it stand in for a probe.
            if self._probes_out == 0:
                return
            self._probes_out -= 1
            calls = window.record(code)
            if calls >= self._minimum:
                to = _OPEN if self._exceeded(window.counts, calls) else _CLOSED
                self._transition(to, self._clock())
        elif state is _OPEN:
            # A call permitted before the breaker opened: it shows in the window, as in
            # resilience4j, but an open breaker judges nothing.
            window.record(code)
        # DISABLED and FORCED_OPEN keep no window.

    def _exceeded(self, counts: list[int], calls: int) -> bool:
        # Same arithmetic and ">=" as resilience4j, so a rate exactly at the threshold opens,
        # and the rates in a snapshot agree with the decision.
        failures = counts[_FAILED] + counts[_SLOW_FAILED]
        slow = counts[_SLOW] + counts[_SLOW_FAILED]
        return (
            failures * 100.0 / calls >= self._failure_threshold
            or slow * 100.0 / calls >= self._slow_threshold
        )

    # -- transitions ---------------------------------------------------------------------------

    def _closed_window(self) -> _CountWindow | _AgedCountWindow | _TimeWindow:
        config = self._config
        if config.sliding_window_type is WindowType.TIME_BASED:
            return _TimeWindow(config.sliding_window_size, self._clock)
        if config.max_outcome_age_s > 0:
            return _AgedCountWindow(
                config.sliding_window_size, config.max_outcome_age_s, self._clock
            )
        return _CountWindow(config.sliding_window_size)

    def _transition(self, to: State, now: float) -> None:
        before = self._state
        failure_rate, slow_call_rate = self._rates()
        config = self._config
        if to is _OPEN:
            # The window that tripped stays, so the admin view shows why the breaker is open.
            self._open_until = now + config.wait_duration_in_open_state_s
        elif to is _HALF_OPEN:
            permits = config.permitted_number_of_calls_in_half_open_state
            self._window = _CountWindow(permits)
            self._minimum = permits
            self._probes_free = permits
            self._probes_out = 0
            max_wait = config.max_wait_duration_in_half_open_state_s
            self._half_open_deadline = now + max_wait if max_wait > 0 else None
        else:
            self._window = self._closed_window()
            self._minimum = config.minimum_number_of_calls
        self._state = to
        level = logging.WARNING if to is _OPEN or to is _FORCED_OPEN else logging.INFO
        log.log(
            level,
            "circuit breaker %s: %s -> %s",
            self.name,
            before.value,
            to.value,
            extra={
                "breaker": self.name,
                "from_state": before.value,
                "to_state": to.value,
                "failure_rate": failure_rate,
                "slow_call_rate": slow_call_rate,
            },
        )
        hook = self._on_transition
        if hook is not None:
            try:
                hook(self.name, before, to)
            except Exception:
                # A broken metrics hook must not fail the request that happened to trip the
                # breaker; the state has already changed consistently.
                log.exception(
                    "circuit breaker transition hook failed", extra={"breaker": self.name}
                )

    # -- manual control ------------------------------------------------------------------------

    def force_open(self) -> None:
        """Refuses every call until ``reset`` or ``disable`` (an operator's kill switch)."""
        if self._state is not _FORCED_OPEN:
            self._transition(_FORCED_OPEN, self._clock())

    def disable(self) -> None:
        """Permits every call and judges nothing until ``reset`` or ``force_open``."""
        if self._state is not _DISABLED:
            self._transition(_DISABLED, self._clock())

    def reset(self) -> None:
        """Back to CLOSED with an empty window; the cumulative counters are kept."""
        if self._state is _CLOSED:
            self._window = self._closed_window()
        else:
            self._transition(_CLOSED, self._clock())

    # -- read-only views -----------------------------------------------------------------------

    def _rates(self) -> tuple[float, float]:
        window = self._window
        window.refresh()
        calls = window.calls
        if calls == 0 or calls < self._minimum:
            return -1.0, -1.0
        counts = window.counts
        return (
            (counts[_FAILED] + counts[_SLOW_FAILED]) * 100.0 / calls,
            (counts[_SLOW] + counts[_SLOW_FAILED]) * 100.0 / calls,
        )

    @property
    def config(self) -> BreakerConfig:
        """The configuration the breaker was built with."""
        return self._config

    @property
    def state(self) -> State:
        """The current state; OPEN turns HALF_OPEN only when a call asks after the wait."""
        return self._state

    @property
    def failure_rate(self) -> float:
        """Percent of the window's calls that failed; -1.0 below the minimum number of calls."""
        return self._rates()[0]

    @property
    def slow_call_rate(self) -> float:
        """Percent of the window's calls that were slow; -1.0 below the minimum number of calls."""
        return self._rates()[1]

    @property
    def successful_calls(self) -> int:
        """Calls reported successful since the breaker was created."""
        return self._successful_calls

    @property
    def failed_calls(self) -> int:
        """Calls reported failed since the breaker was created."""
        return self._failed_calls

    @property
    def slow_calls(self) -> int:
        """Calls slower than the threshold since the breaker was created, failed or not."""
        return self._slow_calls

    @property
    def not_permitted_calls(self) -> int:
        """Calls refused since the breaker was created."""
        return self._not_permitted_calls

    def snapshot(self) -> BreakerSnapshot:
        """State, window rates and counters at this moment."""
        failure_rate, slow_call_rate = self._rates()
        window = self._window
        counts = window.counts
        return BreakerSnapshot(
            name=self.name,
            state=self._state,
            failure_rate=failure_rate,
            slow_call_rate=slow_call_rate,
            window_calls=window.calls,
            window_failed_calls=counts[_FAILED] + counts[_SLOW_FAILED],
            window_slow_calls=counts[_SLOW] + counts[_SLOW_FAILED],
            successful_calls=self._successful_calls,
            failed_calls=self._failed_calls,
            slow_calls=self._slow_calls,
            not_permitted_calls=self._not_permitted_calls,
            released_calls=self._released_calls,
        )
