"""Budget split on an injected clock."""

from __future__ import annotations

import pytest

from services.gateway.budget import Budget, BudgetPolicy

POLICY = BudgetPolicy(
    default_s=0.042, reserve_s=0.004, features_cap_s=0.012, scorer_cap_s=0.020, scorer_min_s=0.002
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_default_budget_when_client_sets_no_deadline() -> None:
    clock = FakeClock()
    budget = Budget(POLICY, None, clock)
    assert budget.total_s == pytest.approx(0.042)
    assert budget.remaining() == pytest.approx(0.042)


def test_shorter_client_deadline_wins() -> None:
    budget = Budget(POLICY, 0.020, FakeClock())
    assert budget.total_s == pytest.approx(0.020)


def test_longer_client_deadline_is_capped_at_default() -> None:
    budget = Budget(POLICY, 5.0, FakeClock())
    assert budget.total_s == pytest.approx(0.042)


def test_expired_client_deadline_gives_zero_budget() -> None:
    budget = Budget(POLICY, -0.5, FakeClock())
    assert budget.total_s == 0.0
    assert budget.features_timeout() <= 0
    assert budget.scorer_timeout() == 0.0


def test_features_slice_is_capped_then_shrinks_with_time() -> None:
    clock = FakeClock()
    budget = Budget(POLICY, None, clock)
    assert budget.features_timeout() == pytest.approx(0.012)
    clock.now += 0.030  # 12 ms left, 4 ms reserved
    assert budget.features_timeout() == pytest.approx(0.008)


def test_scorer_is_capped_while_time_is_plenty() -> None:
    clock = FakeClock()
    budget = Budget(POLICY, None, clock)
    clock.now += 0.010
    assert budget.scorer_timeout() == pytest.approx(0.020)


def test_scorer_gets_what_is_left_minus_reserve_below_the_cap() -> None:
    clock = FakeClock()
    budget = Budget(POLICY, None, clock)
    clock.now += 0.025
    assert budget.scorer_timeout() == pytest.approx(0.013)


def test_scorer_skipped_when_less_than_minimum_left() -> None:
    clock = FakeClock()
    budget = Budget(POLICY, None, clock)
    clock.now += 0.0365  # 5.5 ms left: 1.5 ms after the reserve, below the 2 ms minimum
    assert budget.scorer_timeout() == 0.0
    assert budget.elapsed() == pytest.approx(0.0365)


def test_a_suspect_scorer_gets_the_short_slice_which_still_shrinks_with_time() -> None:
    clock = FakeClock()
    policy = BudgetPolicy(scorer_suspect_cap_s=0.008)
    budget = Budget(policy, None, clock)
    assert budget.scorer_timeout(suspect=True) == pytest.approx(0.008)
    assert budget.scorer_timeout() == pytest.approx(0.020)
    clock.now += 0.032  # 10 ms left, 4 ms reserved
    assert budget.scorer_timeout(suspect=True) == pytest.approx(0.006)
